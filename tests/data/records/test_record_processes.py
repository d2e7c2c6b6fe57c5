"""`TFRecordDataset(files).map(fn, workers="process")`: uncompressed record files are read
by index in the stream's own order, so processes give the threads' batches, random ops
included, and resume exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
from record_files_helpers import write_shards

from phalanx import image
from phalanx._src.data.records import indexed
from phalanx.data import AUTOTUNE, TFRecordDataset


@pytest.mark.parametrize(
    "sizes, cycle",
    [([5, 3, 7], 1), ([5, 3, 7], 2), ([4, 0, 9, 1], 3), ([2, 6], 4), ([0, 0, 3], 2), ([], 2)],
)
def test_the_index_order_is_the_interleaved_stream_order(tmp_path, sizes, cycle):
    paths, contents = write_shards(tmp_path, len(sizes), sizes) if sizes else ([], [])
    every = [r for c in contents for r in c]
    order = indexed.interleave_order(sizes, cycle)
    streamed = list(TFRecordDataset(paths, num_parallel_reads=cycle)) if paths else []
    assert [every[i] for i in order] == streamed


def augment(record):
    """Reads the record, draws from the element's random stream (module level: picklable)."""
    pixels = np.frombuffer(record[:12].ljust(12, b"."), np.uint8).reshape(2, 2, 3)
    return image.random_flip_left_right(pixels), image.random_brightness(
        pixels.astype(np.float32), 40.0
    )


def pipeline(paths, **map_kwargs):
    return TFRecordDataset(paths, num_parallel_reads=2).map(augment, **map_kwargs).batch(5)


def test_processes_give_the_threads_batches_and_resume_exactly(tmp_path):
    paths, _ = write_shards(tmp_path, 3, [7, 4, 9])
    inline = list(pipeline(paths))
    np.testing.assert_equal(inline, list(pipeline(paths, num_parallel_calls=2)))
    workers = pipeline(paths, num_parallel_calls=2, workers="process")
    np.testing.assert_equal(inline, list(workers))
    np.testing.assert_equal(
        inline, list(pipeline(paths, num_parallel_calls=AUTOTUNE, workers="process"))
    )
    it = iter(workers)  # epoch 1: the same records, epoch 1's random streams
    head = [next(it) for _ in range(2)]
    state = json.loads(json.dumps(it.get_state()))
    rest = list(it)
    threads = pipeline(paths, num_parallel_calls=2)
    list(threads)  # its epoch 0
    np.testing.assert_equal(head + rest, list(threads))
    assert not all(np.array_equal(a[1], b[1]) for a, b in zip(inline, head, strict=False))
    restored = iter(pipeline(paths, num_parallel_calls=2, workers="process"))
    restored.set_state(state)
    np.testing.assert_equal(rest, list(restored))


def test_processes_need_uncompressed_records_right_before_the_map(tmp_path):
    paths, _ = write_shards(tmp_path, 2, 3, kind="GZIP")
    with pytest.raises(ValueError, match="GZIP-compressed TFRecord files"):
        TFRecordDataset(paths, compression_type="GZIP").map(augment, 2, workers="process")
    (tmp_path / "plain").mkdir()
    plain, _ = write_shards(tmp_path / "plain", 2, 3)
    filtered = TFRecordDataset(plain).filter(lambda r: len(r) > 0)
    with pytest.raises(ValueError, match=r"needs random access.*map in threads"):
        filtered.map(augment, 2, workers="process")
    threaded = TFRecordDataset(plain).map(augment, 2).batch(2)
    with pytest.raises(ValueError, match="Pass workers='process' to the map itself"):
        threaded.with_workers(2)
