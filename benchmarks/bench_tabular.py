"""keras.io's TabTransformer, trained by Keras's own fit and by phalanx's: time to the first
finished step, the first epoch, the whole call and peak memory, each in a fresh process.

    python benchmarks/bench_tabular.py                   # 3 interleaved rounds, 1 device
    python benchmarks/bench_tabular.py --rounds 5 --epochs 2

The model is keras.io's "Structured data learning with TabTransformer" (examples/
structured_data/tabtransformer.py), built as the example builds it: 13 named inputs (5
numeric, 8 categorical as float indices into embeddings), 3 transformer blocks of 4-head
attention over 16-dim embeddings, a BatchNormalization + SELU MLP, a sigmoid; AdamW 1e-3
with weight decay 1e-4, binary crossentropy, binary accuracy, batches of 265, sample
weights (the census `fnlwgt` column). The data has the UCI census's shape and vocabulary
sizes (32,561 training rows, 16,281 validation rows) but random values: the benchmark
never downloads anything.

Each run is a fresh Python process with an empty compilation cache of its own, as a user's
first run is: imports and model building are not timed; the clock starts at `fit()`.
"first step" is the time from `fit()` to the end of the first batch (read from a callback
reading the loss, so the step has really run), "epoch 1" the end of the first epoch,
"whole" the return of `fit` (with validation after every epoch). Keras and phalanx runs
alternate (keras, phalanx, keras, ...) because the machine is shared; the table gives
medians and phalanx / keras for each. "phalanx (cache)" runs phalanx again on the
compilation cache its previous run left, as every run after a user's first does.

Results: `python benchmarks/bench_tabular.py --rounds 3` on 2 CPU cores, XLA:CPU, jax
0.10.2, keras 3.15.1, a quiet machine (2026-11-26 02:30 UTC); medians of 3 rounds:

| run | first step s | epoch 1 s | whole call s | peak host MiB |
|---|---:|---:|---:|---:|
| keras | 11.33 | 31.25 | 31.26 | 443 |
| phalanx | 12.86 (1.13x) | 32.53 (1.04x) | 32.57 (1.04x) | 463 (1.05x) |
| phalanx (cache) | 3.59 (0.32x) | 10.60 (0.34x) | 10.63 (0.34x) | 242 (0.55x) |

Before issue 23's last change the state's small arrays (biases, normalization scales and
their Adam moments, ~300 leaves here) travelled packed into one vector, and XLA:CPU compiled
a kernel for each one's bit cast in and out: 15.8 s to the first step against Keras's 11.9
(one run each). The final losses differ from Keras's because the shuffles differ.

On one NVIDIA H200 (jax 0.11.2, keras 3.15.1), 2026-11-26 03:39 UTC, `--rounds 2`
(medians; a `--rounds 1` run 3 minutes before gave 1.10 / 0.96 / 0.96):

| run | first step s | epoch 1 s | whole call s | peak host MiB |
|---|---:|---:|---:|---:|
| keras | 11.62 | 25.17 | 25.17 | 692 |
| phalanx | 12.38 (1.07x) | 23.01 (0.91x) | 23.05 (0.92x) | 707 (1.02x) |
| phalanx (cache) | 1.42 (0.12x) | 3.34 (0.13x) | 3.38 (0.13x) | 145 (0.21x) |

There too compiling is most of a first epoch: with the cache it takes 3.3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REGISTRY = Path(__file__).resolve().parents[1] / "tests" / "keras"
TRAIN_ROWS, TEST_ROWS, BATCH = 32_561, 16_281, 265


def child(args: argparse.Namespace) -> None:
    """One run, in this fresh process: prints one JSON line."""
    os.environ["KERAS_BACKEND"] = "jax"
    sys.path.insert(0, str(REGISTRY))
    import keras
    from bench_fit import PeakMemory
    from keras_models import census, census_compile, tabtransformer

    keras.utils.set_random_seed(0)
    x, y, w = census(TRAIN_ROWS, 1)
    validation = census(TEST_ROWS, 2)
    ends: list[float] = []
    model = tabtransformer()
    if args.child == "keras":
        model.compile(**census_compile())
        trainer, base = model, keras.callbacks.Callback
    else:
        import phalanx

        with phalanx.Strategy().scope():
            trainer = phalanx.Model(model)
            trainer.compile(**census_compile())
        base = phalanx.callbacks.Callback

    class FirstStep(base):
        def on_train_batch_end(self, batch, logs=None):
            if not ends:
                float(logs["loss"])  # the step has run
                ends.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            ends.append(time.perf_counter())

    fit = {"batch_size": BATCH, "epochs": args.epochs, "verbose": 0, "callbacks": [FirstStep()]}
    with PeakMemory() as peak:
        start = time.perf_counter()
        history = trainer.fit(
            x, y, sample_weight=w, validation_data=validation, shuffle=True, **fit
        )
        done = time.perf_counter()
    print(
        json.dumps(
            {
                "first_step": ends[0] - start,
                "epoch_1": ends[1] - start,
                "whole": done - start,
                "host_mib": peak.result["host_mib"],
                "loss": float(history.history["loss"][-1]),
            }
        )
    )


def _run(kind: str, epochs: int, cache: str | None) -> dict:
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    env["PHALANX_COMPILATION_CACHE"] = cache or "0"
    command = [sys.executable, __file__, "--child", kind, "--epochs", str(epochs)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{kind} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--child", choices=["keras", "phalanx"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    rows: dict[str, list[dict]] = {"keras": [], "phalanx": [], "phalanx (cache)": []}
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as cache:
            rows["keras"].append(_run("keras", args.epochs, None))
            rows["phalanx"].append(_run("phalanx", args.epochs, cache))
            rows["phalanx (cache)"].append(_run("phalanx", args.epochs, cache))
    keys = ("first_step", "epoch_1", "whole", "host_mib")
    medians = {
        k: {key: statistics.median(r[key] for r in v) for key in keys} for k, v in rows.items()
    }
    print(
        f"TabTransformer, {TRAIN_ROWS:,} rows, batch {BATCH}, {args.epochs} epoch(s), "
        f"median of {args.rounds} rounds\n"
    )
    print("| run | first step s | epoch 1 s | whole call s | peak host MiB | final loss |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind, median in medians.items():
        loss = statistics.median(r["loss"] for r in rows[kind])
        print(
            f"| {kind} | {median['first_step']:.2f} | {median['epoch_1']:.2f} | "
            f"{median['whole']:.2f} | {median['host_mib']:,.0f} | {loss:.4f} |"
        )
    for kind in ("phalanx", "phalanx (cache)"):
        ratios = " / ".join(
            f"{key} {medians[kind][key] / medians['keras'][key]:.2f}" for key in keys
        )
        print(f"\n{kind} / keras: {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
