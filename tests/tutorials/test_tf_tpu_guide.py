"""TensorFlow's guide "Use TPUs" (tensorflow/docs, site/en/guide/tpu.ipynb), ported with
renames only: tf.distribute.TPUStrategy -> phalanx.Strategy, tf.data -> phalanx.data,
tf.keras -> Keras 3 in phalanx.Model, tf.function -> phalanx.function,
tf.nn.compute_average_loss -> phalanx.compute_average_loss, tf.matmul -> jax.numpy.matmul.
Its code cells run in order on the suite's 8 fake devices; the asserts are ours.

Lines that still differ from the original beyond those renames, and why:
1. `TPUClusterResolver(tpu=...)`, `experimental_connect_to_cluster`,
   `initialize_tpu_system` -> `phalanx.cluster.resolve()`: JAX finds and starts the TPU
   (or here the CPU) itself; `tf.config.list_logical_devices('TPU')` -> `jax.devices()`.
2. `with tf.device('/TPU:0'): c = tf.matmul(a, b)` -> `with jax.default_device(...)`;
   `c.device` -> `c.devices()`; `tf.constant` -> `jnp.array`.
3. `TPUStrategy(resolver)` -> `phalanx.Strategy()`: the strategy takes the resolved devices.
4. `tfds.load(name='mnist', ...)` -> `phalanx.datasets.mnist.load_data(path=mnist_path)`
   (no download), as 400 training and 250 test images with a channel axis: TFDS gives
   (28, 28, 1) images; the test set keeps a partial last batch of 50.
5. `tf.cast(image, tf.float32)` -> `image.astype(np.float32)`: `map` runs on the host.
6. The model is narrower (Conv2D 4 filters instead of 256, Dense 32 and 16 instead of 256
   and 128) and `input_shape=` becomes `keras.Input((28, 28, 1))` (Keras 3 warns about
   `input_shape` on a layer): the suite's time budget on CPU.
7. `steps_per_epoch = 60000 // batch_size` -> `400 // batch_size`, `steps_per_eval =
   10000 // batch_size` -> `250 // ...`, and 5 epochs -> 1 (fit and the custom loop): the
   smaller data, and the suite's time budget.
8. The custom loop's model is the same network in Flax NNX, its optimizer
   `nnx.Optimizer(model, phalanx.optimizers.get("adam"))`: Keras 3 on JAX has no
   `tf.GradientTape`; `tape.gradient(...)` -> `nnx.value_and_grad`,
   `optimizer.apply_gradients(list(zip(grads, ...)))` -> `optimizer.update(model, grads)`,
   `optimizer.iterations.numpy()` -> `int(optimizer.step[...])`.
9. `tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)` ->
   `phalanx.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)`.
10. `strategy.experimental_distribute_datasets_from_function` -> its current TF name,
    `distribute_datasets_from_function` (TF 2.4 dropped the experimental_ alias).
11. `for _ in tf.range(steps)` -> `range(steps)` and `tf.convert_to_tensor(steps_per_epoch)`
    -> the int: phalanx.function compiles per value of a Python int, as tf.function retraces.
12. The custom-loop cells run inside `custom_loop(strategy)`, called on 8 replicas and on
    one device, with `shuffle(10000, seed=0)`, so the test can compare the two runs' numbers.
13. The values of the custom loop's two `print("Current step: ...".format(...))` lines are
    first collected in `printed` (one tuple per line), for the asserts.
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

N_TRAIN, N_TEST = 400, 250


def _mnist(mnist_path):
    (x_train, y_train), (x_test, y_test) = phalanx.datasets.mnist.load_data(path=mnist_path)
    return {
        "train": (x_train[:N_TRAIN, :, :, None], y_train[:N_TRAIN].astype(np.int32)),
        "test": (x_test[:N_TEST, :, :, None], y_test[:N_TEST].astype(np.int32)),
    }


def create_model():
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


class CNN(nnx.Module):  # create_model() in Flax NNX, for the custom loop (difference 8)
    def __init__(self, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 4, (3, 3), padding="VALID", rngs=rngs)
        self.conv2 = nnx.Conv(4, 4, (3, 3), padding="VALID", rngs=rngs)
        self.dense1 = nnx.Linear(24 * 24 * 4, 32, rngs=rngs)
        self.dense2 = nnx.Linear(32, 16, rngs=rngs)
        self.dense3 = nnx.Linear(16, 10, rngs=rngs)

    def __call__(self, x):
        x = jax.nn.relu(self.conv2(jax.nn.relu(self.conv1(x))))
        x = x.reshape(x.shape[0], -1)
        return self.dense3(jax.nn.relu(self.dense2(jax.nn.relu(self.dense1(x)))))


def _get_dataset_fn(data, seed=None):
    def get_dataset(batch_size, is_training=True):
        split = "train" if is_training else "test"
        dataset = phalanx.data.Dataset.from_tensor_slices(data[split])

        def scale(image, label):
            image = image.astype(np.float32)
            image /= 255.0

            return image, label

        dataset = dataset.map(scale)

        # Only shuffle and repeat the dataset in training. The advantage to have a
        # infinite dataset for training is to avoid the potential last partial batch
        # in each epoch, so users don't need to think about scaling the gradients
        # based on the actual batch size.
        if is_training:
            dataset = dataset.shuffle(10000, seed=seed)
            dataset = dataset.repeat()

        dataset = dataset.batch(batch_size)

        return dataset

    return get_dataset


def test_tpu_guide_placement_and_fit(mnist_path):
    data = _mnist(mnist_path)
    get_dataset = _get_dataset_fn(data)

    resolver = phalanx.cluster.resolve()
    print("All devices: ", jax.devices())

    # Manual device placement
    a = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    with jax.default_device(jax.devices()[0]):
        c = jnp.matmul(a, b)
    print("c device: ", c.devices())
    print(c)
    np.testing.assert_array_equal(c, [[22.0, 28.0], [49.0, 64.0]])

    strategy = phalanx.Strategy()
    assert strategy.num_replicas_in_sync == resolver.global_device_count

    @phalanx.function
    def matmul_fn(x, y):
        z = jnp.matmul(x, y)
        return z

    z = strategy.run(matmul_fn, args=(a, b))
    print(z)
    replicas = strategy.experimental_local_results(z)
    assert len(replicas) == strategy.num_replicas_in_sync
    for value in replicas:  # every core got the same (a, b)
        np.testing.assert_array_equal(value, c)

    # Train a model using Keras high level APIs
    with strategy.scope():
        model = phalanx.Model(create_model())
        model.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["sparse_categorical_accuracy"],
        )

    batch_size = 200
    steps_per_epoch = N_TRAIN // batch_size

    train_dataset = get_dataset(batch_size, is_training=True)
    test_dataset = get_dataset(batch_size, is_training=False)

    history = model.fit(
        train_dataset, epochs=1, steps_per_epoch=steps_per_epoch, validation_data=test_dataset
    )

    # The test set ends in a partial batch (250 = 200 + 50): every image counts once.
    x_test, y_test = data["test"]
    logits = np.asarray(model.module(x_test.astype(np.float32) / 255.0))
    accuracy = float(np.mean(logits.argmax(-1) == y_test))
    np.testing.assert_allclose(
        history.history["val_sparse_categorical_accuracy"][-1], accuracy, atol=1e-6
    )


def custom_loop(strategy, get_dataset, batch_size, steps_per_epoch):
    """The guide's custom-loop cells (difference 12); returns what they print."""
    printed = []
    # Create the model, optimizer and metrics inside strategy scope, so that the
    # variables can be mirrored on each device.
    with strategy.scope():
        model = CNN(nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, phalanx.optimizers.get("adam"), wrt=nnx.Param)
        training_loss = phalanx.metrics.Mean("training_loss", dtype=jnp.float32)
        training_accuracy = phalanx.metrics.SparseCategoricalAccuracy(
            "training_accuracy", dtype=jnp.float32
        )

    # Calculate per replica batch size, and distribute the datasets on each TPU
    # worker.
    per_replica_batch_size = batch_size // strategy.num_replicas_in_sync

    train_dataset = strategy.distribute_datasets_from_function(
        lambda _: get_dataset(per_replica_batch_size, is_training=True)
    )
    rows = []

    @phalanx.function
    def train_step(iterator):
        """The step function for one training step"""

        def step_fn(inputs):
            """The computation to run on each TPU device."""
            images, labels = inputs
            rows.append(images.shape[0])  # ours: the replica's batch, at tracing

            def loss_fn(model):  # TF: with tf.GradientTape() as tape:
                logits = model(images)
                loss = phalanx.losses.SparseCategoricalCrossentropy(from_logits=True)(
                    labels, logits
                )
                loss = phalanx.compute_average_loss(loss, global_batch_size=batch_size)
                return loss, logits

            (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
            optimizer.update(model, grads)
            training_loss.update_state(loss * strategy.num_replicas_in_sync)
            training_accuracy.update_state(labels, logits)

        strategy.run(step_fn, args=(next(iterator),))

    steps_per_eval = N_TEST // batch_size  # noqa: F841 -- the guide's line (unused there too)

    train_iterator = iter(train_dataset)
    for epoch in range(1):
        print("Epoch: {}/5".format(epoch))  # noqa: UP032 -- the guide's line

        for step in range(steps_per_epoch):  # noqa: B007 -- the guide's line
            train_step(train_iterator)
        printed.append(
            (
                int(optimizer.step[...]),
                round(float(training_loss.result()), 4),
                round(float(training_accuracy.result()) * 100, 2),
            )
        )
        print("Current step: {}, training loss: {}, accuracy: {}%".format(*printed[-1]))
        training_loss.reset_states()
        training_accuracy.reset_states()

    @phalanx.function
    def train_multiple_steps(iterator, steps):
        """The step function for one training step"""

        def step_fn(inputs):
            """The computation to run on each TPU device."""
            images, labels = inputs

            def loss_fn(model):  # TF: with tf.GradientTape() as tape:
                logits = model(images)
                loss = phalanx.losses.SparseCategoricalCrossentropy(from_logits=True)(
                    labels, logits
                )
                loss = phalanx.compute_average_loss(loss, global_batch_size=batch_size)
                return loss, logits

            (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
            optimizer.update(model, grads)
            training_loss.update_state(loss * strategy.num_replicas_in_sync)
            training_accuracy.update_state(labels, logits)

        for _ in range(steps):
            strategy.run(step_fn, args=(next(iterator),))

    # Convert `steps_per_epoch` to `tf.Tensor` so the `tf.function` won't get
    # retraced if the value changes.
    train_multiple_steps(train_iterator, steps_per_epoch)

    printed.append(
        (
            int(optimizer.step[...]),
            round(float(training_loss.result()), 4),
            round(float(training_accuracy.result()) * 100, 2),
        )
    )
    print("Current step: {}, training loss: {}, accuracy: {}%".format(*printed[-1]))
    return printed, set(rows), model


def test_tpu_guide_custom_loop_on_8_replicas_equals_one_device(mnist_path):
    get_dataset = _get_dataset_fn(_mnist(mnist_path), seed=0)
    batch_size = 200
    steps_per_epoch = N_TRAIN // batch_size
    strategy = phalanx.Strategy()
    printed, rows, model = custom_loop(strategy, get_dataset, batch_size, steps_per_epoch)
    assert rows == {batch_size // strategy.num_replicas_in_sync}  # 25 rows per replica
    assert [p[0] for p in printed] == [2, 4]  # optimizer steps, as iterations
    assert printed[-1][2] > printed[0][2]  # accuracy grows

    one = phalanx.Strategy(devices=jax.devices()[:1])
    printed_one, rows_one, model_one = custom_loop(one, get_dataset, batch_size, steps_per_epoch)
    assert rows_one == {batch_size}
    # The global-batch loss and accuracy are one device's, epoch by epoch.
    for (s8, loss8, acc8), (s1, loss1, acc1) in zip(printed, printed_one, strict=True):
        assert s8 == s1 and acc8 == acc1
        np.testing.assert_allclose(loss8, loss1, atol=2e-4)
    np.testing.assert_allclose(
        model.dense3.kernel[...], model_one.dense3.kernel[...], rtol=1e-3, atol=1e-5
    )


def _adam_first_step(w, g, rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
    """Keras's Adam, first update: alpha * m / (sqrt(v) + epsilon), bias-corrected alpha."""
    m, v = (1 - beta_1) * g, (1 - beta_2) * g**2
    alpha = rate * np.sqrt(1 - beta_2) / (1 - beta_1)
    return w - alpha * m / (np.sqrt(v) + epsilon)


def test_tpu_guide_custom_loop_with_keras_objects(mnist_path):
    """The guide's custom-loop cells in their Keras form: `step_fn` closes over the plain
    Keras `create_model()`, `keras.optimizers.Adam()` and Keras metrics, as the guide's
    does; `tf.GradientTape` becomes `stateless_call` under `jax.value_and_grad`. The first
    step's last kernel equals the hand-computed Adam step on the first global batch."""
    get_dataset = _get_dataset_fn(_mnist(mnist_path), seed=0)
    batch_size = 200
    strategy = phalanx.Strategy()
    with strategy.scope():
        model = create_model()
        optimizer = keras.optimizers.Adam()
        training_loss = keras.metrics.Mean("training_loss", dtype="float32")
        training_accuracy = keras.metrics.SparseCategoricalAccuracy(
            "training_accuracy", dtype="float32"
        )

    per_replica_batch_size = batch_size // strategy.num_replicas_in_sync
    train_dataset = strategy.distribute_datasets_from_function(
        lambda _: get_dataset(per_replica_batch_size, is_training=True)
    )

    @phalanx.function
    def train_step(iterator):
        """The step function for one training step"""

        def step_fn(inputs):
            """The computation to run on each TPU device."""
            images, labels = inputs

            def loss_fn(trainable):  # TF: with tf.GradientTape() as tape:
                logits, _ = model.stateless_call(trainable, [], images, training=True)
                loss = keras.losses.sparse_categorical_crossentropy(
                    labels, logits, from_logits=True
                )
                loss = phalanx.compute_average_loss(loss, global_batch_size=batch_size)
                return loss, logits

            trainable = [v.value for v in model.trainable_variables]
            (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
            optimizer.apply_gradients(list(zip(grads, model.trainable_variables, strict=True)))
            training_loss.update_state(loss * strategy.num_replicas_in_sync)
            training_accuracy.update_state(labels, logits)

        strategy.run(step_fn, args=(next(iterator),))

    w0, b0 = (np.asarray(v, np.float64) for v in model.layers[-1].get_weights())
    features = keras.Model(model.inputs[0], model.layers[-2].output)  # the last layer's input
    images, labels = next(iter(get_dataset(batch_size, is_training=True)))
    hidden = np.asarray(features(images), np.float64)

    train_step(iter(train_dataset))

    # By hand: the last kernel's gradient of the mean softmax cross-entropy.
    logits = hidden @ w0 + b0
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    loss = -np.log(probabilities[np.arange(batch_size), labels]).mean()
    probabilities[np.arange(batch_size), labels] -= 1
    gradient = hidden.T @ probabilities / batch_size
    w1 = np.asarray(model.layers[-1].get_weights()[0], np.float64)
    changed = np.abs(gradient) > 1e-4  # where Adam's step is not decided by rounding
    np.testing.assert_allclose(w1[changed], _adam_first_step(w0, gradient)[changed], atol=2e-6)
    assert float(training_loss.result()) == pytest.approx(loss, rel=1e-5)
    assert int(optimizer.iterations.value) == 1
