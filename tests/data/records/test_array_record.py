"""ArrayRecordDataset: random access, an exact global shuffle, exact resume, and each
process reading only its rows."""

from __future__ import annotations

import numpy as np
import pytest

from phalanx._src.data.records import array_record
from phalanx.data import ArrayRecordDataset

pytest.importorskip("array_record", reason="ArrayRecord files need the array_record package")


def write(folder, files: int = 3, per_file: int = 7) -> tuple[list[str], list[bytes]]:
    from array_record.python.array_record_module import ArrayRecordWriter

    paths, records = [], []
    for f in range(files):
        path = str(folder / f"data-{f:03d}.array_record")
        writer = ArrayRecordWriter(path, "group_size:1")
        for i in range(per_file):
            record = f"{f}/{i}".encode() * (i + 1)
            writer.write(record)
            records.append(record)
        writer.close()
        paths.append(path)
    return paths, records


def test_reads_every_record_in_file_order(tmp_path):
    paths, records = write(tmp_path)
    ds = ArrayRecordDataset(paths)
    assert len(ds) == len(records)
    assert list(ds) == records


def test_shuffle_is_a_permutation_per_epoch_from_the_seed(tmp_path):
    paths, records = write(tmp_path)
    ds = ArrayRecordDataset(paths).shuffle(len(records), seed=3)
    first, second = list(ds), list(ds)
    expected = [records[i] for i in np.random.default_rng((3, 1, 0, 0)).permutation(21)]
    assert first == expected  # Shuffle's documented stream: rng(seed, len(key), epoch, block)
    assert sorted(first) == sorted(records) == sorted(second) and first != second
    again = ArrayRecordDataset(paths).shuffle(len(records), seed=3)
    assert list(again) == first


def test_the_iterator_resumes_exactly_by_index(tmp_path):
    paths, _ = write(tmp_path)

    def build():
        return ArrayRecordDataset(paths).shuffle(21, seed=0).map(lambda r: r + b"!").batch(4)

    reference = build()
    epochs = [[b.tolist() for b in reference] for _ in range(2)]
    ds = build()
    list(ds)  # epoch 0
    it = iter(ds)  # epoch 1
    head = [next(it).tolist() for _ in range(2)]
    state = it.get_state()
    assert (state["epoch"], state["step"]) == (1, 2)
    resumed = iter(build())
    resumed.set_state(state)
    assert head + [b.tolist() for b in resumed] == epochs[1] != epochs[0]
    # Over other files the record numbers mean other records: an error naming it.
    other = iter(ArrayRecordDataset(paths[:2]).shuffle(21, seed=0).map(lambda r: r).batch(4))
    with pytest.raises(ValueError, match=r"the number of record files \(3 -> 2\)"):
        other.set_state(state)


def test_each_process_reads_only_its_rows(tmp_path, monkeypatch):
    paths, _ = write(tmp_path)
    asked: list[int] = []
    ds = ArrayRecordDataset(paths)
    real = array_record.ArrayRecordSource.get

    def get(self, key, positions):
        asked.extend(int(p) for p in positions)
        return real(self, key, positions)

    monkeypatch.setattr(array_record.ArrayRecordSource, "get", get)
    whole = [b.tolist() for b in ds.batch(8)]
    asked.clear()
    part = [b.tolist() for b in ds.batch(8).process_split(1, 2)]
    assert part == [b[4:] for b in whole[:2]] + [whole[2][3:]]
    assert sorted(asked) == [4, 5, 6, 7, 12, 13, 14, 15, 19, 20]


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        ArrayRecordDataset([str(tmp_path / "nope.array_record")])


def test_the_source_pickles_for_worker_processes(tmp_path):
    import pickle

    paths, records = write(tmp_path, 1, 3)
    node = pickle.loads(pickle.dumps(array_record.ArrayRecordSource(tuple(paths))))
    assert node.get((0,), np.array([2, 0])).tolist() == [records[2], records[0]]


def test_the_dataset_chains_like_any_other(tmp_path):
    paths, records = write(tmp_path, 2, 4)
    ds = ArrayRecordDataset(paths)
    assert list(ds.prefetch(2)) == records
    assert [b.tolist() for b in ds.batch(3)] == [records[:3], records[3:6], records[6:]]
