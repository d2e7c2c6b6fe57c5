"""Shared tiny models and data for the Model tests."""

import jax
import numpy as np
import pytest
from flax import nnx

import phalanx


class MLP(nnx.Module):
    """A small classifier: 12 features -> 16 -> 5 logits."""

    def __init__(self, rngs: nnx.Rngs, din: int = 12, dout: int = 5):
        self.l1 = nnx.Linear(din, 16, rngs=rngs)
        self.l2 = nnx.Linear(16, dout, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def make_data(n: int, seed: int = 0, din: int = 12, classes: int = 5):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, din)).astype(np.float32)
    y = (np.abs(x[:, :classes]).argmax(1)).astype(np.int32)
    return x, y


def build(strategy, optimizer="sgd", metrics=("accuracy",), seed=0, **compile_kwargs):
    """A compiled Model on `strategy` with deterministic initial weights."""
    with strategy.scope():
        model = phalanx.Model(MLP(nnx.Rngs(seed)))
        model.compile(
            optimizer=optimizer,
            loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=list(metrics),
            **compile_kwargs,
        )
    return model


@pytest.fixture
def one_device():
    return phalanx.Strategy(devices=jax.devices()[:1])


@pytest.fixture
def all_devices():
    return phalanx.Strategy()
