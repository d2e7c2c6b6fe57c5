"""TFRecordDataset and TFRecordWriter without TensorFlow: round trips, order, state."""

from __future__ import annotations

import glob

import numpy as np
import pytest
from record_files_helpers import record, write_shards

from phalanx.data import AUTOTUNE, DataLossError, Dataset, TFRecordDataset, TFRecordWriter

KINDS = [None, "", "GZIP", "ZLIB"]


def interleave(contents: list[list[bytes]], cycle: int) -> list[bytes]:
    """tf.data's interleave order (block length 1), written out independently."""
    pending = [list(c) for c in contents]
    slots: list[list[bytes] | None] = [None] * cycle
    out, i = [], 0
    while pending or any(s is not None for s in slots):
        if slots[i] is None and pending:
            slots[i] = pending.pop(0)
        if slots[i] is not None:
            if slots[i]:
                out.append(slots[i].pop(0))
                i = (i + 1) % cycle
                continue
            slots[i] = None
        i = (i + 1) % cycle
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_in_file_order(tmp_path, kind):
    paths, contents = write_shards(tmp_path, 3, [5, 0, 12], kind)
    got = list(TFRecordDataset(paths, compression_type=kind))
    assert got == [r for c in contents for r in c]
    assert all(type(r) is bytes for r in got)


@pytest.mark.parametrize("kind", ["", "GZIP"])
@pytest.mark.parametrize("reads", [2, 3, 5])
def test_num_parallel_reads_interleaves_one_record_per_file(tmp_path, kind, reads):
    paths, contents = write_shards(tmp_path, 4, [3, 7, 1, 5], kind)
    got = list(TFRecordDataset(paths, kind, num_parallel_reads=reads))
    assert got == interleave(contents, reads)
    assert sorted(got) == sorted(r for c in contents for r in c)


def test_autotune_reads_every_record(tmp_path):
    paths, contents = write_shards(tmp_path, 3, 4)
    got = list(TFRecordDataset(paths, num_parallel_reads=AUTOTUNE))
    assert sorted(got) == sorted(r for c in contents for r in c)


def test_file_names_as_a_path_a_glob_result_an_array_or_a_dataset(tmp_path):
    paths, contents = write_shards(tmp_path, 2, 3)
    every = [r for c in contents for r in c]
    assert list(TFRecordDataset(paths[0])) == contents[0]
    assert list(TFRecordDataset(sorted(glob.glob(str(tmp_path / "train-*"))))) == every
    assert list(TFRecordDataset(np.array(paths))) == every
    assert list(TFRecordDataset(Dataset.from_tensor_slices(np.array(paths)))) == every
    assert list(TFRecordDataset([p.encode() for p in paths], buffer_size=7)) == every


def test_iterating_again_is_a_new_epoch_with_the_same_records(tmp_path):
    paths, _ = write_shards(tmp_path, 2, 4)
    ds = TFRecordDataset(paths, num_parallel_reads=2)
    assert list(ds) == list(ds)


@pytest.mark.parametrize("kind", ["", "ZLIB"])
def test_state_resumes_at_the_next_record_bitwise(tmp_path, kind):
    paths, _ = write_shards(tmp_path, 3, [6, 9, 4], kind)
    ds = TFRecordDataset(paths, kind, num_parallel_reads=2).batch(4)
    expected = [b.tolist() for b in ds]
    for stop in range(len(expected)):
        it = iter(ds)
        head = [next(it).tolist() for _ in range(stop)]
        state = it.get_state()
        if stop:
            assert "slots" in state["cursor"]["parent"]  # files and byte offsets
        resumed = iter(ds)
        resumed.set_state(state)
        assert head + [b.tolist() for b in resumed] == expected


def test_state_names_files_and_byte_offsets(tmp_path):
    paths, contents = write_shards(tmp_path, 1, 3)
    it = iter(TFRecordDataset(paths))
    next(it)
    state = it.get_state()["cursor"]
    assert state["slots"] == [[0, 16 + len(contents[0][0])]]


def test_map_parse_and_batch_after_the_reader(tmp_path):
    path = str(tmp_path / "numbers")
    with TFRecordWriter(path) as writer:
        for i in range(10):
            writer.write(np.int64(i).tobytes())
    ds = TFRecordDataset([path]).map(lambda r: np.frombuffer(r, np.int64)[0]).batch(4)
    assert [b.tolist() for b in ds] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_large_records_cross_buffer_boundaries(tmp_path):
    path = str(tmp_path / "big")
    big = [bytes(np.random.default_rng(i).integers(0, 256, 300_000, np.uint8)) for i in range(3)]
    with TFRecordWriter(path, "GZIP") as writer:
        for r in big:
            writer.write(r)
    assert list(TFRecordDataset(path, "GZIP", buffer_size=1000)) == big


def test_bad_arguments_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="compression_type"):
        TFRecordDataset([], compression_type="LZ4")
    with pytest.raises(ValueError, match="num_parallel_reads"):
        TFRecordDataset([], num_parallel_reads=0)
    with pytest.raises(ValueError, match="glob"):
        TFRecordDataset(str(tmp_path / "train-*"))
    with pytest.raises(TypeError, match="file name"):
        TFRecordDataset([3])
    with pytest.raises(FileNotFoundError, match="missing"):
        list(TFRecordDataset([str(tmp_path / "missing")]))
    writer = TFRecordWriter(tmp_path / "w")
    with pytest.raises(TypeError, match="bytes"):
        writer.write("text")
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer.write(b"x")


def test_an_empty_list_of_files_is_an_empty_dataset():
    assert list(TFRecordDataset([])) == []


def test_writer_flush_makes_records_readable_before_close(tmp_path):
    for kind in ["", "ZLIB"]:
        path = str(tmp_path / f"f{kind}")
        writer = TFRecordWriter(path, kind)
        writer.write(record(0, 1))
        writer.flush()
        writer.close()
        assert list(TFRecordDataset(path, kind)) == [record(0, 1)]


def test_the_dataset_chains_like_any_other(tmp_path):
    paths, contents = write_shards(tmp_path, 2, 5)
    every = [r for c in contents for r in c]
    ds = TFRecordDataset(paths)
    assert isinstance(ds, Dataset)
    assert list(ds.prefetch(2)) == every
    assert list(ds.take(3)) == every[:3]
    assert list(ds.skip(8)) == every[8:]
    assert [r for r in ds.filter(lambda r: len(r) > 100)] == [r for r in every if len(r) > 100]


def test_a_state_past_the_end_of_a_file_is_an_error_not_a_short_epoch(tmp_path):
    (path,), _ = write_shards(tmp_path, 1, 3)
    ds = TFRecordDataset(path)
    it = iter(ds)
    next(it)
    state = it.get_state()
    state["cursor"]["slots"] = [[0, 10**6]]  # as if the file had shrunk since the save
    resumed = iter(ds)
    resumed.set_state(state)
    with pytest.raises(DataLossError, match="cannot resume there"):
        next(resumed)
