"""Mistakes at the model's boundary: fit / evaluate / predict arguments, shapes and labels.

Every one is refused before a step is compiled, with a message that names what was
received.
"""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx
from mistakes import CLASSES, Case, Tiny, assert_documented, expect, ids

import phalanx

Dataset = phalanx.data.Dataset


def fit(s, *args, **kwargs):
    return s.model.fit(*args, verbose=0, **kwargs)


def labels(s, value, dtype=np.int32):
    bad = s.y.astype(dtype)
    bad[5] = value
    return bad


def fresh():
    """A new, uncompiled tiny model (on the default strategy)."""
    return phalanx.Model(Tiny(nnx.Rngs(1)))


CASES = [
    Case(
        "`model.fit()` with no data", ValueError, ("no data", "model.fit(x_train"), lambda s: fit(s)
    ),
    Case(
        "`fit(x, y)` with 16 rows of x and 15 labels",
        ValueError,
        ("16 rows", "has 15"),
        lambda s: fit(s, s.x, s.y[:15]),
    ),
    Case(
        "`fit(x, y)` with 5 features for a model built for 4",
        ValueError,
        ("cannot take inputs of shape (8, 5)", "takes 4 features"),
        lambda s: fit(s, np.zeros((16, 5), np.float32), s.y, batch_size=8),
    ),
    Case(
        "`fit(x, y)` with images (16, 2, 2) for a model of flat features",
        ValueError,
        ("cannot take inputs of shape", "(8, 2, 2)"),
        lambda s: fit(s, np.zeros((16, 2, 2), np.float32), s.y, batch_size=8),
    ),
    Case(
        "sparse labels outside `[0, classes)`",
        ValueError,
        (f"must be in [0, {CLASSES})", "e.g. [7]"),
        lambda s: fit(s, s.x, labels(s, 7)),
    ),
    Case(
        "a negative sparse label",
        ValueError,
        (f"must be in [0, {CLASSES})", "e.g. [-1]"),
        lambda s: fit(s, s.x, labels(s, -1)),
    ),
    Case(
        "fractional float labels for a sparse loss",
        ValueError,
        ("not whole numbers", "e.g. [0.5]"),
        lambda s: fit(s, s.x, labels(s, 0.5, np.float32)),
    ),
    Case(
        "`fit(epochs=-1)`",
        ValueError,
        ("epochs must be an int >= 0, got -1",),
        lambda s: fit(s, s.x, s.y, epochs=-1),
    ),
    Case("`fit(epochs=2.5)`", ValueError, ("got 2.5",), lambda s: fit(s, s.x, s.y, epochs=2.5)),
    Case(
        "`fit(initial_epoch=3, epochs=2)`",
        ValueError,
        ("initial_epoch 3", "epochs=2"),
        lambda s: fit(s, s.x, s.y, epochs=2, initial_epoch=3),
    ),
    Case(
        "`fit(prefetch=-2)`",
        ValueError,
        ("prefetch must be an int >= 0", "AUTOTUNE", "got -2"),
        lambda s: fit(s, s.x, s.y, prefetch=-2),
    ),
    Case(
        "`fit(x, y, batch_size=0)`",
        ValueError,
        ("batch_size", "got 0"),
        lambda s: fit(s, s.x, s.y, batch_size=0),
    ),
    Case(
        "`fit(x, y, batch_size='32')`",
        TypeError,
        ("batch_size", "'32'"),
        lambda s: fit(s, s.x, s.y, batch_size="32"),
    ),
    Case(
        "`fit(validation_split=1.5)`",
        ValueError,
        ("validation_split", "got 1.5"),
        lambda s: fit(s, s.x, s.y, validation_split=1.5),
    ),
    Case(
        "`validation_split` with a Dataset",
        ValueError,
        ("validation_split is only supported for NumPy", "Dataset", "validation_data="),
        lambda s: fit(s, Dataset.from_tensor_slices((s.x, s.y)).batch(8), validation_split=0.2),
    ),
    Case(
        "`validation_split=0.99` of 16 examples",
        ValueError,
        ("16 examples", "validation_split=0.99"),
        lambda s: fit(s, s.x, s.y, validation_split=0.99),
    ),
    Case(
        "`class_weight` as a list",
        ValueError,
        ("class_weight must be a dict", "[1.0, 2.0]"),
        lambda s: fit(s, s.x, s.y, class_weight=[1.0, 2.0]),
    ),
    Case(
        "`class_weight` with a Dataset",
        ValueError,
        ("class_weight needs the labels", "NoneType"),
        lambda s: fit(s, Dataset.from_tensor_slices((s.x, s.y)).batch(8), class_weight={0: 2.0}),
    ),
    Case(
        "an unbatched Dataset and no `batch_size`",
        ValueError,
        ("single examples", ".batch(n)"),
        lambda s: fit(s, Dataset.from_tensor_slices((s.x, s.y))),
    ),
    Case(
        "`batch_size` for a batched Dataset",
        ValueError,
        ("batch_size=8 was given for a batched Dataset", "batch(4)"),
        lambda s: fit(s, Dataset.from_tensor_slices((s.x, s.y)).batch(4), batch_size=8),
    ),
    Case("`fit(3)`", TypeError, ("cannot read batches from a int",), lambda s: fit(s, 3)),
    Case(
        "`fit('train.npz')`: a file name as data",
        TypeError,
        ("cannot read batches from a str",),
        lambda s: fit(s, "train.npz"),
    ),
    Case(
        "a Dataset that repeats forever and no `steps_per_epoch`",
        ValueError,
        ("repeats forever", "steps_per_epoch=N"),
        lambda s: fit(s, Dataset.from_tensor_slices((s.x, s.y)).batch(8).repeat()),
    ),
    Case(
        "string features",
        TypeError,
        ("x holds Python objects of type str", "integer ids"),
        lambda s: fit(s, np.array(list("abcdefghijklmnop")), s.y),
    ),
    Case(
        "ragged features (lists of different lengths)",
        ValueError,
        ("ragged",),
        lambda s: fit(s, [[1.0, 2.0], [3.0]], np.array([0, 1])),
    ),
    Case(
        "batches of 4 items `(x, y, w, extra)`",
        ValueError,
        ("got 4 items", "(x, y, sample_weight)"),
        lambda s: fit(s, Dataset.from_tensor_slices((s.x, s.y, s.y, s.y)).batch(8)),
    ),
    Case(
        "`validation_data` with the wrong number of features",
        ValueError,
        ("cannot take inputs of shape", ", 6)"),
        lambda s: fit(s, s.x, s.y, validation_data=(np.zeros((4, 6), np.float32), s.y[:4])),
    ),
    Case(
        "`validation_data` labels outside `[0, classes)`",
        ValueError,
        (f"must be in [0, {CLASSES})", "e.g. [9]"),
        lambda s: fit(s, s.x, s.y, validation_data=(s.x, labels(s, 9))),
    ),
    Case(
        "`callbacks=[print]`: a function as a callback",
        TypeError,
        ("callbacks must be phalanx.callbacks.Callback instances", "builtin_function_or_method"),
        lambda s: fit(s, s.x, s.y, callbacks=[print]),
    ),
    Case(
        "`evaluate(x, y)` with the wrong number of features",
        ValueError,
        ("cannot take inputs of shape", "takes 4 features"),
        lambda s: s.model.evaluate(np.zeros((16, 2), np.float32), s.y, verbose=0),
    ),
    Case(
        "`evaluate(x, y)` with labels outside `[0, classes)`",
        ValueError,
        (f"must be in [0, {CLASSES})", "e.g. [3]"),
        lambda s: s.model.evaluate(s.x, labels(s, 3), verbose=0),
    ),
    Case(
        "`evaluate(x, y, batch_size=-1)`",
        ValueError,
        ("batch_size", "got -1"),
        lambda s: s.model.evaluate(s.x, s.y, batch_size=-1, verbose=0),
    ),
    Case("`predict(None)`", ValueError, ("no data",), lambda s: s.model.predict(None, verbose=0)),
    Case(
        "`predict(x, batch_size=0)`",
        ValueError,
        ("batch_size", "got 0"),
        lambda s: s.model.predict(s.x, batch_size=0, verbose=0),
    ),
    Case(
        "`predict` on an unbatched Dataset and no `batch_size`",
        ValueError,
        ("single examples",),
        lambda s: s.model.predict(Dataset.from_tensor_slices(s.x), verbose=0),
    ),
    Case(
        "`phalanx.Model(3)`: not a model",
        TypeError,
        ("cannot train a builtins.int", "nnx.Module"),
        lambda s: phalanx.Model(3),
    ),
    Case(
        "`phalanx.Model(Tiny)`: the class, not an instance",
        TypeError,
        ("cannot train a",),
        lambda s: phalanx.Model(Tiny),
    ),
    Case(
        "`fit` before `compile`",
        RuntimeError,
        ("call model.compile(", "before model.fit()"),
        lambda s: fresh().fit(s.x, s.y),
    ),
    Case(
        "`set_weights` with too few arrays",
        ValueError,
        ("set_weights got 1 arrays", "variables"),
        lambda s: fresh().set_weights([np.zeros(3)]),
    ),
    Case(
        "`set_weights` with a wrong shape",
        ValueError,
        ("has shape (5,)", "where the model has"),
        lambda s: fresh().set_weights([np.zeros(5), *fresh().get_weights()[1:]]),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_the_mistake_gets_a_clear_error(case, make_scene):
    scene = make_scene(case.checkpoint)
    expect(case, scene)
    assert scene.model.train_step_count == 0  # refused before any step


def test_every_case_is_in_the_docs():
    assert_documented(CASES)
