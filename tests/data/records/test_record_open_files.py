"""Bounded open files: a pipeline over many record shards keeps at most
`Options().experimental_max_open_files` of them open (64 by default), in the main process
and in each worker process, and still reads every record in order."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
from record_files_helpers import write_shards

from phalanx._src.data.records.open_files import DEFAULT_LIMIT
from phalanx.data import Options, TFRecordDataset

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="reads /proc/*/fd")
SHARDS = 300


def open_shards(folder: Path, pid: int | str = "self") -> int:
    """How many of the files under `folder` process `pid` holds open."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        count += target.startswith(str(folder))
    return count


def limited(ds, limit):
    if limit is None:
        return ds
    options = Options()
    options.experimental_max_open_files = limit
    return ds.with_options(options)


def identity(record):
    return record  # module level: picklable for worker processes


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("many")
    paths, contents = write_shards(folder, SHARDS, 2)
    return folder, paths, sorted(r for c in contents for r in c)


@pytest.mark.parametrize("limit", [None, 8])
def test_a_shuffle_over_300_shards_keeps_few_files_open(shards, limit):
    folder, paths, every = shards
    ds = limited(TFRecordDataset(paths).shuffle(SHARDS * 2, seed=0), limit)
    most, got = 0, []
    for record in ds:
        got.append(record)
        most = max(most, open_shards(folder))
    assert sorted(got) == every
    assert 0 < most <= (limit or DEFAULT_LIMIT)
    assert open_shards(folder) <= (limit or DEFAULT_LIMIT)


def test_each_worker_process_keeps_few_files_open(shards):
    folder, paths, every = shards
    ds = TFRecordDataset(paths).shuffle(SHARDS * 2, seed=1).map(identity, 2, workers="process")
    ds = limited(ds, 8)
    it = iter(ds)
    most, got = 0, []
    for record in it:
        got.append(record)
        most = max([most, *(open_shards(folder, pid) for pid in it.worker_pids)])
    assert sorted(got) == every
    assert 0 < most <= 8


def test_a_cycle_wider_than_the_limit_reopens_files_where_they_were(shards):
    folder, paths, _ = shards
    wide = TFRecordDataset(paths[:40], num_parallel_reads=30)
    reference = list(limited(wide, 40))
    it = iter(limited(wide, 8))
    most, got = 0, []
    for record in it:
        got.append(record)
        most = max(most, open_shards(folder))
    assert got == reference and 0 < most <= 8


def test_compressed_files_wider_than_the_limit_are_refused(tmp_path):
    paths, _ = write_shards(tmp_path, 4, 2, "GZIP")
    ds = limited(TFRecordDataset(paths, "GZIP", num_parallel_reads=4), 2)
    with pytest.raises(ValueError, match=r"4 GZIP-compressed files open.*max_open_files = 4"):
        next(iter(ds))


def test_the_limit_is_an_int_of_at_least_one():
    options = Options()
    with pytest.raises(ValueError, match="experimental_max_open_files must be an int >= 1"):
        options.experimental_max_open_files = 0


def test_the_refusal_comes_alone_after_a_map(tmp_path):
    # The map's cursor opens the files' cursor; its failure leaves no other error behind.
    paths, _ = write_shards(tmp_path, 4, 2, "GZIP")
    ds = limited(TFRecordDataset(paths, "GZIP", num_parallel_reads=4).map(identity, 2), 2)
    with pytest.raises(ValueError, match="GZIP-compressed files open"):
        next(iter(ds))
    gc.collect()  # an error in the half-made cursor's __del__ would fail the test here
