"""Small Keras models and data shared by the Keras tests (imported after conftest.py has
set KERAS_BACKEND=jax)."""

import keras
import numpy as np

import phalanx


def mlp(hidden: int = 32, din: int = 784, classes: int = 10) -> keras.Model:
    """The seeds' first model (784 -> relu -> softmax), narrower so tests stay fast."""
    return keras.Sequential(
        [
            keras.layers.Input(shape=(din,)),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(classes, activation="softmax"),
        ]
    )


def mnist_subset(path, n: int):
    """The seeds' preprocessing on the first `n` MNIST training images: flat, /255, one-hot."""
    with np.load(path) as data:
        x, y = data["x_train"][:n], data["y_train"][:n]
    return x.reshape(n, 784).astype(np.float32) / 255.0, np.eye(10, dtype=np.float32)[y]


def twin(build, strategy=None, seed: int = 0):
    """Two Keras models with the same initial weights: one for Keras's own fit (built
    outside any strategy) and one built in `strategy.scope()` and wrapped by phalanx."""
    keras.utils.set_random_seed(seed)
    reference = build()
    strategy = strategy or phalanx.Strategy()
    with strategy.scope():
        mine = build()
        mine.set_weights(reference.get_weights())
        model = phalanx.Model(mine)
    return reference, mine, model
