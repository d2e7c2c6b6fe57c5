"""choose_from_datasets, sample_from_datasets, Dataset.random and Dataset.counter: tf.data's
values where they are not random, seeded and resumable draws where they are."""

from __future__ import annotations

import json

import numpy as np
import pytest

from phalanx.data import Dataset


def _ints(dataset):
    return [int(v) for v in dataset]


def _choice(values):
    return Dataset.from_tensor_slices(np.array(values, np.int64))


def test_choose_from_datasets_matches_tf_data():
    inputs = [Dataset.range(3), Dataset.range(100, 104)]
    assert _ints(Dataset.choose_from_datasets(inputs, _choice([0, 1, 0, 1]))) == [0, 100, 1, 101]
    # An input that ends stops the mix (default), or its later choices are passed over.
    assert _ints(Dataset.choose_from_datasets(inputs, _choice([0, 0, 0, 0, 1, 1]))) == [0, 1, 2]
    passed = Dataset.choose_from_datasets(inputs, _choice([0, 0, 0, 0, 1, 1]), False)
    assert _ints(passed) == [0, 1, 2, 100, 101]
    # Once stopped it stays stopped, even under a batch that asks again.
    stopped = Dataset.choose_from_datasets(inputs, _choice([0, 0, 0, 0, 1]))
    assert [b.tolist() for b in stopped.batch(2).unbatch().batch(5)] == [[0, 1, 2]]
    with pytest.raises(
        ValueError, match=r"yielded 2; its elements must be scalar integers in \[0, 2\)"
    ):
        list(Dataset.choose_from_datasets(inputs, _choice([0, 2])))
    with pytest.raises(TypeError, match=r"non-empty list of phalanx\.data\.Dataset"):
        Dataset.choose_from_datasets([], _choice([0]))


def test_sample_from_datasets_follows_the_weights_and_the_seed():
    inputs = [Dataset.range(0, 1).repeat(), Dataset.range(1, 2).repeat()]
    draws = _ints(Dataset.sample_from_datasets(inputs, [0.25, 0.75], seed=1).take(4000))
    assert abs(np.mean(draws) - 0.75) < 0.03  # 4000 draws: sd 0.007
    again = _ints(Dataset.sample_from_datasets(inputs, [0.25, 0.75], seed=1).take(4000))
    other = _ints(Dataset.sample_from_datasets(inputs, [0.25, 0.75], seed=2).take(4000))
    assert again == draws and other != draws
    # Every element of finite inputs comes out once, each input in its order.
    finite = Dataset.sample_from_datasets([Dataset.range(5), Dataset.range(100, 103)], seed=0)
    out = _ints(finite)
    assert sorted(out) == [0, 1, 2, 3, 4, 100, 101, 102]
    assert [v for v in out if v < 100] == [0, 1, 2, 3, 4]
    stopped = _ints(
        Dataset.sample_from_datasets(
            [Dataset.range(5), Dataset.range(100, 103)], seed=0, stop_on_empty_dataset=True
        )
    )
    assert stopped == out[: len(stopped)] and len(stopped) < len(out)


def test_sample_from_datasets_rerandomizes_each_epoch_only_when_asked():
    inputs = [Dataset.range(0, 1).repeat(), Dataset.range(1, 2).repeat()]
    same = Dataset.sample_from_datasets(inputs, seed=3).take(50)
    assert _ints(same) == _ints(same)
    fresh = Dataset.sample_from_datasets(inputs, seed=3, rerandomize_each_iteration=True).take(50)
    assert _ints(fresh) != _ints(fresh)


def test_a_drawn_seed_is_recorded_so_a_restore_replays_it():
    np.random.seed(0)
    make = lambda: Dataset.sample_from_datasets(  # noqa: E731
        [Dataset.range(10), Dataset.range(100, 110)]
    )
    it = iter(make())
    first = [int(next(it)) for _ in range(5)]
    state = json.loads(json.dumps(it.get_state()))
    rest = _ints(it)
    restored = iter(make())  # another seed was drawn for this one
    restored.set_state(state)
    assert _ints(restored) == rest and len(first + rest) == 20


def test_sample_from_datasets_errors():
    ds = Dataset.range(3)
    with pytest.raises(ValueError, match=r"one weight >= 0 per dataset \(2\), not all 0"):
        Dataset.sample_from_datasets([ds, ds], [1.0])
    with pytest.raises(ValueError, match=r"not all 0; got \[0\.0, 0\.0\]"):
        Dataset.sample_from_datasets([ds, ds], [0, 0])
    with pytest.raises(TypeError, match="a dataset of weights"):
        Dataset.sample_from_datasets([ds, ds], Dataset.range(2))
    with pytest.raises(ValueError, match="seed must be an int >= 0 or None"):
        Dataset.sample_from_datasets([ds, ds], seed=-1)


def test_random_and_counter():
    values = _ints(Dataset.random(seed=7).take(1000))
    assert min(values) >= 0 and max(values) < 2**32 and len(set(values)) == 1000
    assert Dataset.random(seed=7).element_spec.dtype == np.int64
    assert _ints(Dataset.random(seed=7).take(1000)) == values  # the same every epoch
    rerolled = Dataset.random(seed=7, rerandomize_each_iteration=True).take(5)
    assert _ints(rerolled) != _ints(rerolled)
    # Uniform in [0, 2**32): the top bit is set about half the time.
    assert abs(np.mean(np.array(values) >= 2**31) - 0.5) < 0.06
    assert _ints(Dataset.counter(3, 2).take(3)) == [3, 5, 7]
    counted = Dataset.counter(dtype=np.int32).take(2)
    assert [v.dtype for v in counted] == [np.int32, np.int32]
    with pytest.raises(TypeError, match="counter's step must be an integer"):
        Dataset.counter(0, 0.5)
