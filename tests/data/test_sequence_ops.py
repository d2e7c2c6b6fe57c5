"""scan, reduce, take_while, unique, apply, get_single_element, ignore_errors and
assert_cardinality: tf.data's values, phalanx's errors, and drops that are never silent."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest

from phalanx.data import Dataset, DroppedElementsWarning, experimental


def _lists(dataset):
    return [np.asarray(e).tolist() for e in dataset]


def test_scan_and_reduce_match_tf_data():
    assert _lists(Dataset.range(5).scan(np.int64(0), lambda s, x: (s + x, s * 10))) == [
        0, 0, 10, 30, 60,
    ]  # fmt: skip
    assert Dataset.range(5).reduce(np.int64(0), lambda s, x: s + x) == 10
    pairs = Dataset.range(3).enumerate(5).reduce((0, 0), lambda s, e: (s[0] + e[0], s[1] + e[1]))
    assert [int(v) for v in pairs] == [18, 3]
    with pytest.raises(ValueError, match=r"must return a pair \(new_state, output_element\)"):
        list(Dataset.range(3).scan(0, lambda s, x: s + x))


def test_scan_state_restores_bit_for_bit():
    make = lambda: Dataset.range(6).scan(  # noqa: E731
        {"mean": np.float32(0), "n": np.int64(0), "tag": "x"},
        lambda s, x: (
            {
                "mean": s["mean"] + (np.float32(x) - s["mean"]) / np.float32(s["n"] + 1),
                "n": s["n"] + 1,
                "tag": s["tag"] + "y",
            },
            s["mean"],
        ),
    )
    it = iter(make())
    next(it), next(it), next(it)
    saved = json.loads(json.dumps(it.get_state()))
    restored = iter(make())
    restored.set_state(saved)
    rest = list(restored)
    assert [v.dtype for v in rest] == [np.float32] * 3
    assert [float(v) for v in rest] == [float(v) for v in list(make())[3:]]
    with pytest.raises(TypeError, match="cannot hold a object exactly"):
        it = iter(Dataset.range(2).scan(0, lambda s, x: (object(), x)))
        next(it)
        it.get_state()


def test_take_while_unique_apply_and_get_single_element():
    assert _lists(Dataset.range(10).take_while(lambda x: x < 4)) == [0, 1, 2, 3]
    assert _lists(Dataset.from_tensor_slices([1, 2, 1, 3, 2]).unique()) == [1, 2, 3]
    words = Dataset.from_tensor_slices(["a", "b", "a"]).unique().map(str.upper).batch(2)
    assert words.get_single_element().tolist() == ["A", "B"]
    assert _lists(Dataset.range(6).apply(lambda d: d.filter(lambda x: x % 2).batch(2))) == [
        [1, 3], [5],
    ]  # fmt: skip
    assert Dataset.range(1).get_single_element() == 0
    with pytest.raises(ValueError, match="more than one element"):
        Dataset.range(2).get_single_element()
    with pytest.raises(ValueError, match="the dataset is empty"):
        Dataset.range(0).get_single_element()
    with pytest.raises(
        TypeError, match=r"apply\(\).s function must return a phalanx.data.Dataset, got list"
    ):
        Dataset.range(2).apply(lambda d: list(d))
    with pytest.raises(TypeError, match=r"unique\(\) takes scalar integers, strings or bytes"):
        list(Dataset.range(4).batch(2).unique())
    with pytest.raises(ValueError, match="take_while's predicate must return a scalar bool"):
        list(Dataset.range(4).batch(2).take_while(lambda b: b > 0))


def _decode(x):
    if x in (3, 7):
        raise ValueError(f"corrupt JPEG {int(x)}")
    return x


@pytest.mark.parametrize("threads", [None, 2], ids=["inline", "threads"])
def test_ignore_errors_drops_counts_and_warns(threads):
    ds = Dataset.range(10).map(_decode, num_parallel_calls=threads).ignore_errors()
    with pytest.warns(DroppedElementsWarning) as caught:
        assert _lists(ds) == [0, 1, 2, 4, 5, 6, 8, 9]
    messages = [str(w.message) for w in caught]
    assert "raised ValueError: corrupt JPEG 3" in messages[0]
    assert "dropped 2 of the 10 elements of this pass" in messages[-1]


def test_ignore_errors_logs_each_drop_when_asked(caplog):
    ds = Dataset.range(10).map(_decode).ignore_errors(log_warning=True).batch(4)
    with caplog.at_level(logging.WARNING, logger="phalanx.data"):
        assert _lists(ds) == [[0, 1, 2, 4], [5, 6, 8, 9]]
    logged = [r.getMessage() for r in caplog.records]
    assert logged == [
        "ignore_errors() dropped an element: ValueError: corrupt JPEG 3",
        "ignore_errors() dropped an element: ValueError: corrupt JPEG 7",
        "ignore_errors() dropped 2 of the 10 elements of this pass (their computation raised)",
    ]


def test_ignore_errors_count_resumes_with_the_iterator():
    ds = Dataset.range(10).map(_decode).ignore_errors()
    it = iter(ds)
    with pytest.warns(DroppedElementsWarning, match="corrupt JPEG 3"):
        [next(it) for _ in range(5)]
    state = json.loads(json.dumps(it.get_state()))
    restored = iter(ds)
    restored.set_state(state)
    with pytest.warns(DroppedElementsWarning, match="dropped 2 of the 10") as caught:
        assert [int(v) for v in restored] == [6, 8, 9]
    assert len(caught) == 1  # the first drop was warned about before the state was saved


def test_without_ignore_errors_an_error_is_raised_and_the_iterator_goes_on():
    it = iter(Dataset.range(5).map(_decode).filter(lambda x: True))
    assert [int(next(it)) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="corrupt JPEG 3"):
        next(it)
    assert int(next(it)) == 4  # as a tf.data iterator: the failing element is passed


def test_assert_cardinality():
    kept = Dataset.range(10).filter(lambda x: x % 2 == 0)
    stated = kept.apply(experimental.assert_cardinality(5))
    assert (
        stated.cardinality == 5 and len(stated.batch(2)) == 3 and _lists(stated) == [0, 2, 4, 6, 8]
    )
    with pytest.raises(ValueError, match="expected to hold 6 elements but held only 5"):
        list(kept.apply(experimental.assert_cardinality(6)))
    with pytest.raises(ValueError, match="expected to hold 4 elements but held at least 5"):
        list(kept.apply(experimental.assert_cardinality(4)))
    with pytest.raises(ValueError, match=r"assert_cardinality\(3\): the dataset has 10 elements"):
        Dataset.range(10).apply(experimental.assert_cardinality(3))
    forever = Dataset.range(3).repeat().filter(lambda x: x > 0)
    assert forever.apply(experimental.assert_cardinality(-1)).cardinality == math.inf
    with pytest.raises(ValueError, match="takes a count >= 0"):
        experimental.assert_cardinality(-5)
