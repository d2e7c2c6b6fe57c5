"""Records/s of reading and parsing record files (a script, not a test).

    python benchmarks/bench_records.py                       # 20000 records, 5 rounds
    python benchmarks/bench_records.py --records 100000 --image-kb 110 --rounds 3
    python benchmarks/bench_records.py --index-only --rounds 3   # the index rows alone

ImageNet-shaped tf.train.Examples (an `--image-kb` JPEG-sized random payload, its format,
height, width, an int64 label, a text and 4 float bounding-box coordinates) are written to 8
TFRecord shards and to 8 ArrayRecord files, then read back and parsed into NumPy dicts by:

- phalanx: `TFRecordDataset(files).map(lambda r: parse_single_example(r, spec))`, also
  with `num_parallel_reads=4`, batched first and parsed with `parse_example` (256 records
  a call), globally shuffled (`.shuffle(10_000)`: the files are indexed anew each
  round, so this is a first epoch), and the reader alone;
- tf.data (when TensorFlow is importable): `tf.data.TFRecordDataset(files)
  .map(lambda r: tf.io.parse_single_example(r, spec))` iterated with
  `as_numpy_iterator()`, the same over 4 parallel reads, batched first and parsed with
  `tf.io.parse_example`, and its reader alone;
- ArrayRecord: phalanx's `ArrayRecordDataset(files).map(parse)` and Grain's
  `MapDataset.source(ArrayRecordDataSource(files)).map(parse)` (same parse function).

Every variant reads every record once per round; rounds interleave the variants (so a noisy
neighbour slows all of them alike) and the table shows the best round of each. Every
variant's record count and label sum are checked against the written ones: a pipeline that
drops or mangles records fails instead of looking fast.

A second table gives the cost of indexing ImageNet's layout for a shuffle: `--index-shards`
(1,024) files of `--index-records` (1,251) records, the time to the first element of
`TFRecordDataset(files).shuffle(10_000, seed=0)`: a first run (the headers scanned into an
empty index cache; one file at a time here, since the files are in the page cache and
the reads do not wait), the same scan forced into 8 threads (what threads cost where the
reads do not wait), and a second run (the index read from the cache). The records are
small (64 bytes: the scan reads headers only, so the record size changes only what a cold
disk seeks over); the files are in the page cache, as on a host that has read them once.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable

import numpy as np

from phalanx import data

SHARDS = 8
BATCH = 256
SPEC = {
    "image/encoded": data.FixedLenFeature([], data.string),
    "image/format": data.FixedLenFeature([], data.string),
    "image/height": data.FixedLenFeature([], np.int64),
    "image/width": data.FixedLenFeature([], np.int64),
    "image/class/label": data.FixedLenFeature([], np.int64),
    "image/class/text": data.FixedLenFeature([], data.string),
    "image/object/bbox": data.VarLenFeature(np.float32),
}


def write_files(folder: str, records: int, image_kb: float) -> tuple[list[str], list[str], int]:
    """Writes the shards; returns (TFRecord paths, ArrayRecord paths, label sum)."""
    from array_record.python.array_record_module import ArrayRecordWriter

    rng = np.random.default_rng(0)
    size = int(image_kb * 1024)
    tfrecords = [os.path.join(folder, f"train-{s:05d}-of-{SHARDS:05d}") for s in range(SHARDS)]
    arrays = [p + ".array_record" for p in tfrecords]
    writers = [data.TFRecordWriter(p) for p in tfrecords]
    array_writers = [ArrayRecordWriter(p, "group_size:1") for p in arrays]
    labels = rng.integers(0, 1000, records)
    for i, label in enumerate(labels):
        record = data.make_example(
            {
                "image/encoded": rng.bytes(size),
                "image/format": b"JPEG",
                "image/height": 224,
                "image/width": 224,
                "image/class/label": int(label),
                "image/class/text": f"class {label}",
                "image/object/bbox": rng.random(4, np.float32),
            }
        )
        writers[i % SHARDS].write(record)
        array_writers[i % SHARDS].write(record)
    for writer in writers:
        writer.close()
    for writer in array_writers:
        writer.close()
    return tfrecords, arrays, int(labels.sum())


def parse(record: bytes) -> dict:
    return data.parse_single_example(record, SPEC)


def parse_batch(records) -> dict:
    return data.parse_example(records, SPEC)


def phalanx_variants(tfrecords: list[str], arrays: list[str]) -> dict[str, Callable[[], Iterable]]:
    return {
        "phalanx TFRecordDataset + parse": lambda: data.TFRecordDataset(tfrecords).map(parse),
        "phalanx, num_parallel_reads=4": lambda: data.TFRecordDataset(
            tfrecords, num_parallel_reads=4
        ).map(parse),
        "phalanx shuffle + parse": lambda: (
            data.TFRecordDataset(tfrecords).shuffle(10_000, seed=0).map(parse)
        ),
        "phalanx reader alone": lambda: data.TFRecordDataset(tfrecords),
        "phalanx batch(256) + parse_example": lambda: (
            data.TFRecordDataset(tfrecords).batch(BATCH).map(parse_batch)
        ),
        "phalanx ArrayRecordDataset + parse": lambda: data.ArrayRecordDataset(arrays).map(parse),
    }


def grain_variant(arrays: list[str]) -> dict[str, Callable[[], Iterable]]:
    import grain

    def build() -> Iterable:
        source = grain.sources.ArrayRecordDataSource(arrays)
        return grain.MapDataset.source(source).map(parse).to_iter_dataset()

    return {"Grain ArrayRecordDataSource + parse": build}


def tf_variants(tfrecords: list[str]) -> dict[str, Callable[[], Iterable]]:
    try:
        import tensorflow as tf
    except ImportError:
        print("TensorFlow is not importable: the tf.data rows are left out.")
        return {}
    spec = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/format": tf.io.FixedLenFeature([], tf.string),
        "image/height": tf.io.FixedLenFeature([], tf.int64),
        "image/width": tf.io.FixedLenFeature([], tf.int64),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
        "image/class/text": tf.io.FixedLenFeature([], tf.string),
        "image/object/bbox": tf.io.VarLenFeature(tf.float32),
    }

    def parse_tf(record):  # a SparseTensor does not leave as_numpy_iterator as NumPy parts
        out = tf.io.parse_single_example(record, spec)
        box = out.pop("image/object/bbox")
        out["bbox_values"], out["bbox_indices"] = box.values, box.indices
        return out

    def parse_tf_batch(records):
        out = tf.io.parse_example(records, spec)
        box = out.pop("image/object/bbox")
        out["bbox_values"], out["bbox_indices"] = box.values, box.indices
        return out

    def build(reads: int | None, parsed: bool) -> Iterable:
        ds = tf.data.TFRecordDataset(tfrecords, num_parallel_reads=reads)
        return (ds.map(parse_tf) if parsed else ds).as_numpy_iterator()

    def batched() -> Iterable:
        ds = tf.data.TFRecordDataset(tfrecords).batch(BATCH).map(parse_tf_batch)
        return ds.as_numpy_iterator()

    return {
        "tf.data TFRecordDataset + parse": lambda: build(None, True),
        "tf.data, num_parallel_reads=4": lambda: build(4, True),
        "tf.data reader alone": lambda: build(None, False),
        "tf.data batch(256) + parse_example": batched,
    }


def count(pipeline: Iterable) -> tuple[int, int]:
    """(records, label sum) of one pass (of records, or of batches of them)."""
    n = total = 0
    for element in pipeline:
        if not isinstance(element, dict):
            n += 1
            continue
        labels = np.asarray(element["image/class/label"])
        n += labels.size
        total += int(labels.sum())
    return n, total


def write_index_shards(folder: str, shards: int, records: int) -> list[str]:
    """`shards` TFRecord files of `records` records of 64 bytes each."""
    framed = b""
    with data.TFRecordWriter(os.path.join(folder, "one")) as writer:
        writer.write(bytes(range(64)))
    with open(os.path.join(folder, "one"), "rb") as f:
        framed = f.read()
    paths = [os.path.join(folder, f"train-{s:05d}-of-{shards:05d}") for s in range(shards)]
    for path in paths:
        with open(path, "wb") as f:
            f.write(framed * records)
    return paths


def first_element_seconds(paths: list[str], cache: str) -> float:
    """Seconds to the first element of a shuffle over `paths`, with the index cache folder
    `cache` (empty: the headers are scanned; filled: the index is read back)."""
    from phalanx._src.data.records import index_cache

    saved = os.environ.get(index_cache.ENV)
    os.environ[index_cache.ENV] = cache
    try:
        began = time.perf_counter()
        next(iter(data.TFRecordDataset(paths).shuffle(10_000, seed=0)))
        return time.perf_counter() - began
    finally:
        if saved is None:
            del os.environ[index_cache.ENV]
        else:
            os.environ[index_cache.ENV] = saved


def threaded_scan_seconds(paths: list[str], threads: int) -> float:
    """Seconds to scan every file's headers `threads` files at a time (no cache): what the
    scan would cost if it always used threads."""
    from concurrent.futures import ThreadPoolExecutor

    from phalanx._src.data.records import record_index

    began = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(record_index.scan_file, paths))
    return time.perf_counter() - began


def index_table(shards: int, records: int, rounds: int) -> None:
    names = (
        "first run: the headers scanned (phalanx's choice)",
        "the same scan, 8 files at a time in threads",
        "second run: the cached index",
    )
    best = dict.fromkeys(names, math.inf)
    with tempfile.TemporaryDirectory() as folder:
        os.mkdir(os.path.join(folder, "data"))
        paths = write_index_shards(os.path.join(folder, "data"), shards, records)
        for round_ in range(rounds):
            cache = os.path.join(folder, f"cache-{round_}")
            seconds = (
                first_element_seconds(paths, cache),
                threaded_scan_seconds(paths, 8),
                first_element_seconds(paths, cache),
            )
            for name, value in zip(names, seconds, strict=True):
                best[name] = min(best[name], value)
    total = shards * records
    print(
        f"\n## Indexing {shards} shards of {records} records ({total} records) for a shuffle, "
        f"best of {rounds} interleaved rounds"
    )
    print(f"{'time to the first element of a shuffle':<52} {'seconds':>8} {'us/record':>10}")
    for name, value in best.items():
        print(f"{name:<52} {value:>8.2f} {value / total * 1e6:>10.2f}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--image-kb", type=float, default=8.0, help="payload size per record")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--index-shards", type=int, default=1024)
    parser.add_argument("--index-records", type=int, default=1251, help="records per shard")
    parser.add_argument("--index-only", action="store_true", help="only the index table")
    args = parser.parse_args(argv)
    if args.index_only:
        index_table(args.index_shards, args.index_records, args.rounds)
        return 0

    with tempfile.TemporaryDirectory() as folder:
        tfrecords, arrays, label_sum = write_files(folder, args.records, args.image_kb)
        variants = {
            **phalanx_variants(tfrecords, arrays),
            **grain_variant(arrays),
            **tf_variants(tfrecords),
        }
        best = dict.fromkeys(variants, 0.0)
        for _ in range(args.rounds):
            for name, build in variants.items():
                began = time.perf_counter()
                n, total = count(build())
                seconds = time.perf_counter() - began
                if n != args.records or (total != label_sum and "alone" not in name):
                    raise SystemExit(
                        f"{name}: read {n} records with label sum {total}, expected "
                        f"{args.records} and {label_sum}"
                    )
                best[name] = max(best[name], n / seconds)

    mb = args.records * args.image_kb / 1024
    print(
        f"\n## {args.records} records of ~{args.image_kb:g} KiB ({mb:.0f} MiB) in {SHARDS} "
        f"files, best of {args.rounds} interleaved rounds"
    )
    reference = best.get("tf.data TFRecordDataset + parse")
    print(f"{'pipeline':<38} {'records/s':>10} {'MiB/s':>8} {'vs tf.data':>10}")
    for name, rate in best.items():
        ratio = f"{rate / reference:.2f}" if reference else "-"
        print(f"{name:<38} {rate:>10.0f} {rate * args.image_kb / 1024:>8.1f} {ratio:>10}")
    index_table(args.index_shards, args.index_records, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
