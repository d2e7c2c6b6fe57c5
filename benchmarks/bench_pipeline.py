"""Benchmarks of the input pipeline (a script, not a test).

    python benchmarks/bench_pipeline.py                    # every section
    python benchmarks/bench_pipeline.py --section pipeline --epochs 2 --passes 3
    python benchmarks/bench_pipeline.py --data /path/to/mnist.npz
    python benchmarks/bench_pipeline.py --tune-malloc      # glibc keeps freed batch memory

Section "pipeline": batches/s of `phalanx.data` alone (no model) on MNIST-shaped data,
60000 x 784 float32 at batch 1024, shuffled every epoch, with a vectorised per-batch map run
by 0, 1 and 2 Grain workers; each number is the best of several passes. The data is the
offline MNIST file found through $PHALANX_DATA_DIR (or --data); random data of the same
shape stands in when it is absent.

Section "overlap": a stand-in training loop (each "step" sleeps --step-ms) over a pipeline
whose map sleeps about as long, measured with InputWaitMeter: the fraction of wall time the
loop waited for input and the time per step, without and with DevicePrefetcher / workers.

--tune-malloc: glibc returns each freed multi-megabyte array to the kernel (munmap or heap
trim), so every new batch-sized temporary page-faults its memory in again; in a small VM that
costs milliseconds per 3 MB array and can dominate a map. Raising M_MMAP_THRESHOLD and
M_TRIM_THRESHOLD (mallopt, the same as the MALLOC_*_THRESHOLD_ environment variables) keeps
that memory in the process. Compare the tables with and without it.

Section "fit": phalanx's fit on a pipeline whose map sleeps about as long as the model's
step (measured first on this machine), with prefetch=0 (batches made in the loop's thread)
and the default prefetch: the input-wait fraction fit reports and the time per step.

Section "maps": three per-example maps over 40x40x3 images (Python-bound NumPy as
augmentation code is, GIL-releasing LAPACK, an I/O-like 1 ms wait), each run sequentially,
with num_parallel_calls=AUTOTUNE (threads; the level it settled on is shown, and its rate
against the best fixed thread setting), with 2 threads, and with 1 and 2 process workers:
examples/s of the pipeline alone, after 3 warm-up epochs (worker start-up, AUTOTUNE's
measuring), best of interleaved epochs.

Section "autotune" (issue 42): 1,500 40x40x3 uint8 images mapped per example, then
batch(64), with --maps augment (GIL-bound augmentation, ~0.1 ms an image), svd (six 32x32
SVDs, which release the GIL), light (the "maps" section's crop, flip, normalise) or rows (a
cheap map, no batch: what AUTOTUNE's machinery costs): images/s of each setting (sequential,
1 and 2 threads, AUTOTUNE) for a pipeline built fresh (its first epoch) and for one
pipeline over 4 epochs, interleaved, best of --passes rounds, with AUTOTUNE's ratios and
reports.

Section "images": the file-based pipeline (PNG digits written to a temporary folder,
image_dataset_from_directory, which decodes with AUTOTUNE): examples/s alone, and fit of a
small CNN fed by it, with the input-wait fraction fit reports.

New sections register themselves in SECTIONS.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

# One BLAS thread per process, as data-loading workers run: the GIL-releasing map's LAPACK
# calls are then parallelised by the pipeline's workers, not by BLAS threads that spin
# against them (on 2 busy cores, that made each call ~10x slower). Set before NumPy loads.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import grain  # noqa: E402, F401  (imported up front: "first ms" times the pipeline, not this)
import numpy as np  # noqa: E402

from phalanx.data import Dataset, DevicePrefetcher, InputWaitMeter  # noqa: E402

BATCH = 1024


def load_mnist(path: str | None) -> tuple[np.ndarray, np.ndarray, str]:
    """MNIST's training split as (60000, 784) float32 in [0, 1] and int32 labels."""
    candidates = [Path(path)] if path else []
    if os.environ.get("PHALANX_DATA_DIR"):
        candidates.append(Path(os.environ["PHALANX_DATA_DIR"]) / "mnist.npz")
    for candidate in candidates:
        if candidate.exists():
            with np.load(candidate) as f:
                x = f["x_train"].reshape(len(f["x_train"]), -1).astype(np.float32) / 255.0
                return x, f["y_train"].astype(np.int32), str(candidate)
    rng = np.random.default_rng(0)
    x = rng.random((60000, 784), dtype=np.float32)
    return x, rng.integers(0, 10, 60000).astype(np.int32), "random (MNIST file not found)"


def time_epochs(ds: Dataset, epochs: int, passes: int) -> tuple[float, float]:
    """(seconds to the first batch, best batches/s of `passes` runs of `epochs` epochs).

    The best pass, because the machine is shared: slower passes measure the neighbours.
    """
    began = time.perf_counter()
    it = iter(ds)
    next(it)
    first = time.perf_counter() - began
    for _ in it:  # The rest of the warm-up epoch: caches, permutations, thread pools.
        pass
    best = 0.0
    for _ in range(passes):
        count = 0
        began = time.perf_counter()
        for _ in range(epochs):
            for batch in ds:
                count += 1
                del batch
        best = max(best, count / (time.perf_counter() - began))
    return first, best


def section_pipeline(args: argparse.Namespace) -> None:
    x, y, source = load_mnist(args.data)
    mean, std = float(x.mean()), float(x.std())

    def normalise(xb: np.ndarray, yb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (xb - mean) / std, yb

    base = Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).batch(BATCH)
    variants = [("gather only", None, base)]
    for workers in (0, 1, 2):
        calls = None if workers == 0 else workers
        variants.append(("map(normalise)", workers, base.map(normalise, calls)))
    variants.append(("map + prefetch(2)", 0, base.map(normalise).prefetch(2)))

    print(f"\n## pipeline alone: {x.shape} {x.dtype}, batch {BATCH}, data: {source}")
    print(f"{'pipeline':<20} {'workers':>7} {'batches/s':>10} {'examples/s':>11} {'first ms':>9}")
    for name, workers, ds in variants:
        first, rate = time_epochs(ds, args.epochs, args.passes)
        shown = "-" if workers is None else str(workers)
        print(f"{name:<20} {shown:>7} {rate:>10.0f} {rate * BATCH:>11.0f} {first * 1e3:>9.1f}")


def section_overlap(args: argparse.Namespace) -> None:
    step_s = args.step_ms / 1e3
    x = np.zeros((64 * BATCH // 16, 16), np.float32)  # Small rows: the map's sleep dominates.

    def slow(xb: np.ndarray) -> np.ndarray:
        time.sleep(step_s)  # Releases the GIL, like I/O or decoding in C.
        return xb

    def run(ds: Dataset, prefetch: bool) -> dict[str, float]:
        meter = InputWaitMeter()
        it = iter(ds)
        source = DevicePrefetcher(it, host_depth=2, device_depth=1) if prefetch else it
        meter.start_epoch()
        while True:
            with meter.waiting():
                batch = next(source, None)
            if batch is None:
                break
            time.sleep(step_s)  # The "step".
            meter.step_done()
        if prefetch:
            source.close()
        # The first batch is always waited for; the fraction is over the whole epoch.
        return meter.epoch_summary()

    base = Dataset.from_tensor_slices(x).batch(BATCH // 16)
    variants = [("no prefetch", 0, False), ("DevicePrefetcher", 0, True)]
    variants += [("DevicePrefetcher", 2, True), ("no prefetch", 2, False)]
    print(f"\n## overlap: map sleeps {args.step_ms} ms per batch, step sleeps {args.step_ms} ms")
    print(f"{'loop':<18} {'workers':>7} {'wait %':>7} {'ms/step':>8} {'steps':>6}")
    for name, workers, prefetch in variants:
        summary = run(base.map(slow, workers or None), prefetch)
        ms = summary["wall_s"] / summary["steps"] * 1e3
        wait = summary["input_wait_fraction"] * 100
        print(f"{name:<18} {workers:>7} {wait:>7.1f} {ms:>8.1f} {summary['steps']:>6}")


def section_fit(args: argparse.Namespace) -> None:
    """fit on a pipeline whose map sleeps about as long as a step, with and without prefetch."""
    import warnings

    import jax
    from flax import nnx

    import phalanx

    warnings.simplefilter("ignore", phalanx.data.InputBoundWarning)  # the table says it
    x, y, _ = load_mnist(args.data)

    class MLP(nnx.Module):
        """Wide enough that a step is compute, not host bookkeeping (~11 GFLOP a batch)."""

        def __init__(self, rngs: nnx.Rngs):
            self.l1 = nnx.Linear(784, 1024, rngs=rngs)
            self.l2 = nnx.Linear(1024, 1024, rngs=rngs)
            self.l3 = nnx.Linear(1024, 10, rngs=rngs)

        def __call__(self, xb):
            return self.l3(jax.nn.relu(self.l2(jax.nn.relu(self.l1(xb)))))

    def model() -> phalanx.Model:
        m = phalanx.Model(MLP(nnx.Rngs(0)))
        m.compile("adam", phalanx.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    steps = 20
    base = Dataset.from_tensor_slices((x, y)).batch(BATCH).take(steps)
    # The step time on this machine, with a pipeline that costs nothing (rows on device).
    timed = model()
    history = timed.fit(base, epochs=3, verbose=0)
    step_s = BATCH / max(history.history["examples_per_second"][1:])
    sleep_s = step_s

    def slow(xb: np.ndarray, yb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        time.sleep(sleep_s)  # Releases the GIL, like I/O or decoding in C.
        return xb, yb

    print(
        f"\n## fit: MLP step {step_s * 1e3:.1f} ms; the map sleeps {sleep_s * 1e3:.1f} ms a batch"
    )
    print(f"{'fit':<26} {'input wait %':>12} {'ms/step':>8}")
    variants = (("prefetch=0", 0, None), ("prefetch=2 (default)", 2, None))
    variants += (("prefetch=2, 2 map workers", 2, 2),)
    for name, prefetch, workers in variants:
        m = model()
        best = None
        for _ in range(args.passes):
            ds = base.map(slow, num_parallel_calls=workers)
            h = m.fit(ds, epochs=args.epochs, verbose=0, prefetch=prefetch)
            rate = max(h.history["examples_per_second"][1:] or h.history["examples_per_second"])
            at = h.history["examples_per_second"].index(rate)
            row = (h.history["input_wait_fraction"][at] * 100, BATCH / rate * 1e3)
            best = row if best is None or row[1] < best[1] else best
        print(f"{name:<26} {best[0]:>12.1f} {best[1]:>8.1f}")


IMAGE = (40, 40, 3)
MAP_BATCH = 16


def gil_bound(image: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Random crop, flip and normalise: small NumPy operations driven from Python."""
    seed = int(image[0, 0, 0]) + int(label)
    padded = np.pad(image, ((4, 4), (4, 4), (0, 0)), mode="reflect")
    top, left = seed % 9, (seed // 9) % 9
    crop = padded[top : top + IMAGE[0], left : left + IMAGE[1]]
    if seed % 2:
        crop = crop[:, ::-1]
    out = (crop.astype(np.float32) / 255.0 - 0.5) / 0.25
    return out, label


def gil_releasing(image: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A LAPACK call per example (QR of a 120x120 matrix), which releases the GIL."""
    a = image.reshape(120, 40).astype(np.float64)
    q, _ = np.linalg.qr(a @ a.T + np.eye(120))
    return q[:40, :40].astype(np.float32), label


def io_like(image: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A 1 ms wait per example (a read from a slow disk or the network)."""
    time.sleep(0.001)
    return image.astype(np.float32), label


def _epoch_rate(ds: Dataset) -> float:
    began, count = time.perf_counter(), 0
    for xb, _ in ds:
        count += len(xb)
    return count / (time.perf_counter() - began)


def _rate(ds: Dataset, passes: int) -> float:
    """Best examples/s over `passes` epochs, after one warm-up epoch."""
    _epoch_rate(ds)
    return max(_epoch_rate(ds) for _ in range(passes))


def section_maps(args: argparse.Namespace) -> None:
    from phalanx.data import AUTOTUNE

    rng = np.random.default_rng(0)
    kinds = (("GIL-bound", gil_bound, 2048), ("GIL-releasing", gil_releasing, 512))
    kinds += (("I/O-like 1 ms", io_like, 512),)
    names = ("sequential", "AUTOTUNE", "2 threads", "1 process", "2 processes")
    print(f"\n## per-example maps on 40x40x3 images, batch {MAP_BATCH}: examples/s, best of")
    print(f"## {args.passes + 2} epochs interleaved across the variants (ratio to sequential)")
    print(f"{'map':<16} " + " ".join(f"{n:>15}" for n in names) + "  AUTOTUNE chose")
    reports = []
    for name, fn, n in kinds:
        images = rng.integers(0, 256, (n, *IMAGE), dtype=np.uint8)
        base = Dataset.from_tensor_slices((images, np.arange(n, dtype=np.int32)))
        base = base.shuffle(n, seed=0)
        variants = [
            base.map(fn).batch(MAP_BATCH),
            base.map(fn, num_parallel_calls=AUTOTUNE).batch(MAP_BATCH),
            base.map(fn, num_parallel_calls=2).batch(MAP_BATCH),
            base.map(fn, num_parallel_calls=1, workers="process").batch(MAP_BATCH),
            base.map(fn, num_parallel_calls=2, workers="process").batch(MAP_BATCH),
        ]
        for ds in variants:  # warm-up: worker start; AUTOTUNE measures until it has chosen
            for epoch in range(30):
                _epoch_rate(ds)
                if epoch >= 2 and (ds._tuner is None or ds._tuner.settled):
                    break
        best = [0.0] * len(variants)
        for _ in range(args.passes + 2):  # interleaved: a busy neighbour hits every variant
            for i, ds in enumerate(variants):
                best[i] = max(best[i], _epoch_rate(ds))
        tuner = variants[1]._tuner  # the level AUTOTUNE settled on (None: still measuring)
        chose = "measuring" if tuner.choice is None else f"{tuner.choice} threads"
        best_fixed = max(best[0], best[2])  # threads only: AUTOTUNE never starts processes
        chose += f", {best[1] / best_fixed:.2f}x the best of sequential and 2 threads"
        cells = [f"{best[0]:>15.0f}"]
        cells += [f"{rate:>6.0f} ({rate / best[0]:.2f}x)" for rate in best[1:]]
        print(f"{name:<16} " + " ".join(f"{c:>15}" for c in cells) + f"  {chose}")
        reports.append(f"{name}: {variants[1].autotune_report}")
    print("\n" + "\n".join(reports))


TUNE_N, TUNE_BATCH = 1500, 64
_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
_STD = np.array([0.229, 0.224, 0.225], np.float32)


def augment(image: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Augmentation as users write it: small NumPy operations driven from Python (crop,
    flip, brightness and contrast jitter, normalisation), ~0.1 ms an image, GIL-bound."""
    rng = np.random.default_rng(int(image[0, 0, 0]) + int(label))
    padded = np.pad(image, ((4, 4), (4, 4), (0, 0)), mode="reflect")
    top, left = rng.integers(0, 9, 2)
    crop = padded[top : top + IMAGE[0], left : left + IMAGE[1]].astype(np.float32)
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    crop = crop * rng.uniform(0.8, 1.2) + rng.uniform(-20, 20)
    mean = crop.mean(axis=(0, 1), keepdims=True)
    crop = (crop - mean) * rng.uniform(0.8, 1.2) + mean
    crop = np.clip(crop, 0, 255) / 255.0
    return ((crop - _MEAN) / _STD).astype(np.float32), label


def svd_map(image: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Six 32x32 SVDs per example, one LAPACK call each (which releases the GIL)."""
    values = [
        np.linalg.svd(image[at : at + 32, at : at + 32, c].astype(np.float64), compute_uv=True)[1]
        for c in range(3)
        for at in (0, 8)
    ]
    return np.stack(values).astype(np.float32), label


def _tune_base() -> Dataset:
    images = np.random.default_rng(0).integers(0, 256, (TUNE_N, *IMAGE), dtype=np.uint8)
    return Dataset.from_tensor_slices((images, np.arange(TUNE_N, dtype=np.int32)))


TUNE_SETTINGS = {"sequential": None, "1 thread": 1, "2 threads": 2, "AUTOTUNE": -1}


def flip(image: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A cheap map (~2 us): what AUTOTUNE's machinery costs around it shows."""
    return image[:, ::-1], label


def _tuned(base: Dataset, fn: Callable, calls: int | None, batch: int | None) -> Dataset:
    ds = base.map(fn, num_parallel_calls=calls)
    return ds if batch is None else ds.batch(batch)


def _rate_of(ds: Dataset, batched: bool) -> float:
    """Images/s of one epoch (a batch counts its images)."""
    began, count = time.perf_counter(), 0
    for xb, _ in ds:
        count += len(xb) if batched else 1
    return count / (time.perf_counter() - began)


def section_autotune(args: argparse.Namespace) -> None:
    """Issue 42's rows: 1,500 40x40x3 uint8 images mapped per example, then batch(64);
    images/s of a fresh pipeline's first epoch, and of each of 4 epochs of one pipeline,
    for each setting, interleaved, best of `--passes` rounds. "rows": a cheap map and no
    batch (1,500 elements of ~30 us), where AUTOTUNE's own cost would show."""
    base = _tune_base()
    names = list(TUNE_SETTINGS)
    maps = {
        "augment": ("GIL-bound (augment)", augment, TUNE_BATCH),
        "svd": ("GIL-releasing (6 SVDs)", svd_map, TUNE_BATCH),
        "light": ("GIL-bound, light (crop, flip, normalise)", gil_bound, TUNE_BATCH),
        "rows": ("cheap map per row, no batch", flip, None),
    }
    for title, fn, batch in (maps[name] for name in args.maps.split(",")):
        fresh = {name: 0.0 for name in names}
        kept = {name: [0.0] * 4 for name in names}
        reports = {}
        for _ in range(args.passes):
            for name, calls in TUNE_SETTINGS.items():
                ds = _tuned(base, fn, calls, batch)
                fresh[name] = max(fresh[name], _rate_of(ds, batch is not None))
                if calls == -1:
                    reports["fresh"] = ds.autotune_report
            for name, calls in TUNE_SETTINGS.items():
                ds = _tuned(base, fn, calls, batch)
                for epoch in range(4):
                    kept[name][epoch] = max(kept[name][epoch], _rate_of(ds, batch is not None))
                if calls == -1:
                    reports["kept"] = ds.autotune_report
        fixed = [n for n in names if n != "AUTOTUNE"]
        best = max(fresh[n] for n in fixed)
        print(f"\n## {title}: images/s, best of {args.passes} interleaved rounds")
        print(
            f"{'setting':<12} {'fresh epoch':>12} "
            + " ".join(f"{'epoch ' + str(e + 1):>9}" for e in range(4))
        )
        for name in names:
            cells = " ".join(f"{r:>9.0f}" for r in kept[name])
            print(f"{name:<12} {fresh[name]:>12.0f} {cells}")
        seq = fresh["sequential"]
        tuned = fresh["AUTOTUNE"]
        print(f"AUTOTUNE fresh: {tuned / seq:.2f}x sequential, {tuned / best:.2f}x the best fixed")
        for against in ("sequential", "the best fixed"):
            ratios = [
                kept["AUTOTUNE"][e]
                / (
                    kept["sequential"][e]
                    if against == "sequential"
                    else max(kept[n][e] for n in fixed)
                )
                for e in range(4)
            ]
            print(
                f"AUTOTUNE kept, per epoch / {against}: " + ", ".join(f"{r:.2f}x" for r in ratios)
            )
        for when, text in reports.items():
            print(f"  {when}: {text}")


def section_images(args: argparse.Namespace) -> None:
    import tempfile
    import warnings

    import jax
    from flax import nnx
    from PIL import Image

    import phalanx

    warnings.simplefilter("ignore", phalanx.data.InputBoundWarning)  # the table says it
    (x, y), _ = phalanx.datasets.digits.load_data()
    with tempfile.TemporaryDirectory() as folder:
        for n, (image, label) in enumerate(zip(x, y, strict=True)):
            target = Path(folder) / str(int(label))
            target.mkdir(exist_ok=True)
            big = np.kron(image * 15, np.ones((4, 4))).astype(np.uint8)  # 32x32 PNGs
            Image.fromarray(big).save(target / f"{n:04d}.png")
        ds = phalanx.data.image_dataset_from_directory(
            folder,
            color_mode="grayscale",
            image_size=(32, 32),
            batch_size=64,
            seed=0,
            verbose=False,
        )
        alone = _rate(ds, args.passes)

        class CNN(nnx.Module):
            def __init__(self, rngs: nnx.Rngs):
                self.conv = nnx.Conv(1, 16, (3, 3), rngs=rngs)
                self.out = nnx.Linear(16 * 16 * 16, 10, rngs=rngs)

            def __call__(self, xb):
                xb = nnx.max_pool(jax.nn.relu(self.conv(xb / 255.0)), (2, 2), (2, 2))
                return self.out(xb.reshape(xb.shape[0], -1))

        model = phalanx.Model(CNN(nnx.Rngs(0)))
        model.compile("adam", phalanx.losses.SparseCategoricalCrossentropy(from_logits=True))
        h = model.fit(ds, epochs=1 + args.epochs, verbose=0).history
        rate = max(h["examples_per_second"][1:])
        wait = h["input_wait_fraction"][h["examples_per_second"].index(rate)]
    print(f"\n## image files: {len(x)} PNGs 32x32 -> image_dataset_from_directory, batch 64")
    print(f"{'':<28} {'examples/s':>10} {'input wait %':>12}")
    print(f"{'pipeline alone':<28} {alone:>10.0f} {'-':>12}")
    print(f"{'fit (CNN) fed by it':<28} {rate:>10.0f} {wait * 100:>12.1f}")


def tune_malloc() -> bool:
    """Keeps freed large blocks in the process (glibc only); True when it took effect."""
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(
        libc.mallopt(m_mmap_threshold, 256 << 20) and libc.mallopt(m_trim_threshold, 512 << 20)
    )


SECTIONS: dict[str, Callable[[argparse.Namespace], None]] = {
    "pipeline": section_pipeline,
    "overlap": section_overlap,
    "fit": section_fit,
    "maps": section_maps,
    "images": section_images,
    "autotune": section_autotune,
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=sorted(SECTIONS), action="append")
    parser.add_argument("--data", help="path to mnist.npz (default: $PHALANX_DATA_DIR)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per timed pass")
    parser.add_argument("--passes", type=int, default=3, help="timed passes; the best is shown")
    parser.add_argument("--step-ms", type=float, default=10.0, help="overlap: step and map")
    parser.add_argument("--tune-malloc", action="store_true", help="see the module docstring")
    parser.add_argument("--maps", default="augment,svd", help="autotune: augment,svd,light")
    args = parser.parse_args(argv)
    malloc = "tuned" if args.tune_malloc and tune_malloc() else "default"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {load:.1f}, {malloc} malloc"
    )
    for name in args.section or list(SECTIONS):
        SECTIONS[name](args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
