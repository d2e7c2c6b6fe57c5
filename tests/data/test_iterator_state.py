"""Iterator state: a restored iterator yields exactly what an uninterrupted one would."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.data import Dataset

N = 23


def pipeline(kind: str, seed: int | None = 11) -> Dataset:
    x = np.arange(N * 2, dtype=np.float32).reshape(N, 2)
    ds = Dataset.from_tensor_slices((x, np.arange(N))).shuffle(N, seed=seed)
    if kind == "epochs":
        return ds.batch(5)
    if kind == "repeat":
        return ds.repeat().batch(5)
    if kind == "batch_repeat":
        return ds.batch(5).repeat(3)
    if kind == "workers":
        return ds.batch(5).map(lambda x, y: (x * 2, y), num_parallel_calls=2)
    if kind == "workers_repeat":
        return ds.repeat().map(lambda x, y: (x + 1, y), num_parallel_calls=2).batch(5)
    if kind == "prefetch":
        return ds.batch(5).prefetch(3)
    raise AssertionError(kind)


def take(it, k: int) -> list[list[int]]:
    return [next(it)[1].tolist() for _ in range(k)]


def roundtrip(state: dict) -> dict:
    return json.loads(json.dumps(state))


@pytest.mark.parametrize(
    "kind", ["epochs", "repeat", "batch_repeat", "workers", "workers_repeat", "prefetch"]
)
@pytest.mark.parametrize("cut", [0, 2, 4])
def test_restore_mid_epoch(kind, cut):
    it = iter(pipeline(kind))
    take(it, cut)
    state = it.get_state()
    rest = take(it, 4 if kind in ("repeat", "workers_repeat") else 5 - cut)
    it.close()
    restored = iter(pipeline(kind))
    restored.set_state(roundtrip(state))
    assert take(restored, len(rest)) == rest
    restored.close()


@pytest.mark.parametrize("kind", ["repeat", "batch_repeat", "workers_repeat"])
def test_restore_across_a_repetition_boundary(kind):
    # 23 rows in batches of 5: the state sits after the first pass over the data.
    it = iter(pipeline(kind))
    take(it, 5)
    state = it.get_state()
    rest = take(it, 6)
    it.close()
    restored = iter(pipeline(kind))
    restored.set_state(roundtrip(state))
    assert take(restored, 6) == rest
    restored.close()


@pytest.mark.parametrize("kind", ["epochs", "workers"])
def test_restore_across_iteration_epochs(kind):
    ds = pipeline(kind)
    list(ds)  # epoch 0
    it = iter(ds)  # epoch 1
    take(it, 2)
    state = it.get_state()
    rest_of_1, epoch_2 = take(it, 3), [b[1].tolist() for b in ds]
    assert state["epoch"] == 1
    fresh = pipeline(kind)
    it2 = iter(fresh)
    it2.set_state(roundtrip(state))
    assert take(it2, 3) == rest_of_1
    with pytest.raises(StopIteration):
        next(it2)
    assert [b[1].tolist() for b in fresh] == epoch_2


def test_set_state_rewinds_a_running_iterator_with_workers():
    ds = pipeline("workers")
    first = [b[1].tolist() for b in ds]
    list(ds)
    it = iter(ds)  # epoch 2, with Grain threads running ahead
    take(it, 3)
    it.set_state({"epoch": 0, "step": 1, "seeds": [11]})
    assert take(it, 4) == first[1:]
    it.close()
    assert iter(ds).epoch == 1


def test_state_carries_a_drawn_seed():
    ds = pipeline("epochs", seed=None)
    it = iter(ds)
    take(it, 1)
    state = it.get_state()
    rest, next_epoch = take(it, 4), [b[1].tolist() for b in ds]
    other = pipeline("epochs", seed=None)  # a new process draws another seed
    it2 = iter(other)
    it2.set_state(roundtrip(state))
    assert take(it2, 4) == rest
    assert [b[1].tolist() for b in other] == next_epoch


def test_state_at_the_end_of_an_epoch_is_exhausted():
    it = iter(pipeline("epochs"))
    take(it, 5)
    state = it.get_state()
    assert state["step"] == 5
    it2 = iter(pipeline("epochs"))
    it2.set_state(state)
    with pytest.raises(StopIteration):
        next(it2)


def test_state_is_small_json():
    it = iter(pipeline("epochs"))
    next(it)
    assert it.get_state() == {"epoch": 0, "step": 1, "seeds": [11]}


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({"epoch": 0}, "keys"),
        ({"epoch": 0, "step": 99, "seeds": [1]}, "out of range"),
        ({"epoch": 0, "step": 1, "seeds": [1, 2]}, "holds 2 seeds"),
        ([0, 1], "keys"),
    ],
)
def test_bad_states_are_rejected(state, match):
    it = iter(pipeline("epochs"))
    with pytest.raises(ValueError, match=match):
        it.set_state(state)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 40),
    batch=st.integers(1, 9),
    seed=st.integers(0, 2**32),
    cut=st.integers(0, 12),
    repeat=st.booleans(),
)
def test_restore_property(n, batch, seed, cut, repeat):
    def build():
        ds = Dataset.from_tensor_slices(np.arange(n)).shuffle(n, seed=seed)
        return (ds.repeat() if repeat else ds).batch(batch)

    it = iter(build())
    done = [b.tolist() for _, b in zip(range(cut), it, strict=False)]
    state = it.get_state()
    rest = [b.tolist() for _, b in zip(range(6), it, strict=False)]
    restored = iter(build())
    restored.set_state(roundtrip(state))
    assert [b.tolist() for _, b in zip(range(6), restored, strict=False)] == rest
    assert state["step"] == len(done)


@pytest.mark.parametrize("kind", ["epochs", "repeat", "batch_repeat", "workers", "prefetch"])
@pytest.mark.parametrize("count", [1, 4, 7])
def test_next_many_yields_what_next_yields_and_states_go_back_exactly(kind, count):
    one_by_one, together = iter(pipeline(kind)), iter(pipeline(kind))
    seen, states = [], []
    for _ in range(3):  # 21 elements: crosses the 5-row partial batch and the repetitions
        got = together.next_many(count)
        want = [next(one_by_one) for _ in range(len(got))]
        for a, b in zip(got, want, strict=True):
            for leaf_a, leaf_b in zip(a, b, strict=True):
                np.testing.assert_array_equal(leaf_a, leaf_b)
        seen += [b[1].tolist() for b in want]
        states.append(together.get_state())
        assert states[-1] == one_by_one.get_state()
    # A state from `back` elements ago resumes right after the element it names.
    back = min(count - 1, 2)
    state = together.get_state(back=back)
    resumed = iter(pipeline(kind))
    resumed.set_state(roundtrip(state))
    if back:
        assert take(resumed, back) == seen[-back:]


def test_next_many_ends_with_the_epoch_and_going_back_too_far_is_refused():
    it = iter(pipeline("epochs"))  # 5 batches
    assert len(it.next_many(4)) == 4
    assert len(it.next_many(4)) == 1
    assert it.next_many(4) == []
    with pytest.raises(ValueError, match="cannot go back 6"):
        it.get_state(back=6)
