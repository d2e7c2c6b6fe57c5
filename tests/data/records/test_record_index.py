"""`TFRecordDataset(files).shuffle(n)`: uncompressed files get random access through an
index of their records, so the shuffle is an exact global one and resumes by index."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from record_files_helpers import write_shards

from phalanx._src.data.records import indexed, record_index
from phalanx.data import DataLossError, TFRecordDataset


def test_shuffle_is_a_global_permutation_per_epoch(tmp_path):
    paths, contents = write_shards(tmp_path, 3, [4, 0, 9])
    every = [r for c in contents for r in c]
    ds = TFRecordDataset(paths).shuffle(5, seed=7)
    first, second = list(ds), list(ds)
    # Shuffle's documented permutation stream: rng((seed, len(key), epoch, block)).
    for epoch, got in enumerate((first, second)):
        order = np.random.default_rng((7, 1, epoch, 0)).permutation(len(every))
        assert got == [every[i] for i in order]
    assert first != second
    assert list(TFRecordDataset(paths).shuffle(5, seed=7, reshuffle_each_iteration=False)) == [
        every[i] for i in np.random.default_rng((7, 0, 0)).permutation(len(every))
    ]


def test_the_shuffled_iterator_resumes_exactly(tmp_path):
    paths, _ = write_shards(tmp_path, 2, 11)

    def build():
        return TFRecordDataset(paths).shuffle(100, seed=1).map(lambda r: r[:6]).batch(4)

    reference = [b.tolist() for b in build()]
    it = iter(build())
    head = [next(it).tolist() for _ in range(3)]
    state = it.get_state()
    resumed = iter(build())
    resumed.set_state(state)
    assert head + [b.tolist() for b in resumed] == reference


def test_files_are_scanned_once_and_each_process_reads_only_its_rows(tmp_path, monkeypatch):
    paths, _ = write_shards(tmp_path, 2, 6)
    scans, reads = [], []
    real_scan, real_pread = record_index.scan_file, indexed.os.pread
    monkeypatch.setattr(record_index, "scan_file", lambda p: scans.append(p) or real_scan(p))
    monkeypatch.setattr(
        indexed.os, "pread", lambda fd, n, at: reads.append(at) or real_pread(fd, n, at)
    )
    ds = TFRecordDataset(paths).shuffle(12, seed=0).batch(4)
    whole = [b.tolist() for b in ds]
    assert sorted(scans) == paths  # scanned in parallel, once each
    reads.clear()
    part = [b.tolist() for b in ds.process_split(0, 2)]
    assert len(reads) == 6  # rows 0-1 of each of the 3 global batches
    assert [len(b) for b in part] == [2, 2, 2]
    assert {r for b in part for r in b} <= {r for b in whole for r in b}
    assert sorted(scans) == paths  # the split pipeline shares the index


def test_compressed_files_cannot_be_shuffled_and_say_why():
    with pytest.raises(ValueError, match=r"GZIP-compressed TFRecord files.*ArrayRecord"):
        TFRecordDataset(["unused"], "GZIP").shuffle(10)


def test_damage_is_found_by_the_index_and_by_the_read(tmp_path):
    (path,), (records,) = write_shards(tmp_path, 1, 5)
    data = bytearray(Path(path).read_bytes())
    second = 16 + len(records[0])
    data[second + 2] ^= 1  # record 1's length
    Path(path).write_bytes(data)
    with pytest.raises(DataLossError, match=f"byte offset {second} in"):
        list(TFRecordDataset(path).shuffle(5, seed=0))
    data[second + 2] ^= 1
    data[second + 13] ^= 1  # record 1's data
    Path(path).write_bytes(data)
    with pytest.raises(DataLossError, match=f"byte offset {second} .*checksum of the data"):
        list(TFRecordDataset(path).shuffle(5, seed=0))


def test_the_node_pickles_for_worker_processes(tmp_path):
    paths, contents = write_shards(tmp_path, 2, 3)
    node = indexed.IndexedRecords(tuple(paths))
    assert node.length == 6
    copy = pickle.loads(pickle.dumps(node))
    assert copy.get((0,), np.array([5, 0])).tolist() == [contents[1][2], contents[0][0]]
