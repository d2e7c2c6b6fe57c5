"""Record files over processes (`process_split`, as fit and experimental_distribute_dataset
apply it): by file, by record, or not at all; disjoint, complete, resumable, and reading
from disk only the process's share."""

from __future__ import annotations

import numpy as np
import pytest
from record_files_helpers import write_shards

from phalanx._src.data.records import record_files
from phalanx.data import Options, TFRecordDataset
from phalanx.data.experimental import AutoShardPolicy

BATCH = 4


def pipeline(paths, policy=None, reads=None, batch=BATCH, fn=None):
    ds = TFRecordDataset(paths, num_parallel_reads=reads)
    if fn is not None:
        ds = ds.map(fn)
    if policy is not None:
        options = Options()
        options.experimental_distribute.auto_shard_policy = policy
        ds = ds.with_options(options)
    return ds.batch(batch)


def rows(ds) -> list[list[bytes]]:
    return [b.tolist() for b in ds]


@pytest.fixture
def opened(monkeypatch):
    """The files each RecordReader opens, and how many record payloads it reads."""
    log = {"files": [], "payloads": 0}
    base = record_files.RecordReader

    class Counting(base):
        def __init__(self, path, *args):
            log["files"].append(path)
            super().__init__(path, *args)

        def read(self):
            data = super().read()
            log["payloads"] += data is not None
            return data

    monkeypatch.setattr(record_files, "RecordReader", Counting)
    return log


@pytest.mark.parametrize("reads", [None, 3])
def test_by_file_each_process_opens_only_its_files(tmp_path, opened, reads):
    paths, contents = write_shards(tmp_path, 8, 5)
    shares = []
    for index in range(2):
        opened["files"].clear()
        ds = pipeline(paths, reads=reads).process_split(index, 2)
        assert (ds.batch_size, ds.split) == (BATCH, (index, 2))  # the global batch, split
        batches = rows(ds)
        assert {len(b) for b in batches} == {BATCH // 2}  # 20 records: 10 batches of 2
        assert sorted(set(opened["files"])) == paths[index::2]
        shares.append([r for b in batches for r in b])
    assert not set(shares[0]) & set(shares[1])
    every = [r for c in contents for r in c]
    assert sorted(shares[0] + shares[1]) == sorted(every)
    # As tf.data's FILE sharding: the file list is sharded, then read as before.
    for index, share in enumerate(shares):
        assert share == interleaved(contents[index::2], reads or 1)


def interleaved(files: list[list[bytes]], cycle: int) -> list[bytes]:
    """tf.data's TFRecordDataset order over `files`, written out: `cycle` open files give
    one record each in turn; an exhausted file's slot takes the next file when its turn
    comes back (test_records_vs_tensorflow checks the reader against TF itself)."""
    pending, slots, out, turn = list(files), [None] * cycle, [], 0
    while pending or any(slot is not None for slot in slots):
        if slots[turn] is None and pending:
            slots[turn] = iter(pending.pop(0))
        if slots[turn] is not None:
            record = next(slots[turn], None)
            if record is None:
                slots[turn] = None
            else:
                out.append(record)
        turn = (turn + 1) % cycle
    return out


def test_by_record_blocks_make_the_global_batches_of_one_process(tmp_path, opened):
    paths, contents = write_shards(tmp_path, 1, 17)
    whole = rows(pipeline(paths))
    parts = []
    for index in range(2):
        opened["payloads"] = 0
        parts.append(rows(pipeline(paths).process_split(index, 2)))
        # Only its records' data is read; the others' lengths are skipped over.
        assert opened["payloads"] == sum(len(b) for b in parts[-1])
    for k, batch in enumerate(whole[:-1]):  # every full global batch, side by side
        assert parts[0][k] + parts[1][k] == batch
    flat = [r for p in parts for b in p for r in b]
    assert sorted(flat) == sorted(contents[0]) and len(set(flat)) == len(flat)


def test_data_policy_shards_by_record_even_with_many_files(tmp_path):
    paths, _ = write_shards(tmp_path, 4, 3)
    a = rows(pipeline(paths, AutoShardPolicy.DATA).process_split(0, 2))
    b = rows(pipeline(paths, AutoShardPolicy.DATA).process_split(1, 2))
    assert [x + y for x, y in zip(a, b, strict=True)] == rows(pipeline(paths))


def test_off_reads_everything_and_keeps_its_rows_of_each_global_batch(tmp_path, opened):
    paths, _ = write_shards(tmp_path, 4, 3)
    whole = rows(pipeline(paths))
    opened["files"].clear()
    part = rows(pipeline(paths, AutoShardPolicy.OFF).process_split(1, 2))
    assert part == [b[2:] for b in whole]
    assert sorted(set(opened["files"])) == paths


def test_file_policy_with_fewer_files_than_processes_is_refused(tmp_path):
    paths, _ = write_shards(tmp_path, 1, 3)
    with pytest.raises(ValueError, match="at least as many files"):
        pipeline(paths, AutoShardPolicy.FILE).process_split(0, 2)


def test_a_global_batch_that_does_not_divide_is_refused(tmp_path):
    paths, _ = write_shards(tmp_path, 4, 3)
    with pytest.raises(ValueError, match=r"5 records does not split over 2.*-> 6"):
        pipeline(paths, batch=5).process_split(0, 2)


def test_splitting_twice_is_splitting_once(tmp_path):
    paths, _ = write_shards(tmp_path, 4, 3)
    once = pipeline(paths).process_split(1, 2)
    assert rows(once.process_split(1, 2)) == rows(once)


@pytest.mark.parametrize("files", [8, 1])
def test_each_share_resumes_mid_epoch_bitwise(tmp_path, files):
    paths, _ = write_shards(tmp_path, files, 24 // files)
    for index in range(2):
        ds = pipeline(paths, reads=2, fn=lambda r: np.frombuffer(r.ljust(8), np.uint8)[:8])
        ds = ds.process_split(index, 2)
        expected = [b.tobytes() for b in ds]
        it = iter(ds)
        head = [next(it).tobytes() for _ in range(3)]
        state = it.get_state()
        resumed = iter(ds)
        resumed.set_state(state)
        assert head + [b.tobytes() for b in resumed] == expected
