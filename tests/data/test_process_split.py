"""process_split: each process reads its share; global batches never depend on the count."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from phalanx.data import Dataset

N, BATCH = 23, 8


def build(split: tuple[int, int] | None = None, seen: list | None = None) -> Dataset:
    def record(v):
        if seen is not None:
            seen.append(int(v))
        return v

    ds = Dataset.from_tensor_slices(np.arange(N)).shuffle(N, seed=4).map(record).batch(BATCH)
    return ds if split is None else ds.process_split(*split)


def parts(count: int, epochs: int = 2) -> list[list[list[list[int]]]]:
    """parts[p][step] = the rows process p yields, over `epochs` epochs."""
    out = []
    for index in range(count):
        ds = build((index, count))
        out.append([b.tolist() for _ in range(epochs) for b in ds])
    return out


@pytest.mark.parametrize(
    ("count", "golden"),
    [
        # Batch lengths 8, 8, 7 split with ceil(n / count) rows per part.
        (1, [[8, 8, 7]]),
        (2, [[4, 4, 4], [4, 4, 3]]),
        (3, [[3, 3, 3], [3, 3, 3], [2, 2, 1]]),
    ],
)
def test_share_sizes_golden(count, golden):
    sizes = [[len(b) for b in batches[:3]] for batches in parts(count, epochs=1)]
    assert sizes == golden


@pytest.mark.parametrize("count", [1, 2, 3])
def test_shares_are_disjoint_cover_and_rebuild_the_global_batch(count):
    ds = build()
    whole = [b.tolist() for _ in range(2) for b in ds]
    shares = parts(count)
    for step, global_batch in enumerate(whole):
        joined = [row for p in range(count) for row in shares[p][step]]
        assert joined == global_batch  # in order, so also disjoint and covering
    every = sorted(r for p in range(count) for batch in shares[p][:3] for r in batch)
    assert every == list(range(N))


def test_global_batches_do_not_depend_on_the_process_count():
    joined = {
        count: [[r for p in range(count) for r in shares[p][s]] for s in range(6)]
        for count, shares in ((c, parts(c)) for c in (1, 2, 3))
    }
    assert joined[1] == joined[2] == joined[3]


def test_a_process_reads_only_its_rows():
    seen = []
    ds = build((1, 3), seen)
    got = [b.tolist() for b in ds]
    assert sorted(seen) == sorted(r for b in got for r in b)
    assert len(seen) == 3 + 3 + 3


def test_empty_shares_keep_shape_dtype_and_step_count():
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    batches = [
        list(Dataset.from_tensor_slices((x, np.arange(4))).batch(4).process_split(p, 5))
        for p in range(5)
    ]
    assert [len(b) for b in batches] == [1] * 5
    xs, ys = batches[4][0]
    assert xs.shape == (0, 2) and xs.dtype == np.float32 and ys.shape == (0,)
    # Mapped datasets keep the mapped structure for empty shares too.
    mapped = Dataset.from_tensor_slices(np.arange(4)).map(lambda v: {"v": v * 1.5}).batch(4)
    (empty,) = list(mapped.process_split(4, 5))
    assert empty["v"].shape == (0,) and empty["v"].dtype == np.float64


def test_split_keeps_batch_size_and_cardinality():
    ds = build((1, 2))
    assert ds.batch_size == BATCH and len(ds) == 3 and ds.split == (1, 2)


def test_defaults_to_the_jax_process():
    ds = build().process_split()
    assert ds.split == (jax.process_index(), jax.process_count())


@pytest.mark.parametrize(("index", "count"), [(2, 2), (-1, 2), (0, 0)])
def test_bad_split_arguments(index, count):
    with pytest.raises((ValueError, TypeError), match=r"must be|index"):
        build().process_split(index, count)


def test_split_needs_a_batch():
    with pytest.raises(ValueError, match="call batch"):
        Dataset.from_tensor_slices(np.arange(4)).process_split(0, 2)
