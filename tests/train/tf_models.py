"""Keras models and TF training runs shared by TensorFlow (which writes checkpoints) and
phalanx (which restores them), for tests/train/test_tf_checkpoint_*.py.

Run as a script under `KERAS_BACKEND=tensorflow` it trains each scenario a few steps in
TensorFlow, saves as a TF user does (`tf.train.CheckpointManager`, `Checkpoint.save`,
`Checkpoint.write`, Keras 2's `save_weights`), then records what TF computes next: the
next step's loss, every variable after it, and inference predictions. The test process
imports only the builders (Keras, whatever its backend) and restores without TF.

    KERAS_BACKEND=tensorflow python tests/train/tf_models.py OUT_DIR
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np

FEATURES, OUTPUTS, ROWS = 6, 3, 16
IMAGE = (8, 8, 2)
# Every Keras optimizer with state, by name: constructor arguments.
OPTIMIZERS = {
    "SGD": {"learning_rate": 0.05, "momentum": 0.9},
    "RMSprop": {"learning_rate": 0.01, "momentum": 0.5, "centered": True},
    "Adam": {"learning_rate": 0.01, "amsgrad": True},
    "AdamW": {"learning_rate": 0.01, "weight_decay": 0.05},
    "Adadelta": {"learning_rate": 0.5},
    "Adagrad": {"learning_rate": 0.1},
    "Adamax": {"learning_rate": 0.01},
    "Adafactor": {"learning_rate": 0.01},
    "Nadam": {"learning_rate": 0.01},
    "Ftrl": {"learning_rate": 0.1, "l1_regularization_strength": 0.01},
    "Lion": {"learning_rate": 0.001},
    "Lamb": {"learning_rate": 0.01},
    "Muon": {"learning_rate": 0.01},
    "ScheduleFreeAdamW": {"learning_rate": 0.01},
    "LossScaleOptimizer": {},  # around Adam: its own scale and counters, then Adam's slots
}


def data(seed: int = 0, image: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(ROWS, *(IMAGE if image else (FEATURES,)))).astype(np.float32)
    return x, rng.normal(size=(ROWS, OUTPUTS)).astype(np.float32)


def functional(dropout: float = 0.0):
    """A functional MLP with BatchNormalization (and Dropout, for inference tests)."""
    import keras

    inputs = keras.Input((FEATURES,), name="features")
    h = keras.layers.Dense(16, activation="relu")(inputs)
    h = keras.layers.BatchNormalization(momentum=0.8)(h)
    h = keras.layers.Dropout(dropout)(h)
    return keras.Model(inputs, keras.layers.Dense(OUTPUTS)(h))


def sequential_cnn():
    """A Sequential conv net: Conv2D, BatchNormalization, pooling, Dense."""
    import keras

    return keras.Sequential(
        [
            keras.Input(IMAGE),
            keras.layers.Conv2D(4, 3, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(OUTPUTS),
        ]
    )


def subclassed():
    """A subclassed model holding its layers in a list and a dict."""
    import keras

    class Tower(keras.Model):
        def __init__(self):
            super().__init__()
            self.blocks = [keras.layers.Dense(8, activation="tanh") for _ in range(2)]
            self.heads = {"main": keras.layers.Dense(OUTPUTS)}

        def call(self, x, training=False):
            for block in self.blocks:
                x = block(x)
            return self.heads["main"](x)

    model = Tower()
    model(np.zeros((1, FEATURES), np.float32))
    return model


def tiny():
    import keras

    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(OUTPUTS)])


def optimizer(name: str, schedule: bool = False):
    import keras

    if schedule:
        rate = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=2, decay_rate=0.5)
        return keras.optimizers.Adam(learning_rate=rate)
    if name == "LossScaleOptimizer":
        return keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01))
    return getattr(keras.optimizers, name)(**OPTIMIZERS[name])


def mse(y, prediction):
    import keras

    return keras.ops.mean((prediction - y) ** 2)


# ---- TensorFlow's side ------------------------------------------------------------------------
def _tf_step(model, opt, x, y) -> float:
    import tensorflow as tf

    with tf.GradientTape() as tape:
        loss = mse(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return float(loss)


def _variables(model, opt) -> dict[str, np.ndarray]:
    return {
        **{f"weight_{i}": np.asarray(v) for i, v in enumerate(model.weights)},
        **{f"slot_{i}": np.asarray(v) for i, v in enumerate(opt.variables)},
    }


def _record(folder: str, model, opt, x, y, x_test) -> None:
    """What TF has at the checkpoint (its variables, inference predictions), and what it
    computes next: the next step's loss and every variable after it."""
    before = _variables(model, opt)
    predictions = np.asarray(model(x_test, training=False))
    np.savez(os.path.join(folder, "before.npz"), predictions=predictions, **before)
    loss = _tf_step(model, opt, x, y)
    np.savez(os.path.join(folder, "next.npz"), loss=loss, **_variables(model, opt))


def _saved(out: str, name: str, model, opt, steps: int, how: str, image: bool = False) -> None:
    import tensorflow as tf

    x, y = data(0, image)
    x_test, _ = data(1, image)
    folder = os.path.join(out, name)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=opt, step=tf.Variable(0, tf.int64))
    manager = tf.train.CheckpointManager(checkpoint, folder, max_to_keep=2)
    for _ in range(steps):
        _tf_step(model, opt, x, y)
        checkpoint.step.assign_add(1)
        if how == "manager":
            manager.save()
    if how == "save":
        checkpoint.save(os.path.join(folder, "ckpt"))
    elif how == "write":
        checkpoint.write(os.path.join(folder, "ckpt"))
    _record(folder, model, opt, x, y, x_test)


def _keras2_layout(out: str) -> None:
    """Keras 2's `save_weights` layout written with TF's tracking alone, for where tf_keras
    is not installed (its metadata requires the `tensorflow` wheel, which would install a
    second TensorFlow over `tensorflow-cpu`): the object graph tf_keras 2.21 writes for this
    model, root the model, `layer_with_weights-N` and `layer-N` edges onto the layers, each
    layer's variables by name. The values are TF's own, so the test still compares bits."""
    import tensorflow as tf

    x, _ = data(1)
    rng = np.random.default_rng(2)
    shapes = [{"kernel": (FEATURES, 16), "bias": (16,)},
              {"gamma": (16,), "beta": (16,), "moving_mean": (16,), "moving_variance": (16,)},
              {"kernel": (16, OUTPUTS), "bias": (OUTPUTS,)}]  # fmt: skip
    root, weights, layers = tf.Module(), [], []
    for index, variables in enumerate(shapes):
        layer = tf.Module()
        for name, shape in variables.items():
            value = (
                np.abs(rng.normal(size=shape)) + 0.5
                if "variance" in name
                else rng.normal(size=shape)
            )
            setattr(layer, name, tf.Variable(value.astype(np.float32)))
            weights.append(getattr(layer, name).numpy())
        setattr(root, f"layer_with_weights-{index}", layer)
        layers.append(layer)
    for index, layer in enumerate([layers[0], layers[1], tf.Module(), layers[2]]):
        setattr(root, f"layer-{index}", layer)
    folder = os.path.join(out, "keras2")
    tf.train.Checkpoint(root=root).write(os.path.join(folder, "weights"))
    k0, b0, gamma, beta, mean, variance, k1, b1 = weights
    h = np.maximum(x @ k0 + b0, 0)
    h = (h - mean) / np.sqrt(variance + 1e-3) * gamma + beta
    np.savez(
        os.path.join(folder, "expected.npz"),
        predictions=h @ k1 + b1,
        **{f"weight_{i}": w for i, w in enumerate(weights)},
    )


def _keras2(out: str) -> None:
    import tf_keras

    model = tf_keras.Sequential(
        [
            tf_keras.layers.Dense(16, activation="relu", input_shape=(FEATURES,)),
            tf_keras.layers.BatchNormalization(momentum=0.8),
            tf_keras.layers.Dropout(0.3),
            tf_keras.layers.Dense(OUTPUTS),
        ]
    )
    model.compile(optimizer="adam", loss="mse")
    x, y = data(0)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    folder = os.path.join(out, "keras2")
    model.save_weights(os.path.join(folder, "weights"))
    x_test, _ = data(1)
    np.savez(
        os.path.join(folder, "expected.npz"),
        predictions=model.predict(x_test, verbose=0),
        **{f"weight_{i}": w for i, w in enumerate(model.get_weights())},
    )


def main(out: str) -> None:
    import keras
    import tensorflow as tf

    assert keras.backend.backend() == "tensorflow"
    keras.utils.set_random_seed(0)
    _saved(out, "adam", functional(), optimizer("Adam"), 3, "manager")
    _saved(out, "sgd", sequential_cnn(), optimizer("SGD"), 3, "save", image=True)
    _saved(out, "schedule", subclassed(), optimizer("Adam", schedule=True), 3, "write")
    for name in OPTIMIZERS:
        _saved(out, f"opt_{name}", tiny(), optimizer(name), 2, "write")
    _saved(out, "dropout", functional(dropout=0.5), optimizer("Adam"), 2, "save")
    if importlib.util.find_spec("tf_keras") is not None:
        _keras2(out)
    else:
        _keras2_layout(out)
    print("TF", tf.__version__, "keras", keras.__version__)


if __name__ == "__main__":
    main(sys.argv[1])
