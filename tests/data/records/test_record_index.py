"""`TFRecordDataset(files).shuffle(n)`: uncompressed files get random access through an
index of their records, so the shuffle is an exact global one and resumes by index."""

from __future__ import annotations

import os
import pickle
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from record_files_helpers import write_shards

from phalanx._src.data.records import index_cache, indexed, record_index
from phalanx.data import DataLossError, TFRecordDataset, TFRecordWriter


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


def _bytes_read() -> int:
    """Bytes this process has read through read()/pread() system calls, all threads."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def _big_shards(folder: Path, files: int, records: int, size: int) -> list[str]:
    paths = []
    for shard in range(files):
        paths.append(str(folder / f"big-{shard:05d}"))
        with TFRecordWriter(paths[-1]) as writer:
            for i in range(records):
                writer.write(bytes([shard, i % 256]) * (size // 2))
    return paths


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="counts reads in /proc/self/io")
def test_a_shuffle_reads_the_headers_not_the_data_before_its_first_element(tmp_path):
    # The pipeline: 16 files of 40 records of ~100 KB, shuffled.
    paths = _big_shards(tmp_path, 16, 40, 100_000)
    payload = 16 * 40 * 100_000
    next(iter(TFRecordDataset(paths[:1]).shuffle(40, seed=0)))  # imports, lazily made parts
    for run in ("the scan", "the cached index"):
        before = _bytes_read()
        ds = TFRecordDataset(paths).shuffle(640, seed=0)
        first = next(iter(ds))
        read = _bytes_read() - before
        assert len(first) == 100_000
        assert read <= 0.10 * payload, f"{run}: read {read} of {payload} payload bytes"
    before = _bytes_read()
    assert len(list(ds)) == 640
    assert _bytes_read() - before >= payload  # the count sees the data when it is read


def test_the_index_is_cached_and_a_stale_or_damaged_entry_never_serves_wrong_offsets(
    tmp_path, monkeypatch
):
    paths, contents = write_shards(tmp_path, 2, 6)
    every = sorted(r for c in contents for r in c)
    scans = []
    real_scan = record_index.scan_file
    monkeypatch.setattr(record_index, "scan_file", lambda p: scans.append(p) or real_scan(p))
    assert sorted(TFRecordDataset(paths).shuffle(12, seed=0)) == every
    assert sorted(scans) == paths
    assert sorted(TFRecordDataset(paths).shuffle(12, seed=0)) == every  # a new pipeline
    assert sorted(scans) == paths  # read from the cache
    # A damaged entry is ignored: the file is scanned again.
    entry = index_cache.key(paths[0]).entry
    blob = bytearray(entry.read_bytes())
    blob[-12] ^= 1  # an offset
    entry.write_bytes(bytes(blob))
    assert sorted(TFRecordDataset(paths).shuffle(12, seed=0)) == every
    assert sorted(scans) == sorted([*paths, paths[0]])
    # A file rewritten with other record lengths, but its size and mtime put back: the
    # entry's key matches, its offsets are stale, and reading says so.
    stat = Path(paths[1]).stat()
    records = contents[1]
    with TFRecordWriter(paths[1]) as writer:
        writer.write(records[0] + records[1][:3])
        writer.write(records[1][3:])
        for r in records[2:]:
            writer.write(r)
    assert Path(paths[1]).stat().st_size == stat.st_size
    os.utime(paths[1], ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(DataLossError, match="does not match the index"):
        list(TFRecordDataset(paths).shuffle(12, seed=0))


def test_no_cache_folder_means_a_scan_each_time(tmp_path, monkeypatch):
    paths, contents = write_shards(tmp_path, 1, 5)
    monkeypatch.setenv(index_cache.ENV, "0")
    assert index_cache.key(paths[0]) is None
    assert sorted(TFRecordDataset(paths).shuffle(5, seed=0)) == sorted(contents[0])


def test_files_are_scanned_in_threads_where_the_reads_wait(tmp_path, monkeypatch):
    paths, contents = write_shards(tmp_path, 12, 2)
    scanned_by = {}
    real_scan = record_index.scan_file

    def scan(path):
        time.sleep(0.01)  # a storage's latency: time without CPU
        scanned_by[path] = threading.current_thread().name
        return real_scan(path)

    monkeypatch.setattr(record_index, "scan_file", scan)
    assert sorted(TFRecordDataset(paths).shuffle(24, seed=0)) == sorted(
        r for c in contents for r in c
    )
    assert sorted(scanned_by) == paths
    threaded = [p for p, name in scanned_by.items() if name.startswith("phalanx-index")]
    assert 0 < len(threaded) < 12  # the first ones alone, timed; the others in threads
