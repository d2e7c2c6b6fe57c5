"""Keras 3 tests: the JAX backend is chosen before anything imports keras.

The root conftest imports jax first (fake devices); keras reads KERAS_BACKEND on its first
import, which happens here.
"""

import os

os.environ["KERAS_BACKEND"] = "jax"

import keras
import pytest

import phalanx


@pytest.fixture
def all_devices():
    return phalanx.Strategy()


@pytest.fixture(autouse=True)
def _float32_keras_policy():
    """Tests that set Keras's global dtype policy cannot leak it."""
    yield
    keras.config.set_dtype_policy("float32")
