"""ImageNet-shaped input pipelines, phalanx.data against tf.data and Grain (a script, not a test).

    python benchmarks/bench_imagenet_input.py                       # 1,024 images, 2 rounds
    python benchmarks/bench_imagenet_input.py --images 2048 --rounds 3 --workers 1 2 4 8 0

Writes --images JPEGs of 500x375 (~45 KiB at quality 90: smooth content plus sensor-like
noise, generated here, nothing downloaded) as tf.train.Examples into 8 TFRecord files
(phalanx's TFRecordWriter) and one ArrayRecord file, then times, in one process, one epoch
at a time, interleaved over the variants (a busy neighbour hits each alike), best of
--rounds after a warm-up epoch (AUTOTUNE rows: warm-up epochs until it has chosen):

- tf.data (when TensorFlow is installed): TF's official ResNet-50 training preprocessing:
  parse, sample_distorted_bounding_box, decode_and_crop_jpeg, random_flip_left_right,
  resize 224 (bilinear: TF2's tf.image.resize, where the official code calls TF1's
  tf.compat.v1.image.resize(align_corners=False), the same work at other sampling
  positions), / 255 -> batch 64 -> prefetch, on a private thread pool of the same size;
- phalanx (TF port): that function ported with renames only (tf.image -> phalanx.image:
  unfused, float32), what a user porting TF code runs first: the row shown first, beside
  tf.data's;
- phalanx: TFRecordDataset -> map(parse_single_example + decode_random_resized_crop:
  Inception crop, 224x224 bilinear WITHOUT antialias as tf.image.resize's default, random
  flip, uint8) -> batch 64; the same with a float32 [0, 1] output (as TF's); and the same
  uint8 path with antialias=True (Pillow's C resampler: more filtering than TF does, shown
  for its speed, not compared like for like);
- Grain over ArrayRecord: the phalanx.image preprocessing (Grain has none) in Grain's
  threads (ReadOptions.num_threads);
- with --processes, phalanx's uint8 pipeline mapped in worker processes
  (`workers="process"`, shared-memory results), over the ArrayRecord file and over the
  TFRecord files (read by index, in the threads' order), and the TF port over the
  TFRecord files; their CPU time is the children's, so they have no
  images-per-CPU-second cell.

--numpy-stack stacks the batches with NumPy, which releases and retakes the GIL for each
element (phalanx stacks a batch in one native call, `opencv.stack_into`): what that buys
where many threads hold the GIL.

Worker counts: --workers (0 means AUTOTUNE; tf.data's own AUTOTUNE then gets the machine).
Images/s of the pipeline alone, no model. The table shows each rate and its ratio to
tf.data's at the same setting.

    python benchmarks/bench_imagenet_input.py --stages --images 300

times the pieces of one image's preprocessing instead (sequential, one thread, each piece
interleaved image by image, CPU milliseconds per image): where the time goes.

    python benchmarks/bench_imagenet_input.py --gil --images 300 --rounds 3

measures how long each piece of the TF port, the whole map functions and the TF port's
pipeline hold the GIL per image (gil_probe.py: a thread that asks for the GIL without pause
and reads its own scheduler statistics): the serial part that bounds thread scaling.

    python benchmarks/bench_imagenet_input.py --fit --images 2048

times fit fed by the pipeline against fit on synthetic uint8 data in memory: ResNet-50
(bf16, batch 256) on a GPU, a small ResNet on a CPU (a check that it runs).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from phalanx import data, image  # noqa: E402

SIZE = (224, 224)
BATCH = 64
SPEC = {
    "image/encoded": data.FixedLenFeature([], data.string),
    "image/class/label": data.FixedLenFeature([], np.int64),
}


def make_jpegs(count: int, seed: int = 0) -> list[bytes]:
    """ImageNet-shaped photos: 500x375 (landscape) JPEGs of ~45 KiB."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        coarse = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        smooth = np.asarray(Image.fromarray(coarse).resize((500, 375), Image.BICUBIC), np.int16)
        noisy = np.clip(smooth + rng.normal(0, 5.0, smooth.shape), 0, 255).astype(np.uint8)
        out.append(image_bytes(noisy))
    return out


def image_bytes(pixels: np.ndarray) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def write_files(folder: Path, jpegs: list[bytes], shards: int = 8) -> tuple[list[str], str]:
    """TFRecord shards (phalanx's writer) and one ArrayRecord file of the same Examples."""
    from array_record.python.array_record_module import ArrayRecordWriter

    records = [
        data.make_example({"image/encoded": jpeg, "image/class/label": i % 1000})
        for i, jpeg in enumerate(jpegs)
    ]
    paths = []
    for shard in range(shards):
        path = folder / f"train-{shard:05d}-of-{shards:05d}.tfrecord"
        with data.TFRecordWriter(path) as writer:
            for record in records[shard::shards]:
                writer.write(record)
        paths.append(str(path))
    array_path = str(folder / "train.array_record")
    writer = ArrayRecordWriter(array_path, "group_size:1")
    for record in records:
        writer.write(record)
    writer.close()
    return paths, array_path


def preprocess(record: bytes) -> tuple[np.ndarray, np.ndarray]:
    """phalanx's ResNet training preprocessing: uint8, normalised later on the device.

    Bilinear without antialias, as tf.image.resize (TF2) in tf_pipeline, so the pipelines
    do the same work.
    """
    example = data.parse_single_example(record, SPEC)
    pixels = image.decode_random_resized_crop(example["image/encoded"], SIZE)  # antialias=False
    return pixels, example["image/class/label"]


def preprocess_antialias(record: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The same with antialias=True: Pillow's C resampler (TF's antialiased kernels)."""
    example = data.parse_single_example(record, SPEC)
    pixels = image.decode_random_resized_crop(example["image/encoded"], SIZE, antialias=True)
    return pixels, example["image/class/label"]


def preprocess_float(record: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The same, scaled to float32 [0, 1] on the host, as TF's pipeline outputs."""
    pixels, label = preprocess(record)
    return np.multiply(pixels, np.float32(1 / 255), dtype=np.float32), label  # one pass


def preprocess_tf_port(record: bytes) -> tuple[np.ndarray, np.ndarray]:
    """TF's official ResNet preprocessing (tf_pipeline's) ported with renames: tf.image ->
    phalanx.image, unfused: decode_and_crop_jpeg, random flip, float32 resize, / 255."""
    parsed = data.parse_single_example(record, SPEC)
    contents = parsed["image/encoded"]
    shape = image.extract_jpeg_shape(contents)
    begin, size, _ = image.sample_distorted_bounding_box(
        shape,
        bounding_boxes=np.asarray([[[0.0, 0.0, 1.0, 1.0]]], np.float32),
        min_object_covered=0.1,
        aspect_ratio_range=[0.75, 1.33],
        area_range=[0.05, 1.0],
        max_attempts=100,
        use_image_if_no_bounding_boxes=True,
    )
    window = np.stack([begin[0], begin[1], size[0], size[1]])
    cropped = image.decode_and_crop_jpeg(contents, window, channels=3)
    flipped = image.random_flip_left_right(cropped)
    resized = image.resize(flipped, SIZE, method=image.ResizeMethod.BILINEAR)
    return resized / 255.0, parsed["image/class/label"]


def phalanx_pipeline(paths: list[str], workers: int, fn=preprocess) -> data.Dataset:
    calls = data.AUTOTUNE if workers == 0 else workers
    ds = data.TFRecordDataset(paths, num_parallel_reads=min(len(paths), 4))
    return ds.map(fn, num_parallel_calls=calls).batch(BATCH)


def phalanx_processes(source: str | list[str], workers: int, fn=preprocess) -> data.Dataset:
    """The uint8 pipeline (or `fn`'s) mapped in processes, over the ArrayRecord file or the
    TFRecord files (read by index, in the threads' order)."""
    calls = data.AUTOTUNE if workers == 0 else workers
    if isinstance(source, str):
        ds = data.ArrayRecordDataset([source])
    else:
        ds = data.TFRecordDataset(source, num_parallel_reads=min(len(source), 4))
    return ds.map(fn, num_parallel_calls=calls, workers="process").batch(BATCH)


def tf_pipeline(paths: list[str], workers: int):
    import tensorflow as tf

    def parse_and_preprocess(record):
        # TF's official ResNet-50 preprocessing (imagenet_preprocessing.py), training branch,
        # with TF2's tf.image.resize for its tf.compat.v1.image.resize(align_corners=False).
        parsed = tf.io.parse_single_example(
            record,
            {
                "image/encoded": tf.io.FixedLenFeature([], tf.string),
                "image/class/label": tf.io.FixedLenFeature([], tf.int64),
            },
        )
        contents = parsed["image/encoded"]
        shape = tf.image.extract_jpeg_shape(contents)
        box = tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4])
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape,
            bounding_boxes=box,
            min_object_covered=0.1,
            aspect_ratio_range=[0.75, 1.33],
            area_range=[0.05, 1.0],
            max_attempts=100,
            use_image_if_no_bounding_boxes=True,
        )
        offset_y, offset_x, _ = tf.unstack(begin)
        target_h, target_w, _ = tf.unstack(size)
        window = tf.stack([offset_y, offset_x, target_h, target_w])
        cropped = tf.image.decode_and_crop_jpeg(contents, window, channels=3)
        flipped = tf.image.random_flip_left_right(cropped)
        resized = tf.image.resize(flipped, SIZE, method=tf.image.ResizeMethod.BILINEAR)
        return resized / 255.0, parsed["image/class/label"]

    calls = tf.data.AUTOTUNE if workers == 0 else workers
    ds = tf.data.TFRecordDataset(paths, num_parallel_reads=min(len(paths), 4))
    ds = ds.map(parse_and_preprocess, num_parallel_calls=calls).batch(BATCH)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    if workers:
        options.threading.private_threadpool_size = workers
    options.threading.max_intra_op_parallelism = 1
    return ds.with_options(options)


class GrainPipeline:
    """Grain's MapDataset over ArrayRecord, preprocessing in `workers` threads."""

    def __init__(self, path: str, workers: int) -> None:
        import grain
        from array_record.python.array_record_data_source import ArrayRecordDataSource

        threads = workers or os.cpu_count() or 1
        ds = grain.MapDataset.source(ArrayRecordDataSource([path])).map(preprocess)
        ds = ds.batch(BATCH, drop_remainder=False)
        self._ds = ds.to_iter_dataset(
            grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * BATCH)
        )

    def __iter__(self):
        return iter(self._ds)


def epoch_rate(pipeline, expected: int) -> tuple[float, float]:
    """Images per wall second and per CPU second (all of this process's threads) over one
    epoch, which must hold every image (a short epoch is an error).

    The CPU-time rate is the work per image, which neighbours on a shared machine hardly
    change; the wall-clock rate is what a training loop gets.
    """
    began, cpu, count = time.perf_counter(), time.process_time(), 0
    for batch in pipeline:
        count += len(batch[1])
    seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - cpu
    if count != expected:
        raise RuntimeError(f"{pipeline!r} gave {count} images in an epoch, not {expected}")
    return count / seconds, count / cpu_seconds


# Rows whose work runs in worker processes: this process's CPU time does not count it.
CHILD_PROCESS_ROWS = (
    "phalanx ArrayRecord (uint8, processes)",
    "phalanx (uint8, processes)",
    "phalanx (TF port, float32, processes)",
)


def _without_opencv(fn, *args, **kwargs):
    """`fn` with phalanx.image's OpenCV path switched off (its NumPy fallback), for --stages."""
    from phalanx._src.image import opencv

    saved, opencv._cv2 = opencv._cv2, None
    try:
        return fn(*args, **kwargs)
    finally:
        opencv._cv2 = saved


def time_stages(count: int) -> None:
    """CPU milliseconds per image of each piece, sequential, interleaved image by image."""
    jpegs = make_jpegs(count)
    records = [data.make_example({"image/encoded": j, "image/class/label": 0}) for j in jpegs]
    box = np.asarray([[[0.0, 0.0, 1.0, 1.0]]], np.float32)
    out = np.empty((*SIZE, 3), np.uint8)
    stages: dict[str, object] = {
        "parse_single_example": lambda k: data.parse_single_example(records[k], SPEC),
        "extract_jpeg_shape + sample_distorted_bounding_box": lambda k: (
            image.sample_distorted_bounding_box(
                image.extract_jpeg_shape(jpegs[k]), box, use_image_if_no_bounding_boxes=True
            )
        ),
        "decode_jpeg (full size, libjpeg-turbo)": lambda k: image.decode_jpeg(jpegs[k], 3),
        "decode_jpeg, ratio=2 (DCT-domain 1/2)": lambda k: image.decode_jpeg(jpegs[k], 3, 2),
        "decode_jpeg, ratio=4": lambda k: image.decode_jpeg(jpegs[k], 3, 4),
        "decode_jpeg, ratio=8": lambda k: image.decode_jpeg(jpegs[k], 3, 8),
        "fused, antialias=False (decode + OpenCV resize + flip)": lambda k: (
            image.decode_crop_resize_flip(jpegs[k], windows[k], SIZE, flip=k % 2 == 1, out=out)
        ),
        "fused, antialias=False, NumPy taps (without OpenCV)": lambda k: _without_opencv(
            image.decode_crop_resize_flip, jpegs[k], windows[k], SIZE, flip=k % 2 == 1, out=out
        ),
        "fused, antialias=True (Pillow resampler)": lambda k: image.decode_crop_resize_flip(
            jpegs[k], windows[k], SIZE, flip=k % 2 == 1, antialias=True, out=out
        ),
        "whole map function (preprocess)": lambda k: preprocess(records[k]),
    }
    try:
        import tensorflow as tf

        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.threading.set_intra_op_parallelism_threads(1)
        stages["TF eager: decode_and_crop_jpeg"] = lambda k: tf.image.decode_and_crop_jpeg(
            jpegs[k], windows[k], channels=3
        )
        stages["TF eager: resize (bilinear, float32)"] = lambda k: tf.image.resize(crops[k], SIZE)
    except ImportError:
        tf = None
    rng = np.random.default_rng(0)
    windows = []
    for jpeg in jpegs:
        begin, size, _ = image.sample_distorted_bounding_box(
            image.extract_jpeg_shape(jpeg), box, seed=int(rng.integers(1 << 30)),
            use_image_if_no_bounding_boxes=True,
        )  # fmt: skip
        windows.append([int(begin[0]), int(begin[1]), int(size[0]), int(size[1])])
    crops = [image.decode_and_crop_jpeg(j, w, 3) for j, w in zip(jpegs, windows, strict=True)]
    if tf is not None:
        crops = [tf.constant(c) for c in crops]
    spent = dict.fromkeys(stages, 0.0)
    for k in range(min(count, 20)):  # warm-up: imports, caches, TF's kernels
        for stage in stages.values():
            stage(k)
    for k in range(count):
        for name, stage in stages.items():
            began = time.process_time()
            stage(k)
            spent[name] += time.process_time() - began
    print(f"\n## CPU ms per image, {count} JPEGs 500x375, sequential, interleaved\n")
    print("| piece | ms |\n|---|---|")
    for name, seconds in spent.items():
        print(f"| {name} | {1e3 * seconds / count:.3f} |")
    fused = spent["fused, antialias=False (decode + OpenCV resize + flip)"]
    decode = spent["decode_jpeg (full size, libjpeg-turbo)"]
    print(f"| (fused minus decode: resize, flip, round) | {1e3 * (fused - decode) / count:.3f} |")
    time_pipeline_overhead(jpegs)


def _gil_inputs(jpegs: list[bytes]) -> dict[str, list]:
    """Each piece's inputs for `time_gil`: the records and the outputs of the piece before."""
    box = np.asarray([[[0.0, 0.0, 1.0, 1.0]]], np.float32)
    out: dict[str, list] = {"jpegs": jpegs, "windows": [], "crops": []}
    out["records"] = [
        data.make_example({"image/encoded": j, "image/class/label": 0}) for j in jpegs
    ]
    for k, jpeg in enumerate(jpegs):
        shape = image.extract_jpeg_shape(jpeg)
        begin, size, _ = image.sample_distorted_bounding_box(
            shape, box, seed=k, use_image_if_no_bounding_boxes=True
        )
        out["windows"].append(np.stack([begin[0], begin[1], size[0], size[1]]))
        out["crops"].append(image.decode_and_crop_jpeg(jpeg, out["windows"][-1], channels=3))
    out["flipped"] = [image.random_flip_left_right(c) for c in out["crops"]]
    out["resized"] = [image.resize(f, SIZE) for f in out["flipped"]]
    return out


BOX = np.asarray([[[0.0, 0.0, 1.0, 1.0]]], np.float32)
# The TF port's pieces as `time_gil` times them: (k, inputs) -> the piece's output.
GIL_STAGES = {
    "pure Python (reference: holds the GIL throughout)": lambda k, i: sum(range(3000)),
    "hashlib.sha256 of 200 KB (reference: one GIL release)": (
        lambda k, i: hashlib.sha256(bytes(200_000))
    ),
    "parse_single_example": lambda k, i: data.parse_single_example(i["records"][k], SPEC),
    "extract_jpeg_shape + sample_distorted_bounding_box": lambda k, i: (
        image.sample_distorted_bounding_box(
            image.extract_jpeg_shape(i["jpegs"][k]),
            BOX,
            min_object_covered=0.1,
            aspect_ratio_range=[0.75, 1.33],
            area_range=[0.05, 1.0],
            max_attempts=100,
            use_image_if_no_bounding_boxes=True,
        )
    ),
    "decode_and_crop_jpeg": lambda k, i: image.decode_and_crop_jpeg(
        i["jpegs"][k], i["windows"][k], 3
    ),
    "random_flip_left_right": lambda k, i: image.random_flip_left_right(i["crops"][k]),
    "resize 224 (bilinear, float32)": lambda k, i: image.resize(i["flipped"][k], SIZE),
    "/ 255.0": lambda k, i: i["resized"][k] / 255.0,
    "TF port, whole map function": lambda k, i: preprocess_tf_port(i["records"][k]),
    "fused uint8, whole map function (preprocess)": lambda k, i: preprocess(i["records"][k]),
}


def time_gil(count: int, rounds: int) -> None:
    """Per image, for each piece of the TF port and the whole map functions: the GIL-held
    time (gil_probe.py's probe; each release and take-back of the GIL adds a hand-over, the
    sha256 row shows one), the wall time, and the time on a 16x16 JPEG (Python's own cost
    and the native calls' fixed cost). Then the TF port's pipeline at 1 and 2 workers.
    The median of `rounds`: a busy neighbour moves single readings either way.
    """
    from gil_probe import GilProbe, held_per_call

    jpegs = make_jpegs(count)
    real = _gil_inputs(jpegs)
    tiny = _gil_inputs([image_bytes(np.full((16, 16, 3), 90, np.uint8))] * count)
    readings: dict[str, list[tuple[float, float, float]]] = {name: [] for name in GIL_STAGES}
    for _ in range(rounds):
        for name, stage in GIL_STAGES.items():
            for k in range(min(count, 10)):
                stage(k, real)
            held, wall = held_per_call(lambda k, stage=stage: stage(k, real), count)
            began = time.perf_counter()
            for k in range(count):
                stage(k, tiny)
            readings[name].append((held, wall, (time.perf_counter() - began) / count))
    print(f"\n## GIL-held time per image, {count} JPEGs 500x375, median of {rounds}\n")
    print("| piece | GIL held, us | wall, us | wall on a 16x16 JPEG, us |\n|---|---|---|---|")
    for name, values in readings.items():
        held, wall, small = (sorted(c)[len(c) // 2] for c in zip(*values, strict=True))
        print(f"| {name} | {1e6 * held:.1f} | {1e6 * wall:.1f} | {1e6 * small:.1f} |")
    with tempfile.TemporaryDirectory() as folder:
        paths, _ = write_files(Path(folder), jpegs)
        print(
            "\n| TF port pipeline (batch 64) | GIL held per image, us | images/s |\n|---|---|---|"
        )
        for workers in (1, 2):
            pipeline = phalanx_pipeline(paths, workers, preprocess_tf_port)
            epoch_rate(pipeline, count)  # warm-up
            runs = []
            for _ in range(rounds):
                with GilProbe() as probe:
                    batches = sum(1 for _ in pipeline)
                if batches != -(-count // BATCH):
                    raise RuntimeError(f"an epoch gave {batches} batches")
                runs.append((probe.held / count, count / probe.wall))
            held, rate = (sorted(c)[len(c) // 2] for c in zip(*runs, strict=True))
            print(f"| {workers} worker{'s' * (workers > 1)} | {1e6 * held:.1f} | {rate:,.0f} |")


def time_pipeline_overhead(jpegs: list[bytes]) -> None:
    """CPU per record of the pipeline around the map: records -> a map that returns a
    constant image -> batch 64, with the map inline and in 1 and 2 threads (best of 6 passes)."""
    pixels = np.zeros((*SIZE, 3), np.uint8)

    def constant(record: bytes) -> tuple[np.ndarray, np.int64]:
        return pixels, np.int64(0)

    print("\n| pipeline around a constant map | CPU us per record |\n|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        paths, _ = write_files(Path(folder), jpegs)
        for workers in (None, 1, 2):
            ds = data.TFRecordDataset(paths, num_parallel_reads=4)
            ds = ds.map(constant, num_parallel_calls=workers).batch(BATCH)
            best = float("inf")
            for _ in range(6):  # the first pass warms up
                began = time.process_time()
                for _ in ds:
                    pass
                best = min(best, time.process_time() - began)
            label = "inline" if workers is None else f"{workers} thread{'s' * (workers > 1)}"
            print(f"| {label} | {1e6 * best / len(jpegs):.1f} |")


def time_fit(paths: list[str], steps: int, epochs: int, processes: list[int]) -> None:
    """fit fed by the uint8 TFRecord pipeline against fit on synthetic data in memory.

    On a GPU: ResNet-50 (bench_models.py's, bf16, batch 256), the issue's target being the
    pipeline-fed rate >= 0.95x the synthetic one with <= 5 % input wait. On a CPU the
    same code with a small ResNet (stages 1-1-1-1, width 16, batch 32): a check that it
    runs, not a speed claim. The images stay uint8 to the device; the model scales them.
    """
    import warnings

    import jax
    import jax.numpy as jnp
    import optax
    from bench_models import PRESETS, _resnet
    from flax import nnx

    import phalanx

    warnings.simplefilter("ignore", phalanx.data.InputBoundWarning)  # the table says it
    gpu = jax.devices()[0].platform in ("gpu", "cuda", "rocm")
    cfg = dict(PRESETS["full" if gpu else "cpu"]["resnet50"])
    cfg["image"], cfg["classes"] = SIZE[0], 1000  # the records hold ImageNet's 1,000 labels
    precision = "mixed_bfloat16" if gpu else "float32"

    class Scaled(nnx.Module):
        """uint8 images in, scaled to [0, 1] on the device (4x fewer bytes to move)."""

        def __init__(self) -> None:
            self.net = _resnet(cfg, None)

        def __call__(self, x):
            return self.net(x.astype(jnp.float32) / 255.0)

    def rates(ds) -> tuple[float, float]:
        model = phalanx.Model(Scaled())
        model.compile(
            optax.sgd(0.1, momentum=0.9),
            phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
            precision=precision,
        )
        h = model.fit(ds, epochs=epochs, steps_per_epoch=steps, verbose=0).history
        rate = max(h["examples_per_second"][1:])  # the first epoch compiles
        return rate, h["input_wait_fraction"][h["examples_per_second"].index(rate)]

    batch = cfg["batch"]
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (batch, *SIZE, 3), dtype=np.uint8)
    labels = rng.integers(0, cfg["classes"], batch).astype(np.int64)
    synthetic = data.Dataset.from_tensor_slices((pixels, labels)).repeat().batch(batch)
    fed = (
        data.TFRecordDataset(paths, num_parallel_reads=data.AUTOTUNE)
        .repeat()
        .map(preprocess, num_parallel_calls=data.AUTOTUNE)
        .batch(batch)
    )

    def in_processes(calls: int) -> data.Dataset:
        return (
            data.TFRecordDataset(paths, num_parallel_reads=min(len(paths), 4))
            .map(preprocess, num_parallel_calls=calls, workers="process")
            .batch(batch)
            .repeat()
        )

    feeds = [("threads, AUTOTUNE", fed), ("processes, AUTOTUNE", in_processes(data.AUTOTUNE))]
    feeds += [(f"{n} processes", in_processes(n)) for n in processes]
    name = "ResNet-50 (bf16)" if gpu else "small ResNet (CPU check)"
    print(f"\n## fit: {name}, batch {batch}, {steps} steps x {epochs} epochs, {jax.devices()[0]}")
    print("| data | images/s | input wait |\n|---|---|---|")
    base, _ = rates(synthetic)
    print(f"| synthetic uint8 in memory | {base:,.0f} | - |")
    for label, ds in feeds:
        rate, wait = rates(ds)
        print(f"| TFRecords -> phalanx.image ({label}) | {rate:,.0f} "
              f"({rate / base:.2f}x) | {wait:.1%} |")  # fmt: skip
        report = ds.autotune_report
        if report:
            print(f"\n{label}: {report}\n")
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 0])
    parser.add_argument("--no-tf", action="store_true", help="skip tf.data")
    parser.add_argument("--no-grain", action="store_true", help="skip Grain")
    parser.add_argument("--stages", action="store_true", help="time the pieces per image")
    parser.add_argument(
        "--gil", action="store_true", help="GIL-held time per image of the TF port's pieces"
    )
    parser.add_argument(
        "--processes", action="store_true", help="add phalanx mapped in worker processes"
    )
    parser.add_argument(
        "--fit", action="store_true", help="only time fit fed by the pipeline vs synthetic"
    )
    parser.add_argument(
        "--numpy-stack",
        action="store_true",
        help="stack batches with NumPy (a GIL release per element), not in one native call",
    )
    parser.add_argument(
        "--only", nargs="+", metavar="TEXT", help="keep the rows whose name holds one of these"
    )
    parser.add_argument("--fit-steps", type=int, default=50, help="fit's steps per epoch")
    parser.add_argument("--fit-epochs", type=int, default=3)
    parser.add_argument(
        "--fit-processes", type=int, nargs="*", default=[], help="also fit fed by N processes"
    )
    args = parser.parse_args()
    if args.numpy_stack:  # what the one-release stack buys (opencv.stack_into)
        from phalanx._src.image import opencv

        opencv.stack_into = lambda values, out: False
    if args.stages:
        time_stages(args.images)
        return
    if args.gil:
        time_gil(args.images, args.rounds)
        return

    try:
        if args.no_tf:
            raise ImportError
        import tensorflow as tf

        tf.config.threading.set_inter_op_parallelism_threads(os.cpu_count() or 1)
        have_tf = True
    except ImportError:
        have_tf = False

    with tempfile.TemporaryDirectory() as folder:
        jpegs = make_jpegs(args.images)
        mean_kib = np.mean([len(j) for j in jpegs]) / 1024
        paths, array_path = write_files(Path(folder), jpegs)
        if args.fit:
            time_fit(paths, args.fit_steps, args.fit_epochs, args.fit_processes)
            return
        variants: dict[tuple[str, int], object] = {}
        for workers in args.workers:
            if have_tf:
                variants[("tf.data (float32)", workers)] = tf_pipeline(paths, workers)
            variants[("phalanx (uint8)", workers)] = phalanx_pipeline(paths, workers)
            variants[("phalanx (float32)", workers)] = phalanx_pipeline(
                paths, workers, preprocess_float
            )
            variants[("phalanx (TF port, float32)", workers)] = phalanx_pipeline(
                paths, workers, preprocess_tf_port
            )
            variants[("phalanx (uint8, antialias)", workers)] = phalanx_pipeline(
                paths, workers, preprocess_antialias
            )
            if args.processes:
                variants[(CHILD_PROCESS_ROWS[0], workers)] = phalanx_processes(array_path, workers)
                variants[(CHILD_PROCESS_ROWS[1], workers)] = phalanx_processes(paths, workers)
                variants[(CHILD_PROCESS_ROWS[2], workers)] = phalanx_processes(
                    paths, workers, preprocess_tf_port
                )
            if not args.no_grain:
                variants[("Grain/ArrayRecord (uint8)", workers)] = GrainPipeline(
                    array_path, workers
                )
        if args.only:
            variants = {
                key: pipeline
                for key, pipeline in variants.items()
                if any(text in key[0] for text in args.only)
            }
        for key, pipeline in variants.items():  # warm-up: imports, pools, AUTOTUNE's measuring
            for _ in range(12):  # AUTOTUNE: until it has chosen (its report says after what)
                wall, _ = epoch_rate(pipeline, args.images)
                print(f"warm-up {key}: {wall:,.0f} images/s", file=sys.stderr, flush=True)
                report = getattr(pipeline, "autotune_report", None)
                if key[1] != 0 or not report or report.startswith("AUTOTUNE chose"):
                    break
        best = dict.fromkeys(variants, 0.0)
        per_cpu = dict.fromkeys(variants, 0.0)
        for r in range(args.rounds):
            for key, pipeline in variants.items():
                wall, cpu = epoch_rate(pipeline, args.images)
                best[key], per_cpu[key] = max(best[key], wall), max(per_cpu[key], cpu)
                print(f"round {r + 1} {key}: {wall:,.0f} images/s", file=sys.stderr, flush=True)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
        print(
            f"\n## {args.images} JPEGs 500x375 (mean {mean_kib:.1f} KiB) in 8 TFRecord files, "
            f"batch {BATCH}, {cores} cores; best of {args.rounds} interleaved epochs"
        )
        # tf.data first, then what a user porting its preprocessing gets, then the rest.
        names = sorted(
            {name for name, _ in variants},
            key=lambda n: (not n.startswith("tf"), "TF port" not in n, n),
        )
        label = {
            w: ("AUTOTUNE" if w == 0 else f"{w} worker{'s' if w > 1 else ''}") for w in args.workers
        }
        for title, table in (("images/s", best), ("images per CPU-second", per_cpu)):
            print(f"\n{title} (ratio to tf.data's at the same setting)\n")
            print("| pipeline | " + " | ".join(label[w] for w in args.workers) + " |")
            print("|---|" + "---|" * len(args.workers))
            for name in names:
                cells = []
                for w in args.workers:
                    if table is per_cpu and name in CHILD_PROCESS_ROWS:
                        cells.append("-")
                        continue
                    rate = table[(name, w)]
                    reference = table.get(("tf.data (float32)", w))
                    ratio = f" ({rate / reference:.2f}x)" if reference and name[:2] != "tf" else ""
                    cells.append(f"{rate:,.0f}{ratio}")
                print(f"| {name} | " + " | ".join(cells) + " |")
        print(f"\nload average while measuring: {os.getloadavg()[0]:.1f}")
        for name, workers in variants:
            report = getattr(variants[(name, workers)], "autotune_report", None)
            if workers == 0 and report:
                print(f"{name}, AUTOTUNE: {report}")
        if 1 in args.workers and 2 in args.workers:
            for name in names:
                print(f"{name}: 2 workers / 1 worker = {best[(name, 2)] / best[(name, 1)]:.2f}x")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
