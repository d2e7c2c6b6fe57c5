"""TensorFlow's tutorial "Custom training with tf.distribute.Strategy", ported.

The source is tensorflow/docs `site/en/tutorials/distribute/custom_training.ipynb`. `_tutorial`
holds its code cells in order, with the renames `tf.distribute.MirroredStrategy` ->
`phalanx.Strategy`, `tf.data` -> `phalanx.data`, `tf.function` -> `phalanx.function`,
`tf.train.Checkpoint` / `tf.train.latest_checkpoint` -> `phalanx.train.Checkpoint` /
`phalanx.train.latest_checkpoint`, `tf.keras.metrics` / `tf.keras.losses` -> `phalanx.metrics` /
`phalanx.losses`, `tf.distribute.ReduceOp` -> `phalanx.ReduceOp`, `tf.cast` -> `jnp.asarray`.
The step reads `model`, `optimizer` and the metrics from the enclosing scope and applies
unreduced gradients, as the original does. The asserts are ours.

Lines that still differ beyond those renames (each marked `# TF:` below), and why:
1. `fashion_mnist.load_data()` -> `_load_data()`: a small synthetic set of 14x14 images
   (Fashion MNIST is not available offline); `BATCH_SIZE_PER_REPLICA` 64 -> 4 and
   `EPOCHS` 10 -> 2: the suite's time budget.
2. `.shuffle(BUFFER_SIZE)` -> `.shuffle(BUFFER_SIZE, seed=0)`: the test replays the order
   on one device to compare the numbers.
3. `create_model`: `tf.keras.Sequential([...])` -> `nnx.Sequential(...)`: this port keeps
   the step's state in Flax NNX objects (a Keras 3 model, optimizer and metrics reached from
   the step are carried too: tests/keras/test_keras_closures.py, where the tape becomes
   `stateless_call` under `jax.value_and_grad`); NNX layers take their input size and an
   RNG stream; the convolutions are left out because XLA:CPU compiles them slowly.
4. (none: `tf.keras.losses.Reduction.NONE` is `phalanx.losses.Reduction.NONE`.)
5. `tf.keras.optimizers.Adam()` -> `nnx.Optimizer(model, phalanx.optimizers.get("adam"),
   wrt=nnx.Param)` (twice): Keras's Adam as an optax transformation in an NNX optimizer.
6. `with tf.GradientTape() as tape: ...; tape.gradient(loss, model.trainable_variables)` ->
   `def loss_fn(model): ...; nnx.value_and_grad(loss_fn, has_aux=True)(model)`: JAX
   differentiates a function of the model; there is no tape.
7. `optimizer.apply_gradients(zip(gradients, model.trainable_variables))` ->
   `optimizer.update(model, gradients)`: NNX's name; it sums the replicas' gradients as
   `apply_gradients` does.
8. `model(images, training=True/False)` -> `model(images)` (three times): NNX modules carry
   their mode (`.train()` / `.eval()`), and this model has no layer that uses it.
9. `checkpoint_dir = './training_checkpoints'` -> pytest's `tmp_path`.
10. The cells run inside `_tutorial(checkpoint_dir)`, so its names are closure variables, not
    module globals (globals are covered by the tested block of docs/migration.md), and it
    returns what the asserts read.
"""

import os
import re

os.environ.setdefault("KERAS_BACKEND", "jax")  # before keras's first import, as tests/keras does

import jax
import jax.numpy as jnp
import keras
import numpy as np
import optax
import pytest
from flax import nnx

import phalanx

TRAIN_ROWS = 10 * 4 * jax.device_count() + 8  # ten full global batches and a partial one
TEST_ROWS = 100  # a partial last batch on 1, 3 and 8 replicas


def _load_data():
    """A stand-in for fashion_mnist.load_data(): 10 classes of 14x14 uint8 images."""
    rng = np.random.RandomState(0)
    patterns = rng.randint(0, 256, size=(10, 14, 14))

    def split(rows):
        labels = rng.randint(0, 10, size=rows).astype(np.uint8)
        noise = rng.randint(0, 96, size=(rows, 14, 14))
        return np.clip(patterns[labels] // 2 + noise, 0, 255).astype(np.uint8), labels

    return split(TRAIN_ROWS), split(TEST_ROWS)


def _tutorial(checkpoint_dir):
    """The tutorial's cells. Returns what the assertions read."""
    # Import TensorFlow  -> phalanx (and Flax NNX for the model)
    print(phalanx.__version__)

    # ## Download the fashion MNIST dataset
    (train_images, train_labels), (test_images, test_labels) = _load_data()

    # Adding a dimension to the array -> new shape == (14, 14, 1)  # TF: (28, 28, 1)
    train_images = train_images[..., None]
    test_images = test_images[..., None]

    # Getting the images in [0, 1] range.
    train_images = train_images / np.float32(255)
    test_images = test_images / np.float32(255)

    # ## Create a strategy to distribute the variables and the graph
    # If the list of devices is not specified in the
    # `tf.distribute.MirroredStrategy` constructor, it will be auto-detected.
    strategy = phalanx.Strategy()
    print("Number of devices: {}".format(strategy.num_replicas_in_sync))  # noqa: UP032

    # ## Setup input pipeline
    BUFFER_SIZE = len(train_images)
    BATCH_SIZE_PER_REPLICA = 4  # TF: 64
    GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
    EPOCHS = 2  # TF: 10

    train_dataset = (
        phalanx.data.Dataset.from_tensor_slices((train_images, train_labels))
        .shuffle(BUFFER_SIZE, seed=0)  # TF: .shuffle(BUFFER_SIZE); a seed to compare runs
        .batch(GLOBAL_BATCH_SIZE)
    )
    test_dataset = phalanx.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(
        GLOBAL_BATCH_SIZE
    )
    train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
    test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)

    # ## Create the model
    def create_model():
        # TF: tf.keras.Sequential([Conv2D(32, 3, activation='relu'), MaxPooling2D(),
        #     Conv2D(64, 3, activation='relu'), MaxPooling2D(), Flatten(),
        #     Dense(64, activation='relu'), Dense(10)])
        # NNX layers take their input size and an RNG stream. The convolutions are left
        # out: XLA:CPU compiles and runs them slowly, and the test runs on CPU.
        rngs = nnx.Rngs(0)
        model = nnx.Sequential(
            lambda x: x.reshape(x.shape[0], -1),  # Flatten()
            nnx.Linear(14 * 14, 64, rngs=rngs),
            nnx.relu,
            nnx.Linear(64, 10, rngs=rngs),
        )
        return model

    # Create a checkpoint directory to store the checkpoints.
    checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt")  # TF: './training_checkpoints'

    # ## Define the loss function
    with strategy.scope():
        # Set reduction to `none` so we can do the reduction afterwards and divide by
        # global batch size.
        loss_object = phalanx.losses.SparseCategoricalCrossentropy(
            from_logits=True,
            reduction=phalanx.losses.Reduction.NONE,
        )

        def compute_loss(labels, predictions):
            per_example_loss = loss_object(labels, predictions)
            return phalanx.compute_average_loss(
                per_example_loss, global_batch_size=GLOBAL_BATCH_SIZE
            )

    # ## Define the metrics to track loss and accuracy
    with strategy.scope():
        test_loss = phalanx.metrics.Mean(name="test_loss")

        train_accuracy = phalanx.metrics.SparseCategoricalAccuracy(name="train_accuracy")
        test_accuracy = phalanx.metrics.SparseCategoricalAccuracy(name="test_accuracy")

    # ## Training loop
    # model, optimizer, and checkpoint must be created under `strategy.scope`.
    with strategy.scope():
        model = create_model()

        # TF: optimizer = tf.keras.optimizers.Adam()  (an NNX optimizer over Keras's Adam)
        optimizer = nnx.Optimizer(model, phalanx.optimizers.get("adam"), wrt=nnx.Param)

        checkpoint = phalanx.train.Checkpoint(optimizer=optimizer, model=model)

    def train_step(inputs):
        images, labels = inputs

        # TF: with tf.GradientTape() as tape: predictions = model(images, training=True)
        #     ...; gradients = tape.gradient(loss, model.trainable_variables)
        # JAX differentiates a function of the model instead of recording a tape.
        def loss_fn(model):
            predictions = model(images)
            loss = compute_loss(labels, predictions)
            return loss, predictions

        (loss, predictions), gradients = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        # TF: optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        optimizer.update(model, gradients)

        train_accuracy.update_state(labels, predictions)
        return loss

    def test_step(inputs):
        images, labels = inputs

        predictions = model(images)  # TF: model(images, training=False)
        t_loss = loss_object(labels, predictions)

        test_loss.update_state(t_loss)
        test_accuracy.update_state(labels, predictions)

    # `run` replicates the provided computation and runs it
    # with the distributed input.
    @phalanx.function
    def distributed_train_step(dataset_inputs):
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce(phalanx.ReduceOp.SUM, per_replica_losses, axis=None)

    @phalanx.function
    def distributed_test_step(dataset_inputs):
        return strategy.run(test_step, args=(dataset_inputs,))

    for epoch in range(EPOCHS):
        # TRAIN LOOP
        total_loss = 0.0
        num_batches = 0
        for x in train_dist_dataset:
            total_loss += distributed_train_step(x)
            num_batches += 1
        train_loss = total_loss / num_batches

        # TEST LOOP
        for x in test_dist_dataset:
            distributed_test_step(x)

        if epoch % 2 == 0:
            checkpoint.save(checkpoint_prefix)

        template = "Epoch {}, Loss: {}, Accuracy: {}, Test Loss: {}, Test Accuracy: {}"
        print(
            template.format(
                epoch + 1,
                train_loss,
                train_accuracy.result() * 100,
                test_loss.result(),
                test_accuracy.result() * 100,
            )
        )

        test_loss.reset_states()
        train_accuracy.reset_states()
        test_accuracy.reset_states()

    # ## Restore the latest checkpoint and test
    eval_accuracy = phalanx.metrics.SparseCategoricalAccuracy(name="eval_accuracy")

    new_model = create_model()
    new_optimizer = nnx.Optimizer(new_model, phalanx.optimizers.get("adam"), wrt=nnx.Param)

    test_dataset = phalanx.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(
        GLOBAL_BATCH_SIZE
    )

    @phalanx.function
    def eval_step(images, labels):
        predictions = new_model(images)  # TF: new_model(images, training=False)
        eval_accuracy(labels, predictions)

    checkpoint = phalanx.train.Checkpoint(optimizer=new_optimizer, model=new_model)
    checkpoint.restore(phalanx.train.latest_checkpoint(checkpoint_dir))

    for images, labels in test_dataset:
        eval_step(images, labels)

    print(
        "Accuracy after restoring the saved model without strategy: {}".format(  # noqa: UP032
            eval_accuracy.result() * 100
        )
    )

    # ### Using iterators
    for _ in range(EPOCHS):
        total_loss = 0.0
        num_batches = 0
        train_iter = iter(train_dist_dataset)

        for _ in range(10):
            total_loss += distributed_train_step(next(train_iter))
            num_batches += 1
        average_train_loss = total_loss / num_batches

        template = "Epoch {}, Loss: {}, Accuracy: {}"
        print(template.format(epoch + 1, average_train_loss, train_accuracy.result() * 100))
        train_accuracy.reset_states()

    # ### Iterating inside a tf.function
    @phalanx.function
    def distributed_train_epoch(dataset):
        total_loss = 0.0
        num_batches = 0
        for x in dataset:
            per_replica_losses = strategy.run(train_step, args=(x,))
            total_loss += strategy.reduce(phalanx.ReduceOp.SUM, per_replica_losses, axis=None)
            num_batches += 1
        return total_loss / jnp.asarray(num_batches, dtype=jnp.float32)

    for epoch in range(EPOCHS):
        train_loss = distributed_train_epoch(train_dist_dataset)

        template = "Epoch {}, Loss: {}, Accuracy: {}"
        print(template.format(epoch + 1, train_loss, train_accuracy.result() * 100))

        train_accuracy.reset_states()

    return {
        "create_model": create_model,
        "train_images": train_images,
        "train_labels": train_labels,
        "global_batch_size": GLOBAL_BATCH_SIZE,
        "strategy": strategy,
        "new_model": new_model,
        "test_images": test_images,
        "test_labels": test_labels,
        "test_dist_dataset": test_dist_dataset,
        "optimizer": optimizer,
        "traced": len(distributed_train_step._cache),
    }


def _numbers(text):
    """The numbers of each printed line that starts with 'Epoch' or 'Accuracy after'."""
    lines = [ln for ln in text.splitlines() if ln.startswith(("Epoch", "Accuracy after"))]
    return [[float(v) for v in re.findall(r"-?\d+\.?\d*(?:e-?\d+)?", ln)] for ln in lines]


def _one_device_epochs(out, epochs):
    """The tutorial's first loop on one device, full global batches, the same shuffled
    order: each epoch's mean loss and training accuracy (in percent)."""
    model = out["create_model"]()
    optimizer = nnx.Optimizer(model, phalanx.optimizers.get("adam"), wrt=nnx.Param)
    batch_size = out["global_batch_size"]
    dataset = (
        phalanx.data.Dataset.from_tensor_slices((out["train_images"], out["train_labels"]))
        .shuffle(len(out["train_images"]), seed=0)
        .batch(batch_size)
    )

    @nnx.jit
    def step(model, optimizer, images, labels):
        def loss_fn(model):
            logits = model(images)
            per_example = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
            return per_example.sum() / batch_size, logits

        (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        return loss, (logits.argmax(-1) == labels).sum()

    results = []
    for _ in range(epochs):
        losses, correct, rows = [], 0, 0
        for images, labels in dataset:
            loss, right = step(model, optimizer, images, labels.astype(np.int32))
            losses.append(float(loss))
            correct, rows = correct + int(right), rows + len(labels)
        results.append([np.mean(losses), 100 * correct / rows])
    return results


def test_the_tutorial_runs_and_its_numbers_hold(tmp_path, capsys):
    n = jax.device_count()
    out = _tutorial(tmp_path)
    printed = _numbers(capsys.readouterr().out)
    assert len(printed) == 2 + 1 + 2 + 2  # the lines the tutorial prints
    strategy = out["strategy"]
    assert strategy.num_replicas_in_sync == n
    assert out["traced"] == 1  # one compiled train step, partial batch included
    # 2 epochs x 11 steps, 2 x 10 iterator steps, 2 epochs x 11 steps inside a function
    assert int(out["optimizer"].step[...]) == 2 * 11 + 2 * 10 + 2 * 11

    # The global-batch loss equals one device's: the first loop's printed loss and
    # accuracy per epoch ("Epoch e, Loss: l, Accuracy: a, ...") match one device's
    # training on the same global batches.
    one = _one_device_epochs(out, epochs=2)
    for line, (loss, accuracy) in zip(printed[:2], one, strict=True):
        assert line[1] == pytest.approx(loss, rel=1e-5)
        assert line[2] == pytest.approx(accuracy, abs=1e-3)

    # Test accuracy over a partial last batch (100 rows): the restored epoch-1 model's
    # accuracy computed directly, the distributed test loop's, and the eval loop's agree.
    logits = np.asarray(out["new_model"](out["test_images"]))
    direct = 100 * np.mean(logits.argmax(-1) == out["test_labels"])
    epoch_1_test_accuracy = printed[0][-1]
    after_restore = printed[2][-1]
    assert epoch_1_test_accuracy == pytest.approx(direct, abs=1e-3)
    assert after_restore == pytest.approx(direct, abs=1e-3)

    # Per-replica batch sizes: BATCH_SIZE_PER_REPLICA each, and the partial last batch of
    # 100 % GLOBAL_BATCH_SIZE rows split as tf.distribute splits it (ceil(B / N) in order).
    sizes = [
        [images.shape[0] for images, _ in strategy.experimental_local_results(batch)]
        for batch in out["test_dist_dataset"]
    ]
    last = TEST_ROWS % (4 * n)
    each = -(-last // n)
    assert sizes[0] == [4] * n
    assert sizes[-1] == [min(each, max(0, last - r * each)) for r in range(n)]
    assert sum(map(sum, sizes)) == TEST_ROWS


def test_the_tutorials_loss_scaling_example():
    """The tutorial's note: losses [2, 3] and [4, 5] on two replicas, global batch 4, give
    per-replica scaled losses 1.25 and 2.25, summed by strategy.reduce to the mean, 3.5."""
    strategy = phalanx.Strategy(devices=jax.devices()[:2])
    per_example = np.array([2.0, 3.0, 4.0, 5.0], np.float32)
    (batch,) = list(strategy.experimental_distribute_dataset([(per_example,)]))

    def step(inputs):
        return phalanx.compute_average_loss(inputs[0], global_batch_size=4)

    losses = strategy.run(step, args=(batch,))
    assert [float(v) for v in strategy.experimental_local_results(losses)] == [1.25, 2.25]
    assert float(strategy.reduce(phalanx.ReduceOp.SUM, losses, axis=None)) == 3.5


def _adam_first_step(w, g, rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
    """Keras's Adam, first update: alpha * m / (sqrt(v) + epsilon), bias-corrected alpha."""
    m, v = (1 - beta_1) * g, (1 - beta_2) * g**2
    alpha = rate * np.sqrt(1 - beta_2) / (1 - beta_1)
    return w - alpha * m / (np.sqrt(v) + epsilon)


def test_the_tutorials_training_step_with_keras_objects():
    """The tutorial's training cells in their Keras form (the current tutorial gives its
    layers `kernel_regularizer` and adds `model.losses` inside the tape): the step closes
    over a plain Keras model, `keras.optimizers.Adam()` and a Keras metric; the tape becomes
    `stateless_call` under `jax.value_and_grad`, `model.losses` is read in it. Beyond the
    renames: one Dense layer after Flatten (difference 3) with `L2(0.05)` instead of 1e-5,
    so that the regularizer's share of Adam's first (sign-like) step shows. The first step's
    kernel equals the hand-computed one, regularizer gradient included."""
    (train_images, train_labels), _ = _load_data()
    train_images = train_images[..., None] / np.float32(255)
    strategy = phalanx.Strategy()
    GLOBAL_BATCH_SIZE = 4 * strategy.num_replicas_in_sync

    def make_dataset():
        return (
            phalanx.data.Dataset.from_tensor_slices((train_images, train_labels))
            .shuffle(len(train_images), seed=0)
            .batch(GLOBAL_BATCH_SIZE)
        )

    train_dist_dataset = strategy.experimental_distribute_dataset(make_dataset())

    def create_model():
        regularizer = keras.regularizers.L2(0.05)  # TF: L2(1e-5) on every layer
        return keras.Sequential(
            [
                keras.Input((14, 14, 1)),
                keras.layers.Flatten(),
                keras.layers.Dense(10, kernel_regularizer=regularizer),
            ]
        )

    with strategy.scope():
        loss_object = phalanx.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=phalanx.losses.Reduction.NONE
        )

        def compute_loss(labels, predictions, model_losses):
            per_example_loss = loss_object(labels, predictions)
            loss = phalanx.compute_average_loss(per_example_loss)
            if model_losses:
                loss += phalanx.scale_regularization_loss(sum(model_losses))  # TF: tf.add_n
            return loss

        train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
        model = create_model()
        optimizer = keras.optimizers.Adam()

    def train_step(inputs):
        images, labels = inputs

        def loss_fn(trainable):  # TF: with tf.GradientTape() as tape:
            predictions, _ = model.stateless_call(trainable, [], images, training=True)
            return compute_loss(labels, predictions, model.losses), predictions

        trainable = [v.value for v in model.trainable_variables]
        (loss, predictions), gradients = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        train_accuracy.update_state(labels, predictions)
        return loss

    @phalanx.function
    def distributed_train_step(dataset_inputs):
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce(phalanx.ReduceOp.SUM, per_replica_losses, axis=None)

    w0, b0 = (np.asarray(v, np.float64) for v in model.get_weights())
    distributed_train_step(next(iter(train_dist_dataset)))
    w1 = np.asarray(model.get_weights()[0], np.float64)

    # By hand: softmax cross-entropy of the first global batch, mean over the batch.
    images, labels = next(iter(make_dataset()))
    x = images.reshape(len(images), -1).astype(np.float64)
    logits = x @ w0 + b0
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    probabilities[np.arange(len(labels)), labels] -= 1
    data_gradient = x.T @ probabilities / GLOBAL_BATCH_SIZE
    want = _adam_first_step(w0, data_gradient + 2 * 0.05 * w0)
    np.testing.assert_allclose(w1, want, rtol=0, atol=2e-5)
    without = _adam_first_step(w0, data_gradient)
    assert np.abs(w1 - without).max() > 1e-3  # the regularizer's share is in the step
    assert int(optimizer.iterations.value) == 1
