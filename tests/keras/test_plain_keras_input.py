"""phalanx datasets as `x` of plain Keras 3 (JAX backend), as tf.data feeds tf.keras.

The Keras tutorial saves a model, loads it with `keras.models.load_model` outside any
strategy and evaluates it on the same dataset: plain Keras must read a `phalanx.data.Dataset`
(and a distributed dataset, through the dataset it distributes) with Keras's batches,
cardinality and steps, and give phalanx's numbers.
"""

import jax
import keras
import numpy as np
import pytest

import phalanx

X = np.random.RandomState(0).randn(50, 4).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int32)
BATCH = 8  # 50 rows: six full batches and a partial one of 2


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _dataset():
    return phalanx.data.Dataset.from_tensor_slices((X, Y)).batch(BATCH)


def test_plain_keras_evaluate_equals_phalanx_evaluate():
    dataset = _dataset()
    keras_model = _model()
    plain = keras_model.evaluate(dataset, verbose=0, return_dict=True)
    with phalanx.Strategy().scope():
        model = phalanx.Model(_model())
    model.compile(
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    ours = model.evaluate(dataset, return_dict=True)
    assert plain["loss"] == pytest.approx(ours["loss"], rel=1e-5)
    assert plain["accuracy"] == pytest.approx(ours["accuracy"])
    # And both equal plain Keras on the arrays.
    arrays = keras_model.evaluate(X, Y, batch_size=BATCH, verbose=0, return_dict=True)
    assert plain["loss"] == pytest.approx(arrays["loss"], rel=1e-6)


def test_plain_keras_fit_and_predict_read_every_batch():
    by_dataset, by_arrays = _model(), _model()
    history = by_dataset.fit(_dataset(), epochs=2, verbose=0)
    by_arrays.fit(X, Y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert len(history.history["loss"]) == 2
    for got, want in zip(by_dataset.get_weights(), by_arrays.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    predictions = by_dataset.predict(_dataset(), verbose=0)
    assert predictions.shape == (50, 2)
    np.testing.assert_allclose(predictions, by_dataset.predict(X, verbose=0), rtol=1e-5)


def test_cardinality_and_steps_as_keras_expects():
    dataset = _dataset()
    assert dataset.num_batches == 7
    model = _model()
    # An infinite dataset has no number of batches: Keras then needs `steps`.
    infinite = phalanx.data.Dataset.from_tensor_slices((X, Y)).repeat().batch(BATCH)
    assert infinite.num_batches is None
    history = model.fit(infinite, epochs=1, steps_per_epoch=3, verbose=0)
    assert int(model.optimizer.iterations.value) == 3
    assert len(history.history["loss"]) == 1
    assert model.evaluate(infinite, steps=2, verbose=0)[0] > 0


@pytest.mark.multidevice
def test_a_distributed_dataset_reads_its_dataset():
    strategy = phalanx.Strategy(devices=jax.devices()[:2])
    distributed = strategy.experimental_distribute_dataset(_dataset())
    model = _model()
    np.testing.assert_allclose(
        model.evaluate(distributed, verbose=0), model.evaluate(_dataset(), verbose=0), rtol=1e-6
    )


def test_unbatched_and_sourceless_inputs_say_what_to_do():
    model = _model()
    with pytest.raises(ValueError, match=r"dataset.batch\(32\)"):
        model.evaluate(phalanx.data.Dataset.from_tensor_slices((X, Y)), verbose=0)
    strategy = phalanx.Strategy(devices=jax.devices()[:1])
    from_function = strategy.distribute_datasets_from_function(lambda context: _dataset())
    with pytest.raises(ValueError, match=r"Pass the phalanx.data.Dataset itself"):
        model.evaluate(from_function, verbose=0)
