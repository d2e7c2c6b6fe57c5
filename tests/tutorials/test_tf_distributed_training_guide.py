"""TensorFlow's guide "Distributed training with TensorFlow" (tensorflow/docs,
site/en/guide/distributed_training.ipynb), ported with renames only: tf.distribute.*Strategy
-> phalanx.Strategy, tf.data -> phalanx.data, tf.keras -> Keras 3 in phalanx.Model,
tf.function -> phalanx.function, tf.nn.compute_average_loss ->
phalanx.compute_average_loss. Its code cells run in order; the asserts are ours.

Lines that still differ from the original beyond those renames, and why:
1. `MirroredStrategy(devices=["/gpu:0", "/gpu:1"])` names "/cpu:0", "/cpu:1": the test
   machine has no GPU (the GPU strings resolve the same way, see
   tests/strategy/test_devices_strings.py).
2. `cross_device_ops=tf.distribute.HierarchicalCopyAllReduce()` ->
   `phalanx.HierarchicalCopyAllReduce()` and `MultiWorkerMirroredStrategy(
   communication_options=tf.distribute.experimental.CommunicationOptions(...NCCL))` ->
   `phalanx.Strategy(communication_options=phalanx.experimental.CommunicationOptions(...))`:
   accepted and kept; XLA picks the collective.
3. `CentralStorageStrategy()` has no phalanx counterpart: state is replicated, not on the
   CPU. That cell is left out; so are the Estimator and TF_CONFIG cells.
4. `tf.config.list_physical_devices('gpu')` -> `jax.devices("cpu")[0].platform == "gpu"`:
   JAX lists devices by platform; `print(tf.Variable(1.))` -> `print(jnp.asarray(1.))`:
   JAX has no variables outside a model.
5. `tf.keras.layers.Dense(1, input_shape=(1,))` -> `keras.Input((1,))` then `Dense(1)`:
   Keras 3 warns about `input_shape` on a layer (an error under the suite's warning
   filter).
6. In the Keras cell, `MirroredStrategy()` takes all devices: 8 fake ones here, so the
   guide's `LEARNING_RATES_BY_BATCH_SIZE[global_batch_size]` (written for 1 or 2 GPUs)
   would miss; the cell names two devices, "/cpu:0" and "/cpu:1", as a 2-GPU machine.
7. The custom loop's model is a Flax NNX `nnx.Linear(1, 1)` and its optimizer an
   `nnx.Optimizer` (SGD, Keras's default rate 0.01): Keras 3 on JAX has no
   `tf.GradientTape`, so `tape.gradient(loss, model.trainable_variables)` is
   `nnx.value_and_grad`, and `optimizer.apply_gradients(zip(gradients,
   model.trainable_variables))` is `optimizer.update(model, gradients)`.
8. (none: `tf.keras.losses.Reduction.NONE` is `phalanx.losses.Reduction.NONE`.)
9. `print(...)` of the losses is kept; the test also collects them to assert.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")  # before keras's first import, as tests/keras does

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest
from flax import nnx

import phalanx


def _softplus(x):
    return np.logaddexp(0.0, x)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def test_distributed_training_guide():
    # --- Types of strategies ------------------------------------------------------------
    mirrored_strategy = phalanx.Strategy()
    assert mirrored_strategy.num_replicas_in_sync == jax.device_count()

    mirrored_strategy = phalanx.Strategy(devices=["/cpu:0", "/cpu:1"])  # TF: "/gpu:0", "/gpu:1"
    assert mirrored_strategy.num_replicas_in_sync == 2

    mirrored_strategy = phalanx.Strategy(cross_device_ops=phalanx.HierarchicalCopyAllReduce())
    assert isinstance(mirrored_strategy.cross_device_ops, phalanx.HierarchicalCopyAllReduce)

    communication_options = phalanx.experimental.CommunicationOptions(
        implementation=phalanx.experimental.CommunicationImplementation.NCCL
    )
    strategy = phalanx.Strategy(  # TF: tf.distribute.MultiWorkerMirroredStrategy(...)
        communication_options=communication_options
    )
    assert strategy.communication_options.implementation.name == "NCCL"

    # Default strategy
    default_strategy = phalanx.get_strategy()
    assert default_strategy.num_replicas_in_sync == 1

    # In optimizer or other library code
    # Get currently active strategy
    strategy = phalanx.get_strategy()
    assert float(strategy.reduce("SUM", 1.0, axis=None)) == 1.0  # reduce some values

    if jax.devices("cpu")[0].platform == "gpu":  # TF: tf.config.list_physical_devices('gpu')
        strategy = phalanx.Strategy()
    else:  # use default strategy
        strategy = phalanx.get_strategy()

    with strategy.scope():
        # do something interesting
        print(jnp.asarray(1.0))  # TF: print(tf.Variable(1.))

    # --- Using tf.distribute.Strategy with tf.keras.Model.fit ---------------------------
    mirrored_strategy = phalanx.Strategy(devices=["/cpu:0", "/cpu:1"])  # TF: all GPUs (2)

    with mirrored_strategy.scope():
        model = phalanx.Model(keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]))

    model.compile(loss="mse", optimizer="sgd")

    dataset = phalanx.data.Dataset.from_tensors(([1.0], [1.0])).repeat(100).batch(10)
    history = model.fit(dataset, epochs=2)
    mse = model.evaluate(dataset)
    # y = w * 1 + b trained toward 1 by SGD: the loss falls and evaluate sees all 100.
    losses = history.history["loss"]
    assert losses[1] < losses[0]
    kernel, bias = model.get_weights()
    np.testing.assert_allclose(mse, (float(kernel[0, 0] + bias[0]) - 1.0) ** 2, rtol=1e-5)

    inputs, targets = np.ones((100, 1)), np.ones((100, 1))
    model.fit(inputs, targets, epochs=2, batch_size=10)

    # Compute global batch size using number of replicas.
    BATCH_SIZE_PER_REPLICA = 5
    global_batch_size = BATCH_SIZE_PER_REPLICA * mirrored_strategy.num_replicas_in_sync
    dataset = phalanx.data.Dataset.from_tensors(([1.0], [1.0])).repeat(100)
    dataset = dataset.batch(global_batch_size)

    LEARNING_RATES_BY_BATCH_SIZE = {5: 0.1, 10: 0.15}
    learning_rate = LEARNING_RATES_BY_BATCH_SIZE[global_batch_size]
    assert learning_rate == 0.15

    # --- Using tf.distribute.Strategy with custom training loops ------------------------
    with mirrored_strategy.scope():
        model = nnx.Linear(1, 1, rngs=nnx.Rngs(0))  # TF: tf.keras.Sequential([Dense(1)])
        optimizer = nnx.Optimizer(model, phalanx.optimizers.get("sgd"), wrt=nnx.Param)

    dataset = phalanx.data.Dataset.from_tensors(([1.0], [1.0])).repeat(100).batch(global_batch_size)
    dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)

    loss_object = phalanx.losses.BinaryCrossentropy(
        from_logits=True, reduction=phalanx.losses.Reduction.NONE
    )

    def compute_loss(labels, predictions):
        per_example_loss = loss_object(labels, predictions)
        return phalanx.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)

    per_replica_rows = []

    def train_step(inputs):
        features, labels = inputs
        per_replica_rows.append(features.shape[0])  # ours: the replica's batch, at tracing

        def loss_fn(model):  # TF: with tf.GradientTape() as tape:
            predictions = model(features)
            return compute_loss(labels, predictions)

        loss, gradients = nnx.value_and_grad(loss_fn)(model)  # TF: tape.gradient(...)
        optimizer.update(model, gradients)  # TF: apply_gradients(zip(gradients, ...))
        return loss

    @phalanx.function
    def distributed_train_step(dist_inputs):
        per_replica_losses = mirrored_strategy.run(train_step, args=(dist_inputs,))
        return mirrored_strategy.reduce(phalanx.ReduceOp.SUM, per_replica_losses, axis=None)

    w0, b0 = float(model.kernel[...][0, 0]), float(model.bias[...][0])
    printed = []
    for dist_inputs in dist_dataset:
        printed.append(float(distributed_train_step(dist_inputs)))
        print(printed[-1])

    iterator = iter(dist_dataset)
    for _ in range(10):
        printed.append(float(distributed_train_step(next(iterator))))
        print(printed[-1])

    # The global-batch loss is one device's: logits w + b against label 1, and SGD (rate
    # 0.01) on the mean over the global batch moves w and b by 0.01 * sigmoid(-(w + b)).
    assert set(per_replica_rows) == {BATCH_SIZE_PER_REPLICA}  # 10 rows split 5 + 5
    expected, w, b = [], w0, b0
    for _ in range(100 // global_batch_size + 10):
        expected.append(_softplus(-(w + b)))
        step = 0.01 * _sigmoid(-(w + b))
        w, b = w + step, b + step
    np.testing.assert_allclose(printed, expected, rtol=2e-5)
    np.testing.assert_allclose(float(model.kernel[...][0, 0]), w, rtol=2e-5)


def test_distributed_training_guide_custom_loop_with_keras_objects():
    """The guide's custom-loop cells in their Keras form: the step closes over a plain Keras
    model (with the guide's `kernel_regularizer=L2(1e-4)`) and `keras.optimizers.SGD()`,
    `tf.GradientTape` becomes `stateless_call` under `jax.value_and_grad`, and
    `model.losses` is read inside the differentiated function, as inside TF's tape. The
    first step's kernel includes the regularizer's gradient, 0.01 x 2e-4 x w0."""
    mirrored_strategy = phalanx.Strategy()
    global_batch_size = 2 * mirrored_strategy.num_replicas_in_sync

    with mirrored_strategy.scope():
        model = keras.Sequential(  # TF: Dense(1, input_shape=(1,), kernel_regularizer=...)
            [
                keras.Input((1,)),
                keras.layers.Dense(1, kernel_regularizer=keras.regularizers.L2(1e-4)),
            ]
        )
        optimizer = keras.optimizers.SGD()

    dataset = phalanx.data.Dataset.from_tensors(([1.0], [1.0])).repeat(100).batch(global_batch_size)
    dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)

    loss_object = phalanx.losses.BinaryCrossentropy(
        from_logits=True, reduction=phalanx.losses.Reduction.NONE
    )

    def compute_loss(labels, predictions):
        per_example_loss = loss_object(labels, predictions)
        loss = phalanx.compute_average_loss(per_example_loss)
        model_losses = model.losses
        if model_losses:
            loss += phalanx.scale_regularization_loss(sum(model_losses))  # TF: tf.add_n
        return loss

    def train_step(inputs):
        features, labels = inputs

        def loss_fn(trainable):  # TF: with tf.GradientTape() as tape:
            predictions, _ = model.stateless_call(trainable, [], features, training=True)
            return compute_loss(labels, predictions)

        trainable = [v.value for v in model.trainable_variables]
        loss, gradients = jax.value_and_grad(loss_fn)(trainable)  # TF: tape.gradient(...)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    @phalanx.function
    def distributed_train_step(dist_inputs):
        per_replica_losses = mirrored_strategy.run(train_step, args=(dist_inputs,))
        return mirrored_strategy.reduce(phalanx.ReduceOp.SUM, per_replica_losses, axis=None)

    (w0,), (b0,) = (np.asarray(v, np.float64).ravel() for v in model.get_weights())
    losses = []
    for dist_inputs in dist_dataset:
        losses.append(float(distributed_train_step(dist_inputs)))
        if len(losses) == 1:
            (w1,), (b1,) = (np.asarray(v, np.float64).ravel() for v in model.get_weights())

    # One SGD step (rate 0.01) on the mean BCE of logit w + b against 1, plus 1e-4 * w**2.
    assert losses[0] == pytest.approx(_softplus(-(w0 + b0)) + 1e-4 * w0**2, rel=1e-6)
    data_gradient = -_sigmoid(-(w0 + b0))
    want_w1 = w0 - 0.01 * (data_gradient + 2e-4 * w0)
    np.testing.assert_allclose(w1, want_w1, rtol=0, atol=2e-7)
    np.testing.assert_allclose(b1, b0 - 0.01 * data_gradient, rtol=0, atol=2e-7)
    assert abs(w1 - (w0 - 0.01 * data_gradient)) > 5e-7  # the regularizer's share is there
    assert len(losses) == -(-100 // global_batch_size) and losses[-1] < losses[0]
