"""The same Keras 3 model trained by Keras's own fit and by phalanx's fit (a script).

    python benchmarks/bench_keras.py                       # 1 and 8 devices, MLP and CNN
    python benchmarks/bench_keras.py --devices 8 --rounds 2 --models mlp

Models (Keras 3 on JAX, built identically for both): the first seed's MLP (784-128-10,
batch 1024) and a small CNN (conv 3x3x32 - pool - conv 3x3x64 - pool - dense 10, 28x28x1
inputs, batch 256); Adam 1e-3, sparse categorical crossentropy from logits, random data,
no shuffle, a callback reading `logs['loss']` after every batch. Keras runs
`keras.distribution.DataParallel()` on several devices, phalanx `phalanx.Strategy()`; both
use steps_per_execution=1 and `jit_compile`. Each variant is timed over one epoch after its
own warm-up epoch, in interleaved rounds (keras, phalanx, keras, ...) because the machine is
shared. "steady" is the rate between batch ends after the first quarter of the epoch (what
a long run sees); "whole-call" includes each fit call's start-up. The table gives the best
round, the range, and phalanx / keras. Each device count
runs in its own process (CPU: fake XLA devices; on a GPU host, the local GPUs).

Results: `python benchmarks/bench_keras.py --rounds 3` on 2 CPU cores, XLA:CPU fake devices,
jax 0.10.2, keras 3.15, a quiet machine (2026-11-22 22:38 UTC); best of 3 interleaved rounds:

| dev | model | keras ex/s | range | phalanx ex/s | range | phalanx / keras | whole call |
|---|---|---|---|---|---|---|---|
| 1 | mlp | 307,937 | 281,584-307,937 | 287,972 | 245,426-287,972 | 0.94 | 0.59 |
| 1 | cnn | 1,226 | 1,019-1,226 | 1,200 | 1,130-1,200 | 0.98 | 1.01 |
| 8 | mlp | 128,364 | 114,769-128,364 | 139,650 | 116,440-139,650 | 1.09 | 0.52 |
| 8 | cnn | 2,922 | 2,076-2,922 | 2,705 | 2,296-2,705 | 0.93 | 0.94 |

The whole-call gap on the MLP is phalanx's fixed cost per `fit` call (placing the arrays on
every device), paid once per call; the steady rate is what a long run sees.

One H100 80GB HBM3 (jax 0.11.2, keras 3.15.1; 2026-11-23 01:55 UTC):
`python benchmarks/bench_keras.py --devices 1 --rounds 3`

| dev | model | keras ex/s | range | phalanx ex/s | range | phalanx / keras | whole call |
|---|---|---|---|---|---|---|---|
| 1 | mlp | 1,073,932 | 855,431-1,073,932 | 2,753,720 | 1,670,304-2,753,720 | 2.56 | 1.23 |
| 1 | cnn | 218,864 | 130,755-218,864 | 313,140 | 226,292-313,140 | 1.43 | 1.17 |
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SHAPES = {"mlp": {"batch": 1024, "steps": 50}, "cnn": {"batch": 256, "steps": 20}}


def _build(name: str):
    import keras

    if name == "mlp":
        layers = [keras.Input((784,)), keras.layers.Dense(128, "relu"), keras.layers.Dense(10)]
    else:
        layers = [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    return keras.Sequential(layers)


def _data(name: str):
    import numpy as np

    rows = SHAPES[name]["batch"] * SHAPES[name]["steps"]
    rng = np.random.default_rng(0)
    shape = (rows, 784) if name == "mlp" else (rows, 28, 28, 1)
    return rng.random(shape, dtype=np.float32), rng.integers(0, 10, rows, dtype=np.int32)


def _timer_callback(base):
    class ReadLoss(base):
        def __init__(self):
            super().__init__()
            self.loss = None
            self.ends: list[float] = []

        def on_train_batch_end(self, batch, logs=None):
            self.loss = float(logs["loss"])  # a progress bar's read-back, every step
            self.ends.append(time.perf_counter())

        def steady(self, batch: int) -> float:
            """ex/s between batch ends, after the first quarter of the epoch (no fit
            start-up cost, no first-step effects)."""
            ends = self.ends[len(self.ends) // 4 :]
            return batch * (len(ends) - 1) / (ends[-1] - ends[0])

    return ReadLoss()


def _compile(model):
    import keras

    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=1,
    )


def run_keras(name: str, weights, x, y) -> tuple[float, float]:
    import jax
    import keras

    if jax.device_count() > 1:
        keras.distribution.set_distribution(keras.distribution.DataParallel())
    model = _build(name)
    model.set_weights(weights)
    _compile(model)
    batch = SHAPES[name]["batch"]
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)  # warm-up
    callback = _timer_callback(keras.callbacks.Callback)
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    whole = len(x) / (time.perf_counter() - start)
    keras.distribution.set_distribution(None)
    return callback.steady(batch), whole


def run_phalanx(name: str, weights, x, y) -> tuple[float, float]:
    import phalanx

    strategy = phalanx.Strategy()
    with strategy.scope():
        keras_model = _build(name)
        keras_model.set_weights(weights)
        model = phalanx.Model(keras_model)
        _compile(model)
    batch = SHAPES[name]["batch"]
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)  # warm-up
    callback = _timer_callback(phalanx.callbacks.Callback)
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    return callback.steady(batch), len(x) / (time.perf_counter() - start)


def child(args: argparse.Namespace) -> None:
    import warnings

    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)  # CPU only: fake devices
    warnings.simplefilter("ignore")
    rows = []
    for name in args.models:
        x, y = _data(name)
        weights = _build(name).get_weights()
        for round_ in range(args.rounds):
            for variant, fn in (("keras", run_keras), ("phalanx", run_phalanx)):
                rate, whole = fn(name, weights, x, y)
                rows.append(
                    {"model": name, "variant": variant, "round": round_, "rate": rate,
                     "whole": whole}
                )  # fmt: skip
                print(f"# {args.devices} dev {name} {variant}: {rate:,.0f} ex/s", file=sys.stderr)
    print("RESULT " + json.dumps({"devices": jax.device_count(), "rows": rows}))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="*", default=None)
    parser.add_argument("--models", nargs="*", default=["mlp", "cnn"], choices=sorted(SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.devices = args.devices[0]
        child(args)
        return 0
    print("| devices | model | keras fit ex/s (best) | range | phalanx fit ex/s (best) | range "
          "| phalanx / keras | whole-call keras | whole-call phalanx | ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    env = {**os.environ, "KERAS_BACKEND": "jax", "PHALANX_COMPILATION_CACHE": "0"}
    for devices in args.devices or [1, 8]:
        cmd = [sys.executable, __file__, "--child", "--devices", str(devices)]
        cmd += ["--rounds", str(args.rounds), "--models", *args.models]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if out.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
        result = json.loads(line[7:])
        for name in args.models:
            rates = {
                v: [r["rate"] for r in result["rows"] if r["model"] == name and r["variant"] == v]
                for v in ("keras", "phalanx")
            }
            whole = {
                v: max(
                    r["whole"] for r in result["rows"] if r["model"] == name and r["variant"] == v
                )
                for v in ("keras", "phalanx")
            }
            k, p = rates["keras"], rates["phalanx"]
            print(
                f"| {result['devices']} | {name} | {max(k):,.0f} | {min(k):,.0f}-{max(k):,.0f} | "
                f"{max(p):,.0f} | {min(p):,.0f}-{max(p):,.0f} | {max(p) / max(k):.2f} | "
                f"{whole['keras']:,.0f} | {whole['phalanx']:,.0f} | "
                f"{whole['phalanx'] / whole['keras']:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
