"""Issue 21's Keras families (tests/keras/keras_models.py FAMILIES): how far phalanx's
numbers are from Keras's own fit / evaluate, and the epoch time of each on one device.

    python benchmarks/bench_keras_families.py                  # every family
    python benchmarks/bench_keras_families.py --families bidirectional_lstm --rounds 3

Numbers: each family's test configuration (44 or 48 rows, batches of 8, 1 epoch, the same
initial weights and seed states, shuffle=False) on 1 device and on 8 (fake CPU devices on
a CPU host); "loss diff" is the largest absolute difference of the fit and evaluate loss
against Keras's, "metric diff" the same over the other logged metrics.

Time: one epoch of 4096 rows in batches of 64 (64 steps) on one device (and, for the
families in --time-on-all, on every device: Keras with `keras.distribution.DataParallel()`),
after a warm-up epoch, Keras's `fit` against phalanx's `fit`, interleaved rounds (the
machine is shared), best round each. Each device count runs in its own process.

Results: `python benchmarks/bench_keras_families.py --rounds 3` on 2 shared CPU cores
(load ~3-4), XLA:CPU, jax 0.10.2, keras 3.15.1 (2026-11-25 17:40 UTC). Loss and metric
differences are against Keras's own fit + evaluate; times are one 64-step epoch:

| family | loss diff 1 dev / 8 dev | metric diff | keras s | phalanx s | ratio |
|---|---|---|---|---|---|
| add_loss | 0 / 2.4e-07 | 0 | 0.037 | 0.026 | 0.69 |
| batch_norm | 0 / 0 | 0 | 0.022 | 0.022 | 0.99 |
| bidirectional_lstm | 0 / 0 | 0 | 0.047 | 0.062 | 1.32 |
| conv_regularizer | 0 / 0 | 0 | 0.030 | 0.032 | 1.06 |
| dense_regularizers (+ Dropout) | 1.2e-07 / 1.2e-07 | 0 | 0.027 | 0.036 | 1.31 |
| distiller | 5.4e-07 / 1.5e-06 | 0 | 0.026 | 0.031 | 1.20 |
| embedding_regularizer | 0 / 1.2e-07 | 0 | 0.028 | 0.032 | 1.13 |
| multi_head_attention | 0 / 0 | 0 | 0.035 | 0.050 | 1.43 |
| named_inputs_weighted | 0 / 2.4e-07 | 0 | 0.032 | 0.041 | 1.29 |

These models are tiny (a step is 0.3-1 ms), so the times measure per-step overhead and
vary by ±40 % between runs on the shared machine (an earlier run under load ~10 gave the
LSTM 0.84 and 0.50). The Bidirectional LSTM on 8 fake devices: Keras with DataParallel
0.805 s, phalanx 0.647 s (0.80): both are ~15x their one-device time, because each of the
8 fake devices runs the LSTM's sequential `lax.scan` (forward and backward) in its own
thread on 2 cores, and the gradient all-reduce is a rendezvous of those 8 threads every
step; the "6x" seen before compared phalanx on 8 fake devices with Keras on one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REGISTRY = Path(__file__).resolve().parents[1] / "tests" / "keras"
TIME_ROWS, TIME_BATCH = 4096, 64


def _differences(name: str, strategy) -> tuple[float, float]:
    import numpy as np
    from keras_models import FAMILIES
    from test_keras_families import run_family

    runs = run_family(name, {"phalanx": strategy})
    _, _, (expected, theirs, _) = next(runs)
    _, _, (history, ours, _) = next(runs)
    loss = max(
        np.max(np.abs(np.subtract(history["loss"], expected["loss"]))),
        abs(ours["loss"] - theirs["loss"]),
    )
    metric = 0.0
    for key in set(expected) - {"loss"}:
        metric = max(metric, np.max(np.abs(np.subtract(history[key], expected[key]))))
        metric = max(metric, abs(ours[key] - theirs[key]))
    assert FAMILIES[name]
    return float(loss), float(metric)


def _epoch_seconds(name: str, rounds: int) -> tuple[float, float]:
    import jax
    import keras
    from keras_models import FAMILIES, same_initial_state

    import phalanx

    build, data, arguments, _ = FAMILIES[name]
    x, y, *weights = data(TIME_ROWS)
    sample_weight = weights[0] if weights else None
    fit = dict(batch_size=TIME_BATCH, epochs=1, shuffle=False, verbose=0)
    initial = build()
    if jax.device_count() > 1:  # Keras on the same devices: its own data parallelism
        keras.distribution.set_distribution(keras.distribution.DataParallel())
    reference = build()
    same_initial_state(reference, initial)
    reference.compile(**arguments())
    with phalanx.Strategy().scope():
        mine = build()
        same_initial_state(mine, initial)
        model = phalanx.Model(mine)
        model.compile(**arguments())
    times: dict[str, list[float]] = {"keras": [], "phalanx": []}
    for round_ in range(rounds + 1):  # round 0 warms up (compiles)
        for label, fit_fn in (("keras", reference.fit), ("phalanx", model.fit)):
            start = time.perf_counter()
            fit_fn(x, y, sample_weight=sample_weight, **fit)
            if round_:
                times[label].append(time.perf_counter() - start)
    keras.distribution.set_distribution(None)
    return min(times["keras"]), min(times["phalanx"])


def child(args: argparse.Namespace) -> None:
    import warnings

    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)  # CPU only: fake devices
    warnings.simplefilter("ignore")
    sys.path.insert(0, str(REGISTRY))  # the families live beside their tests
    import phalanx

    rows = []
    for name in args.families:
        loss, metric = _differences(name, phalanx.Strategy())
        row = {"family": name, "loss": loss, "metric": metric}
        if args.devices == 1 or name in args.time_on_all:
            row["keras_s"], row["phalanx_s"] = _epoch_seconds(name, args.rounds)
        rows.append(row)
        print(f"# {args.devices} dev {row}", file=sys.stderr)
    print("RESULT " + json.dumps({"devices": jax.device_count(), "rows": rows}))


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REGISTRY))
    os.environ.setdefault("KERAS_BACKEND", "jax")
    from keras_models import FAMILIES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="*", default=sorted(FAMILIES), choices=FAMILIES)
    parser.add_argument("--devices", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--time-on-all", nargs="*", default=["bidirectional_lstm"], help="also timed on N dev"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.devices = args.devices[0]
        child(args)
        return 0
    env = {**os.environ, "KERAS_BACKEND": "jax", "PHALANX_COMPILATION_CACHE": "0"}
    results = {}
    for devices in args.devices:
        cmd = [sys.executable, __file__, "--child", "--devices", str(devices)]
        cmd += ["--rounds", str(args.rounds), "--families", *args.families]
        cmd += ["--time-on-all", *args.time_on_all]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if out.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
        results[devices] = {r["family"]: r for r in json.loads(line[7:])["rows"]}
    print("| family | devices | loss diff | metric diff | keras s | phalanx s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name in args.families:
        for devices, rows in results.items():
            row = rows[name]
            timing = "| | |"
            if "keras_s" in row:
                ratio = row["phalanx_s"] / row["keras_s"]
                timing = f"{row['keras_s']:.3f} | {row['phalanx_s']:.3f} | {ratio:.2f}"
            print(f"| {name} | {devices} | {row['loss']:.1e} | {row['metric']:.1e} | {timing} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
