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

Results on 2 CPU cores (jax 0.10.2, orbax-checkpoint 0.12.8), 2026-11-24 04:58-05:27 UTC,
`python benchmarks/bench_checkpoint.py --steps 600 --rounds 5`, two runs each:

    version                            variant  ms/step (best) [range]  vs none  CPU ms/save
    Orbax, packed (the last session)   async    4.52 [4.52-5.16]       +49.3 %   41.7
    files, a thread per save           async    3.40 [3.40-3.79]        +5.5 %    3.0
    files, the thread lingers          async    3.43 [3.43-3.66]        +5.3 %    5.0
                                       async    3.36 [3.36-3.85]        +4.3 %    3.7
    files, written from their buffers  async    3.34 [3.34-3.51]        +4.1 %    4.0
                                       async    3.35 [3.35-3.38]        +3.5 %    3.3
                                       sync     3.48 [3.48-3.55]        +7.6 %    1.7

(the "none" rows of these runs: 3.21-3.26 ms/step). CPU per save of each writer alone,
`python benchmarks/bench_checkpoint.py --writers` (the MLP's packed state: 2 arrays,
305,315 elements, 30 saves each, each waited for):

| writer | CPU ms per save | wall ms per save |
|---|---|---|
| Orbax CheckpointManager, StandardSave + JsonSave (async) | 46.3 | 40.6 |
| Orbax CheckpointManager, the JSON item alone | 16.7 | 14.6 |
| Orbax AsyncCheckpointer(StandardCheckpointHandler) | 34.0 | 32.3 |
| phalanx files: raw bytes + JSON, fsync, rename | 1.7 | 4.8 |

Why one process writes files, not Orbax: training alone keeps both cores busy (6.2 ms of
CPU per 3.2 ms step), so a save's CPU is taken from the steps, and a save every 20 steps is
one per ~65 ms: 5 % allows ~3 ms of CPU per save. No Orbax route comes near (the manager's
own bookkeeping with no array costs 17 ms; the last session also tried no OCDBT, the record
as custom metadata, no root metadata, synchronous directory creation and a single item,
none below ~22 ms). The files path spends ~1.7 ms (write, fsync, rename, pruning), the
training thread ~0.6 ms (one dispatch of the packing call, the record), and the rest is
the packing copy on the devices and contention. Starting a writer thread per save cost the
training thread ~1 ms more (`start()` waits for the new thread, which then holds the
interpreter while it writes): the thread now waits 0.5 s for the next save. Several
processes still write with Orbax (each its own shards, one commit): there the ~30-45 ms per
save stands, and the save interval should be chosen by time.
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
    from phalanx._src.train.checkpoint.checkpointer import TrainCheckpointer

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

    from phalanx._src.train.checkpoint.files import Files, to_host
    from phalanx._src.train.checkpoint.layout import Layout

    model, _ = _setup()
    layout = Layout.of(model.engine.state)
    arrays = layout.pack(jax.tree.leaves(model.engine.state))
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
