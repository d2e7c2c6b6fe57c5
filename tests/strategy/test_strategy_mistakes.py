"""Strategy mistakes get an error naming what was received (issue 22, items 3 and 4)."""

import numpy as np
import pytest

import phalanx

pytestmark = pytest.mark.multidevice


@pytest.fixture
def strategy():
    return phalanx.Strategy()


@pytest.mark.parametrize(
    ("dataset", "match"),
    [
        (
            (np.zeros((16, 3)), np.zeros(16)),
            r"got a tuple of 2 values \[\(16, 3\), \(16,\)\].*all of the first, then",
        ),
        ({"x": np.zeros((16, 3))}, r"got a dict with keys \['x'\]"),
        (np.zeros((16, 3)), r"got an array of shape \(16, 3\) \(it would yield one row"),
    ],
    ids=["tuple", "dict", "array"],
)
def test_arrays_are_not_a_dataset(strategy, dataset, match):
    with pytest.raises(ValueError, match=match) as info:
        strategy.experimental_distribute_dataset(dataset)
    assert "Dataset.from_tensor_slices((x, y)).batch(" in str(info.value)
    with pytest.raises(ValueError, match=r"distribute_datasets_from_function \(what dataset_fn"):
        strategy.distribute_datasets_from_function(lambda ctx: dataset)


def test_a_list_of_batches_and_a_batched_dataset_still_distribute(strategy):
    rows = 2 * strategy.num_replicas_in_sync
    x, y = np.ones((rows, 3), np.float32), np.zeros(rows, np.float32)
    (batch,) = list(strategy.experimental_distribute_dataset([(x, y)]))
    assert batch[0].shape == (rows, 3)
    dataset = phalanx.data.Dataset.from_tensor_slices((x, y)).batch(rows)
    (batch,) = list(strategy.experimental_distribute_dataset(dataset))
    assert batch[1].shape == (rows,)


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (lambda x: "done", r"returned 'done' \(a str\) as its output;"),
        (
            lambda x: {"loss": x.sum(), "note": "hi"},
            r"returned 'hi' \(a str\) as its output \['note'\]",
        ),
        (lambda x: (x, object), r"\(a type\) as its output \[1\]"),
    ],
    ids=["str", "dict-with-str", "tuple-with-class"],
)
def test_run_outputs_that_are_not_arrays_are_named(strategy, fn, match):
    x = np.ones((strategy.num_replicas_in_sync, 2), np.float32)
    (batch,) = list(strategy.experimental_distribute_dataset([x]))
    with pytest.raises(TypeError, match=match) as info:
        strategy.run(fn, args=(batch,))
    assert "must be arrays or numbers" in str(info.value)
    assert strategy.run(lambda x: (x * 2, 3.0), args=(batch,))[1] is not None  # still fine
