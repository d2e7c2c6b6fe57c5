"""steps_per_execution over the model families (tests/model/families.py): K=1 against K>1.

    python benchmarks/bench_steps_per_execution.py                    # every family, 1 device
    python benchmarks/bench_steps_per_execution.py --families cnn --rounds 5 --devices 8

Each family trains on its synthetic task, in memory and in order
(`Dataset.from_tensor_slices(...).repeat().batch(B)`, epochs of 50 steps), with a callback
reading the loss after every execution, as a progress bar does. Variants, interleaved
round by round (the machine is shared), each a cold `fit` on a fresh model:

- `K=1`: one step per call;
- `K=auto`: `steps_per_execution='auto'` (50 steps a call; on XLA:CPU a model with a
  convolution runs them as single calls, `engine/execution.py`);
- `K=50 scan`: 50 steps in one `lax.scan`, whatever the model (the choice `auto` avoids for
  convolutions on XLA:CPU: stack-facts section 9).

Printed: the microseconds per step over the second half of the run (best round; `auto`
has decided by then: its trial times the first calls, `feeding/trial.py`), the whole
call's seconds (best round: compilation, the trial and placement included), and the
ratio of each K>1 variant's step to K=1's (> 1: slower).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REGISTRY = Path(__file__).resolve().parents[1] / "tests" / "model"
EPOCH = 50
VARIANTS = ("K=1", "K=auto", "K=50 scan")


def _fit(family, variant: str, batch: int, epochs: int) -> dict:
    import jax

    import phalanx
    from phalanx._src.train.engine import execution

    class Read(phalanx.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.ends: list[float] = []

        def on_train_batch_end(self, step, logs=None):
            self.loss = logs["loss"]
            self.ends.append(time.perf_counter())

    k = {"K=1": 1, "K=auto": "auto", "K=50 scan": 50}[variant]
    mode = execution._mode
    if variant == "K=50 scan":  # the scan, even where `auto` would not choose it
        execution._mode = lambda engine, source, batch: execution.SCAN
    try:
        strategy = phalanx.Strategy(axis_rules=family.axis_rules or None)
        with strategy.scope():
            model = phalanx.Model(family.module(0))
            model.compile("adam", family.loss, steps_per_execution=k)
        x, y = family.data(batch * EPOCH, 0)
        ds = phalanx.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)
        read = Read()
        start = time.perf_counter()
        model.fit(ds, epochs=epochs, steps_per_epoch=EPOCH, verbose=0, callbacks=[read])
        done = time.perf_counter()
    finally:
        execution._mode = mode
    per_call = EPOCH // (1 if k == 1 else EPOCH)  # executions in an epoch
    half = len(read.ends) // 2  # the second half: `auto`'s trial is over by then
    after = read.ends[half - 1 :]
    steps = (len(after) - 1) * (EPOCH // per_call)
    trial = model.engine.cache.get("trial")  # auto's measurement, if it ran
    chosen = trial.decided if trial is not None else model.engine.cache.get("mode")
    jax.clear_caches()
    return {"us": (after[-1] - after[0]) / steps * 1e6, "whole": done - start, "mode": chosen}


def child(args: argparse.Namespace) -> None:
    import warnings

    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)
    warnings.simplefilter("ignore")
    sys.path.insert(0, str(REGISTRY))
    from families import FAMILIES

    families = [f for f in FAMILIES if f.name in args.families]
    rows = []
    for round_ in range(args.rounds):
        for family in families:
            for variant in VARIANTS:
                row = _fit(family, variant, args.batch, args.epochs)
                rows.append({"family": family.name, "variant": variant, "round": round_, **row})
                print(f"# {rows[-1]}", file=sys.stderr, flush=True)
    print("RESULT " + json.dumps(rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", nargs="*", default=None)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.families is None:
        args.families = ["mlp", "resnet", "cnn", "decoder_lm", "two_heads"]
    if args.child:
        child(args)
        return 0
    cmd = [sys.executable, __file__, "--child", "--devices", str(args.devices)]
    cmd += ["--rounds", str(args.rounds), "--batch", str(args.batch)]
    cmd += ["--epochs", str(args.epochs), "--families", *args.families]
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if out.returncode:
        print(out.stderr[-3000:])
        return out.returncode
    rows = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    print(f"{args.devices} device(s), batch {args.batch}, {args.epochs} epochs of {EPOCH} steps, "
          f"best of {args.rounds} rounds")  # fmt: skip
    print("| family | K=1 us/step | K=auto us/step (mode) | / K=1 | K=50 scan us/step | / K=1 "
          "| whole s K=1 / auto / scan |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name in args.families:
        best = {}
        for variant in VARIANTS:
            mine = [r for r in rows if r["family"] == name and r["variant"] == variant]
            best[variant] = (min(r["us"] for r in mine), min(r["whole"] for r in mine),
                             mine[0]["mode"])  # fmt: skip
        one, auto, scan = (best[v] for v in VARIANTS)
        print(f"| {name} | {one[0]:,.0f} | {auto[0]:,.0f} ({auto[2]}) | {auto[0] / one[0]:.2f} | "
              f"{scan[0]:,.0f} | {scan[0] / one[0]:.2f} | "
              f"{one[1]:.2f} / {auto[1]:.2f} / {scan[1]:.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
