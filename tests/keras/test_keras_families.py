"""Issue 21's Keras families give Keras's own numbers: `fit`'s logs, `evaluate`, and the
trained weights, on one replica and on every device (8 fake ones), against one Keras run.

Batches of 8; most families end in a padded partial batch (44 rows), on 1 and 8 replicas.
"""

import jax
import keras
import numpy as np
import pytest
from keras_models import FAMILIES, same_initial_state

import phalanx

BATCH = 8
FIT = dict(batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
EVALUATE = dict(batch_size=BATCH, verbose=0, return_dict=True)
# Weights whose gradient is zero by construction, so only rounding moves them, and Adam
# scales that rounding up to a step of its own: in keras.io's TabTransformer, the shifts of
# the LayerNormalizations right before the MLP's BatchNormalization, which subtracts each
# feature's batch mean (their values differ by ~4e-5 between any two summation orders).
NULL_GRADIENT = {"tabtransformer": ("layer_norm2_0/beta", "numerical_norm/beta")}


def strategies():
    return {"1 replica": phalanx.Strategy(devices=jax.devices()[:1]), "all": phalanx.Strategy()}


def run_family(name, runs):
    """Keras's own fit + evaluate, then phalanx's on each strategy in `runs`; yields
    `(label, seconds, ours)` after `("keras", seconds, theirs)`, each a tuple `(fit history,
    evaluate dict, keras model)`."""
    import time

    build, data, arguments, rows = FAMILIES[name]
    x, y, *weights = data(rows)
    sample_weight = weights[0] if weights else None
    keras.utils.set_random_seed(0)
    initial = build()
    reference = build()
    same_initial_state(reference, initial)
    reference.compile(**arguments())
    start = time.perf_counter()
    history = reference.fit(x, y, sample_weight=sample_weight, **FIT).history
    seconds = time.perf_counter() - start
    scores = reference.evaluate(x, y, sample_weight=sample_weight, **EVALUATE)
    yield "keras", seconds, (history, scores, reference)
    for label, strategy in runs.items():
        with strategy.scope():
            mine = build()
            same_initial_state(mine, initial)
            model = phalanx.Model(mine)
            model.compile(**arguments())
        start = time.perf_counter()
        history = model.fit(x, y, sample_weight=sample_weight, **FIT).history
        seconds = time.perf_counter() - start
        scores = model.evaluate(x, y, sample_weight=sample_weight, **EVALUATE)
        yield label, seconds, (history, scores, mine)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_gives_kerass_numbers_on_1_and_8_replicas(name):
    runs = run_family(name, strategies())
    _, _, (expected, theirs, reference) = next(runs)
    for label, _, (history, ours, mine) in runs:
        for key, values in expected.items():
            np.testing.assert_allclose(
                history[key], values, rtol=2e-5, atol=2e-6, err_msg=f"{label}: fit {key}"
            )
        assert set(theirs) == set(ours)
        for key, value in theirs.items():
            np.testing.assert_allclose(
                ours[key], value, rtol=2e-5, atol=2e-6, err_msg=f"{label}: evaluate {key}"
            )
        pairs = zip(mine.weights, mine.get_weights(), reference.get_weights(), strict=True)
        for variable, a, b in pairs:
            if variable.path not in NULL_GRADIENT.get(name, ()):
                np.testing.assert_allclose(a, b, atol=2e-5, err_msg=f"{label}: {variable.path}")
