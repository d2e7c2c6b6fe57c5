"""The ImageNet pipeline's later epochs from a snapshot of its decoded uint8 crops, against
computing them again (a script, not a test).

    python benchmarks/bench_snapshot.py                        # 512 images, 3 rounds
    python benchmarks/bench_snapshot.py --images 1024 --rounds 3 --workers 2

Writes --images JPEGs (500x375, ~45 KiB; bench_imagenet_input.py's generator, nothing
downloaded) as tf.train.Examples into 8 TFRecord files, then times epochs of the uint8
ResNet pipeline (TFRecordDataset -> map(parse + decode_random_resized_crop to 224x224,
--workers threads) -> batch 64) in one process:

- recompute: every epoch parses and decodes every JPEG again;
- snapshot, first pass: the same with `.snapshot(dir)` before `batch`: decoded and written;
- snapshot, later epoch: the same Dataset object's next epochs, read from the snapshot;
- snapshot, next run: the pipeline built afresh (as a restarted job builds it): its
  fingerprint finds the published snapshot, and it reads;
- load + shuffle: `Dataset.load` of the snapshot's directory, shuffled (random access);
- tf.data (when TensorFlow is installed): TF's official ResNet preprocessing with a uint8
  output (as phalanx's), recomputed, and its `snapshot` read back, on a private thread
  pool of --workers threads.

Recompute and read epochs are interleaved round by round (a busy neighbour hits each
alike); the table shows the best round's images per wall second and per CPU second (all of
this process's threads) and the ratio to recomputing. The snapshot lives in a temporary
directory, so reads come from the page cache after the first pass: the second epoch of a
host whose RAM holds the crops (150 KiB each), the case the snapshot is for.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_imagenet_input import (  # noqa: E402
    BATCH,
    epoch_rate,
    make_jpegs,
    preprocess,
    write_files,
)

from phalanx import data  # noqa: E402


def recompute(paths: list[str], workers: int) -> data.Dataset:
    ds = data.TFRecordDataset(paths, num_parallel_reads=min(len(paths), 4))
    return ds.map(preprocess, num_parallel_calls=workers or data.AUTOTUNE).batch(BATCH)


def snapshotted(paths: list[str], workers: int, root: str) -> data.Dataset:
    ds = data.TFRecordDataset(paths, num_parallel_reads=min(len(paths), 4))
    ds = ds.map(preprocess, num_parallel_calls=workers or data.AUTOTUNE)
    return ds.snapshot(root).batch(BATCH)


def tf_pipeline(paths: list[str], workers: int, root: str | None):
    """TF's ResNet training preprocessing (bench_imagenet_input's), uint8 out, with a
    snapshot before the batch when `root` is given."""
    import tensorflow as tf

    def parse_and_preprocess(record):
        features = {
            "image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64),
        }
        parsed = tf.io.parse_single_example(record, features)
        contents = parsed["image/encoded"]
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            tf.image.extract_jpeg_shape(contents),
            bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4]),
            min_object_covered=0.1,
            aspect_ratio_range=[0.75, 1.33],
            area_range=[0.05, 1.0],
            max_attempts=100,
            use_image_if_no_bounding_boxes=True,
        )
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        cropped = tf.image.decode_and_crop_jpeg(contents, window, channels=3)
        flipped = tf.image.random_flip_left_right(cropped)
        resized = tf.image.resize(flipped, (224, 224), method=tf.image.ResizeMethod.BILINEAR)
        return tf.cast(tf.round(resized), tf.uint8), parsed["image/class/label"]

    calls = tf.data.AUTOTUNE if workers == 0 else workers
    ds = tf.data.TFRecordDataset(paths, num_parallel_reads=min(len(paths), 4))
    ds = ds.map(parse_and_preprocess, num_parallel_calls=calls)
    if root is not None:
        ds = ds.snapshot(root, compression=None)
    ds = ds.batch(BATCH).prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    if workers:
        options.threading.private_threadpool_size = workers
    options.threading.max_intra_op_parallelism = 1
    return ds.with_options(options).as_numpy_iterator


class _Iterable:
    def __init__(self, make) -> None:
        self._make = make

    def __iter__(self):
        return self._make()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="map threads (0: AUTOTUNE)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        paths, _ = write_files(Path(folder), make_jpegs(args.images))
        root = os.path.join(folder, "snapshot")
        n, w = args.images, args.workers
        rates: dict[str, list[tuple[float, float]]] = {}

        def time_epoch(name: str, pipeline) -> None:
            rates.setdefault(name, []).append(epoch_rate(pipeline, n))

        time_epoch("recompute (warm-up)", recompute(paths, w))
        began = time.perf_counter()
        live = snapshotted(paths, w, root)
        time_epoch("snapshot, first pass (decode + write)", live)
        first_pass = time.perf_counter() - began
        (published,) = [p for p in os.listdir(root) if not p.endswith(".partial")]
        loaded = data.Dataset.load(os.path.join(root, published)).shuffle(n, seed=0)
        tf_root = os.path.join(folder, "tf-snapshot")
        try:
            tf_recompute = _Iterable(tf_pipeline(paths, w, None))
            tf_snapshot = _Iterable(tf_pipeline(paths, w, tf_root))
            time_epoch("tf.data recompute (warm-up)", tf_recompute)
            time_epoch("tf.data snapshot, first pass", tf_snapshot)
        except ImportError:
            tf_recompute = tf_snapshot = None
        for _ in range(args.rounds):
            time_epoch("recompute", recompute(paths, w))
            time_epoch("snapshot, later epoch (read)", live)
            time_epoch("snapshot, next run (built afresh, read)", snapshotted(paths, w, root))
            time_epoch("load + shuffle (random access)", loaded.batch(BATCH))
            if tf_recompute is not None:
                time_epoch("tf.data recompute", tf_recompute)
                time_epoch("tf.data snapshot, later epoch (read)", tf_snapshot)
        size = sum(f.stat().st_size for f in Path(root, published).iterdir())
    best = {name: max(r, key=lambda x: x[0]) for name, r in rates.items()}
    base = best["recompute"][0]
    print(f"{n} images, batch {BATCH}, {w or 'AUTOTUNE'} map threads, best of {args.rounds}")
    print(f"snapshot: {size / 2**20:.0f} MiB, first pass {first_pass:.1f} s")
    print(f"{'epoch':45s} {'images/s':>9s} {'img/CPU-s':>10s} {'x recompute':>12s}")
    for name, (wall, cpu) in best.items():
        print(f"{name:45s} {wall:9.0f} {cpu:10.0f} {wall / base:11.2f}x")


if __name__ == "__main__":
    main()
