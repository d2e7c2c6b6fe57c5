"""Step time of `fit` with a checkpoint every 20 steps: none, asynchronous, synchronous.

    python benchmarks/bench_checkpoint.py              # 3 interleaved rounds, 1 device
    python benchmarks/bench_checkpoint.py --rounds 5 --steps 400 --save-every 100

The workload is the first seed's MLP (784-128-10, Adam 1e-3, global batch 1024, one
device, `steps_per_execution=1`) on random in-memory data, `--steps` steps per `fit`, after
a warm-up `fit` that compiles. "async" is `ModelCheckpoint(save_freq=20)` (`--save-every`;
Orbax writes in a background thread while training goes on); "sync" is the same callback
with a checkpointer that waits for every save to be on disk. The variants run interleaved
because the machine is shared; the table gives the best round's ms/step and, in brackets,
the range. "CPU ms/step" is the process's CPU time (every thread: XLA's, Orbax's, the
writer's) per step in its least round, and "CPU ms/save" what one save adds to it: unlike
wall time, it hardly depends on the other jobs on the machine.

Results, `python benchmarks/bench_checkpoint.py --steps 600`, 2026-11-23 01:19-01:22 UTC,
2 CPU cores (load average 2-3, mostly this benchmark), jax 0.10.2, orbax-checkpoint 0.12.8,
two processes per version, run alternately. "before" is commit a05e575 (Orbax wrote each
of the state's 17 leaves as an array; the loop made 17 eager copies per save), "after" packs
the replicated leaves into one array per dtype in one compiled call (`checkpoint_layout`):

    version  variant   ms/step (best) [range]   vs none   CPU ms/step (least)   CPU ms/save
    before   none        3.34 [3.34-3.73]        +0.0 %     6.13
    before   async       5.48 [5.48-7.11]       +63.8 %     9.48                  67.0
    before   sync        5.94 [5.94-7.11]       +77.6 %     9.07                  58.7
    after    none        3.03 [3.03-3.39]        +0.0 %     5.67
    after    async       4.52 [4.52-5.16]       +49.3 %     7.75                  41.7
    after    sync        4.50 [4.50-5.27]       +48.7 %     7.20                  30.7
    before   none        3.50 [3.50-4.33]        +0.0 %     6.37
    before   async       5.19 [5.19-5.83]       +48.0 %     9.17                  56.0
    before   sync        5.63 [5.63-6.44]       +60.5 %     8.70                  46.7
    after    none        3.80 [3.80-5.04]        +0.0 %     7.13
    after    async       5.31 [5.31-7.05]       +39.7 %     9.25                  42.3
    after    sync        6.10 [6.10-6.73]       +60.5 %     9.50                  47.3

Over all 11 such pairs (01:04-01:31 UTC, load 2-8) a save cost 44-87 ms of CPU before
(median 61) and 36-50 after (median 42); at that load the wall-time overhead of async was
too noisy to rank (+1..+93 % before, +21..+100 % after). With `--save-every 100`: async
+19.2 % before, +12.1 % after (sync +8.7 %).

The 5 % target is out of reach on this host, and why, measured:
- Training alone keeps both cores busy: 5.7-6.4 ms of CPU per 3.0-3.5 ms step (XLA's
  intra-op threads and the loop). There is no idle core for the writer; its CPU is taken
  from the steps.
- Orbax costs 22-30 ms of CPU per save of 2-3 small arrays on a quiet loop (a save starts
  ~11 asyncio event loops and ~20 threads, opens tensorstore, writes metadata, commits by
  a rename; each further array adds ~1.3 ms), ~42 ms inside `fit`. A save every 20 steps is
  one per 60-70 ms, 120-140 ms of CPU on 2 cores: 42 ms is 30-35 % of it before any
  interference. 5 % needs at most 6-7 ms of CPU per save. No Orbax option tried (no
  OCDBT, the record as custom metadata instead of a JSON item, no root metadata,
  synchronous directory creation, a single item instead of a Composite) saved more than
  the noise (~5 ms).
- Contention explains most of the rest: another process burning 42 ms of CPU every 70 ms
  slowed training without checkpoints by 27 % (3.42 -> 4.36 ms/step). The remaining ~15
  points are interference inside the process. A shorter GIL switch interval (0.5 ms:
  +45.6 % vs +45.3 %) did not help, and lowering the writer thread's priority (nice 10,
  inherited by Orbax's threads) made it worse (+37..+42 % vs +9..+35 %): starved, the
  writer holds the GIL the loop waits for.
- The training thread itself spends 1.5-2.7 ms per save (one dispatch of the packing call,
  0.1-0.2 ms; starting the writer thread ~1 ms; the previous save is done by then), down
  from 4.5-20 ms (17 copies, then waiting for a previous save still being written).

On an accelerator host the steps leave the cores to the writer, but the MLP's step is then
far shorter than a 30 ms save: there a save every 20 steps would be limited by Orbax's
throughput (`save` waits for the previous save), so choose the interval by time.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any


def _setup():
    import jax
    import numpy as np
    import optax
    from flax import nnx

    import phalanx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.hidden = nnx.Linear(784, 128, rngs=rngs)
            self.out = nnx.Linear(128, 10, rngs=rngs)

        def __call__(self, x):
            return self.out(jax.nn.relu(self.hidden(x)))

    rng = np.random.default_rng(0)
    x = rng.random((1024 * 50, 784), dtype=np.float32)
    y = rng.integers(0, 10, 1024 * 50, dtype=np.int32)
    ds = phalanx.data.Dataset.from_tensor_slices((x, y)).repeat().batch(1024)
    with phalanx.Strategy(devices=jax.devices()[:1]).scope():
        model = phalanx.Model(MLP(nnx.Rngs(0)))
        model.compile(
            optax.adam(1e-3),
            phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=1,
        )
    return model, ds


def _callbacks(variant: str, directory: str, every: int):
    import phalanx
    from phalanx._src.train.checkpoint import TrainCheckpointer

    class SyncCheckpoint(phalanx.callbacks.ModelCheckpoint):
        def on_train_begin(self, logs=None):
            super().on_train_begin(logs)
            self._checkpointer.close()
            self._checkpointer = TrainCheckpointer(
                self.directory, max_to_keep=self.max_to_keep, asynchronous=False
            )

    if variant == "none":
        return []
    kind = SyncCheckpoint if variant == "sync" else phalanx.callbacks.ModelCheckpoint
    return [kind(directory, save_freq=every, max_to_keep=2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-every", type=int, default=20, help="steps between saves")
    parser.add_argument("--writers", action="store_true", help="CPU per save of each writer")
    args = parser.parse_args()
    import phalanx.cluster

    phalanx.cluster.resolve("cpu", cpu_devices=1)
    if args.writers:
        writers()
        return
    model, ds = _setup()
    model.fit(ds, epochs=1, steps_per_epoch=args.steps, verbose=0)  # compile, warm caches
    variants = ("none", "async", "sync")
    times: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for variant in variants:
            with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
                callbacks = _callbacks(variant, tmp, args.save_every)
                start, start_cpu = time.perf_counter(), _cpu_seconds()
                model.fit(ds, epochs=1, steps_per_epoch=args.steps, verbose=0, callbacks=callbacks)
                # on_train_end waited for the last save
                elapsed, used = time.perf_counter() - start, _cpu_seconds() - start_cpu
            times[variant].append(1000 * elapsed / args.steps)
            cpu[variant].append(1000 * used / args.steps)
    best = {v: min(t) for v, t in times.items()}
    least = {v: min(c) for v, c in cpu.items()}
    print(f"fit, {args.steps} steps, a save every {args.save_every} steps, {args.rounds} rounds")
    print("variant   ms/step (best) [range]   vs none   CPU ms/step (least)   CPU ms/save")
    for v in variants:
        lo, hi = min(times[v]), max(times[v])
        ratio = best[v] / best["none"]
        per_save = args.save_every * (least[v] - least["none"])
        print(
            f"{v:8s}  {best[v]:6.2f} [{lo:.2f}-{hi:.2f}]    {100 * (ratio - 1):+5.1f} %"
            f"   {least[v]:6.2f}                {per_save:6.1f}"
        )


def writers(saves: int = 30) -> None:
    """CPU per save of the MLP's packed state (two arrays) for each way of writing it, alone
    (no training), each save waited for."""
    import shutil

    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    from phalanx._src.train.checkpoint_files import Files, to_host
    from phalanx._src.train.checkpoint_layout import Layout

    model, _ = _setup()
    layout = Layout.of(model._state)
    arrays = layout.pack(jax.tree.leaves(model._state))
    meta = {"record": {"epoch": 0}, "layout": layout.describe()}
    sizes = {k: int(np.prod(v.shape)) for k, v in arrays.items()}
    print(f"{len(arrays)} arrays, {sizes} elements; {saves} saves each, max_to_keep=2")
    with tempfile.TemporaryDirectory(prefix="bench-writers-") as tmp:

        def manager(name: str) -> Any:
            return ocp.CheckpointManager(
                os.path.join(tmp, name),
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=2, enable_async_checkpointing=True, create=True,
                    enable_background_delete=True,
                ),
            )  # fmt: skip

        composite, json_only = manager("composite"), manager("json")
        bare = ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler())
        files = Files(os.path.join(tmp, "files"))

        def orbax_composite(step: int) -> None:
            args = ocp.args.Composite(
                state=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)
            )
            composite.save(step, args=args, force=True)
            composite.wait_until_finished()

        def orbax_json_only(step: int) -> None:
            json_only.save(step, args=ocp.args.Composite(meta=ocp.args.JsonSave(meta)), force=True)
            json_only.wait_until_finished()

        def orbax_bare(step: int) -> None:
            path = os.path.join(tmp, "bare", str(step))
            bare.save(path, args=ocp.args.StandardSave(arrays))
            bare.wait_until_finished()
            shutil.rmtree(os.path.join(tmp, "bare", str(step - 2)), ignore_errors=True)

        def phalanx_files(step: int) -> None:
            host, keys = to_host(arrays)
            files.write(step, host, {**meta, "keys": keys})
            for old in files.steps()[:-2]:
                files.delete(old)

        ways = {
            "Orbax CheckpointManager, StandardSave + JsonSave (async)": orbax_composite,
            "Orbax CheckpointManager, the JSON item alone": orbax_json_only,
            "Orbax AsyncCheckpointer(StandardCheckpointHandler)": orbax_bare,
            "phalanx files: raw bytes + JSON, fsync, rename": phalanx_files,
        }
        print("| writer | CPU ms per save | wall ms per save |\n|---|---|---|")
        for name, save in ways.items():
            save(0)
            start, start_cpu = time.perf_counter(), _cpu_seconds()
            for step in range(1, saves + 1):
                save(step)
            wall, used = time.perf_counter() - start, _cpu_seconds() - start_cpu
            print(f"| {name} | {1000 * used / saves:.1f} | {1000 * wall / saves:.1f} |")
        composite.close()
        json_only.close()
        bare.close()


def _cpu_seconds() -> float:
    """CPU time of all of this process's threads (XLA's, Orbax's and the writer's too)."""
    t = os.times()
    return t.user + t.system


if __name__ == "__main__":
    main()
