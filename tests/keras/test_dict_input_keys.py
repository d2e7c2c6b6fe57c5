"""A dict batch without a key the model or step reads: the error names the keys it has,
in `strategy.run` and in `fit` (NNX and Keras models)."""

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest
from flax import nnx

import phalanx

ROWS = 8
FEATURES = {"a": np.ones((ROWS, 2), np.float32), "c": np.zeros((ROWS, 2), np.float32)}
LABELS = np.zeros((ROWS, 1), np.float32)


def test_strategy_run_names_the_batch_keys():
    strategy = phalanx.Strategy(devices=jax.devices()[:1])
    dataset = phalanx.data.Dataset.from_tensor_slices((FEATURES, LABELS)).batch(ROWS)
    (batch,) = list(strategy.experimental_distribute_dataset(dataset))

    def step(inputs):
        features, labels = inputs
        return jnp.sum(features["a"] + features["b"]) + jnp.sum(labels)

    with pytest.raises(KeyError, match=r"reads the key 'b'.*keys are \['a', 'c'\]") as error:
        strategy.run(step, args=(batch,))
    assert "strategy.run(" in str(error.value)


def test_a_key_error_of_another_cause_is_left_alone():
    strategy = phalanx.Strategy(devices=jax.devices()[:1])
    table = {"x": 1.0}

    def step(features):
        return features["a"] * table["missing"]  # "missing" is not a batch key... nor "a"'s

    with pytest.raises(KeyError) as error:
        strategy.run(step, args=({"a": np.ones((1,), np.float32), "missing": 0},))
    assert str(error.value) == "'missing'"  # in the batch: not phalanx's to explain


class _TwoInputs(nnx.Module):
    def __init__(self):
        self.dense = nnx.Linear(2, 1, rngs=nnx.Rngs(0))

    def __call__(self, x):
        return self.dense(x["a"] + x["b"])


class _KerasTwoInputs(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x["a"] + x["b"])


@pytest.mark.parametrize("kind", ["nnx", "keras"])
def test_fit_names_the_batch_keys(kind):
    with phalanx.Strategy(devices=jax.devices()[:1]).scope():
        if kind == "nnx":
            module = _TwoInputs()
        else:
            module = _KerasTwoInputs()
            module({"a": FEATURES["a"], "b": FEATURES["a"]})  # builds it
        model = phalanx.Model(module)
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(KeyError, match=r"reads the key 'b'.*keys are \['a', 'c'\]"):
        model.fit(FEATURES, LABELS, batch_size=ROWS, epochs=1, verbose=0)
