"""fit's examples/s next to a hand-written jitted JAX loop on the same data (a script).

    python benchmarks/bench_fit.py                  # 1 and 8 devices, K = 1 and 50
    python benchmarks/bench_fit.py --devices 8 --steps-per-execution 50 --passes 2
    python benchmarks/bench_fit.py --cnn           # steps_per_execution on a convnet (CPU)

The model is the first seed's MLP (784-128-10, Adam, global batch 1024) on MNIST (found
through $PHALANX_DATA_DIR; random data of the same shape stands in when it is absent). Both
loops shuffle every epoch, gather each batch from host memory, put it on the devices sharded
over the data axis and run one compiled step (or K steps in one `lax.scan`). The hand-written
loop is what a careful JAX user writes: no metrics, no callbacks, no padding, no prefetch
thread. `fit` additionally tracks loss and accuracy, pads, prefetches, measures input wait.

Each device count runs in its own process (the count is fixed when JAX starts). Numbers are
examples/s over whole epochs after a warm-up epoch, best of --passes; only the ratio
measured in one run means much on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

BATCH = 1024
EPOCH_STEPS = 58  # 60000 // 1024: whole batches only, for both loops
METRICS = ["accuracy"]


def _data():
    import numpy as np

    path = os.path.join(os.environ.get("PHALANX_DATA_DIR", ""), "mnist.npz")
    if os.path.exists(path):
        with np.load(path) as f:
            x = f["x_train"].reshape(60000, 784).astype(np.float32) / 255.0
            return x, f["y_train"].astype(np.int32)
    rng = np.random.default_rng(0)
    return rng.random((60000, 784), dtype=np.float32), rng.integers(0, 10, 60000, dtype=np.int32)


def _module():
    import jax
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(784, 128, rngs=rngs)
            self.l2 = nnx.Linear(128, 10, rngs=rngs)

        def __call__(self, x):
            return self.l2(jax.nn.relu(self.l1(x)))

    return MLP(nnx.Rngs(0))


def hand_written(x, y, k: int, epochs: int) -> float:
    """Examples/s of a plain jitted data-parallel loop (best epoch after warm-up)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    repl = NamedSharding(mesh, P())
    data = NamedSharding(mesh, P("data") if k == 1 else P(None, "data"))
    graphdef, params = nnx.split(_module())
    tx = optax.adam(1e-3)
    state = jax.device_put((params, tx.init(params)), repl)

    def step(state, xb, yb):
        params, opt_state = state

        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(xb)
            return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    if k == 1:
        run = jax.jit(step, donate_argnums=0)
    else:

        def run(state, xs, ys):
            return jax.lax.scan(lambda s, b: step(s, *b), state, (xs, ys))

        run = jax.jit(run, donate_argnums=0)
    rng = np.random.default_rng(0)
    best = 0.0
    for _ in range(epochs):
        order = rng.permutation(len(x))
        start = time.perf_counter()
        losses = []
        for first in range(0, EPOCH_STEPS, k):
            count = min(k, EPOCH_STEPS - first)
            if count < k:
                break  # the scan is compiled for K steps; a user would drop the remainder
            idx = order[first * BATCH : (first + count) * BATCH]
            xb, yb = x[idx], y[idx]
            if k > 1:
                xb, yb = xb.reshape(k, BATCH, 784), yb.reshape(k, BATCH)
            state, loss = run(state, jax.device_put(xb, data), jax.device_put(yb, data))
            losses.append(loss)
            if len(losses) > 8:  # bound the calls in flight (XLA:CPU collective deadlock)
                losses.pop(0).block_until_ready()
        jax.block_until_ready(losses)
        steps = len(range(0, EPOCH_STEPS - EPOCH_STEPS % k, k)) * k if k > 1 else EPOCH_STEPS
        best = max(best, steps * BATCH / (time.perf_counter() - start))
    del jnp
    return best


def with_fit(x, y, k: int, epochs: int) -> tuple[float, float]:
    """Examples/s of phalanx's fit (best epoch after the first) and its input-wait share."""
    import warnings

    import phalanx

    warnings.simplefilter("ignore", phalanx.data.InputBoundWarning)
    strategy = phalanx.Strategy()
    with strategy.scope():
        model = phalanx.Model(_module())
        model.compile(
            "adam",
            phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=METRICS,
            steps_per_execution=k,
        )
    ds = phalanx.data.Dataset.from_tensor_slices((x, y)).shuffle(60000, seed=0).repeat()
    ds = ds.batch(BATCH)
    history = model.fit(ds, epochs=epochs, steps_per_epoch=EPOCH_STEPS, verbose=0)
    rates = history.history["examples_per_second"][1:]
    best = max(range(len(rates)), key=rates.__getitem__)
    return rates[best], history.history["input_wait_fraction"][1:][best]


def cnn_modes() -> None:
    """The XLA:CPU convnet trap: fit's chosen K-step mode against a forced `lax.scan`."""
    import warnings

    import phalanx
    from phalanx._src.cli.train import build_module

    warnings.simplefilter("ignore", phalanx.data.InputBoundWarning)
    x, y = _data()
    ds = phalanx.data.Dataset.from_tensor_slices((x[:1024], y[:1024])).batch(128)
    print(f"{'convnet, 1 device, batch 128':<32} {'mode':>6} {'ex/s':>8}")
    for k, forced in ((1, None), (4, None), (4, "scan")):
        model = phalanx.Model(build_module("cnn", 0))
        model.compile(
            "adam",
            phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=k,
        )
        if forced:  # what a plain lax.scan would do; fit itself never picks this on CPU
            model._compiled_fns["mode"] = forced
        rates = model.fit(ds, epochs=2, verbose=0).history["examples_per_second"]
        mode = forced or model._compiled_fns.get("mode", "single")
        label = f"steps_per_execution={k}" + (" (forced)" if forced else "")
        print(f"{label:<32} {mode:>6} {rates[-1]:>8,.0f}", flush=True)


def child(args: argparse.Namespace) -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", args.devices[0])
    x, y = _data()
    rows = []
    for k in args.steps_per_execution:
        for _ in range(args.passes):
            hand = hand_written(x, y, k, args.epochs)
            fit, wait = with_fit(x, y, k, args.epochs)
            rows.append(
                {"devices": jax.device_count(), "k": k, "hand": hand, "fit": fit, "wait": wait}
            )
    print("RESULT " + json.dumps(rows))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, action="append")
    parser.add_argument("--steps-per-execution", type=int, action="append")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cnn", action="store_true", help="only the convnet K-step modes")
    args = parser.parse_args(argv)
    if args.cnn:
        cnn_modes()
        return 0
    args.steps_per_execution = args.steps_per_execution or [1, 50]
    if args.child:
        child(args)
        return 0
    print(
        f"{'devices':>7} {'K':>3} {'hand-written ex/s':>18} {'fit ex/s':>10} {'ratio':>6} "
        f"{'fit input wait':>14}"
    )
    for devices in args.devices or [1, 8]:
        cmd = [
            sys.executable,
            __file__,
            "--child",
            "--devices",
            str(devices),
            "--epochs",
            str(args.epochs),
            "--passes",
            str(args.passes),
        ]
        for k in args.steps_per_execution:
            cmd += ["--steps-per-execution", str(k)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        rows = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])
        best: dict[int, dict] = {}
        for row in rows:  # best pass per K, each loop on its own
            b = best.setdefault(row["k"], dict(row))
            b["hand"], b["fit"] = max(b["hand"], row["hand"]), max(b["fit"], row["fit"])
            if row["fit"] >= b["fit"]:
                b["wait"] = row["wait"]
        for k, row in sorted(best.items()):
            print(
                f"{devices:>7} {k:>3} {row['hand']:>18,.0f} {row['fit']:>10,.0f} "
                f"{row['fit'] / row['hand']:>6.2f} {100 * row['wait']:>13.0f}%",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
