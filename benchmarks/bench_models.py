"""The seeds' model families: phalanx `fit` beside a hand-written jitted NNX loop (a script).

    python benchmarks/bench_models.py                          # both models, preset by backend
    python benchmarks/bench_models.py --model lm --precision mixed_bfloat16 --preset full
    python benchmarks/bench_models.py --preset cpu --steps 5 --peak-tflops 1.0

Models (issue 7, item 6):
- `resnet50`: ResNet-50 v1.5 (bottleneck stages 3-4-6-3, nnx.BatchNorm), 224x224 RGB,
  1000 classes, global batch 256, SGD with momentum. Throughput in images/s; model FLOPs per
  image are 3x the forward pass's (XLA's cost analysis of the lowered forward).
- `lm`: a decoder LM, 12 layers, d 2048, 16 heads, MLP 4d, vocabulary 32,768 (738M
  parameters), sequence 1024, batch 16, AdamW; stock `nnx.Embed` (no `dtype`), so that under
  'mixed_bfloat16' it shows whether the policy reaches the embedding (and with it the
  residual stream). Throughput in tokens/s; model FLOPs per token 6N + 12*L*d*T, N the
  parameters apart from the input embedding (the convention of the issue's MFU figures).

Each model runs two ways, each in its own process (so that peak memory is its own):
- `fit`: `phalanx.Model(module).compile(optimizer, loss, precision=...)` then `fit` on NumPy
  arrays, as a user writes it (`verbose=0`).
- `hand`: what a careful JAX user writes: the same module class and weights, built with
  every layer's `dtype` set to the compute dtype; one `jax.jit` step (donated state,
  `nnx.split`/`merge`, `optax`), the batches already on the devices.

Columns: throughput, MFU (against `--peak-tflops`, else phalanx's table of dense peaks by
device kind; none for CPUs), steady step time (the median of per-step times after
`--warmup` steps), compile time (the first step, compile included, from the model's
construction), peak device memory (`memory_stats()['peak_bytes_in_use']`; XLA:CPU reports
none).

Results, CPU presets (`--preset cpu`: ResNet stages 1-1-1-1 width 16 at 32x32, batch 32;
LM 2 layers, d 128, seq 128, batch 8, vocab 512), 1 XLA:CPU device on 2 cores shared with ~9
other jobs (load ~9), so the times are noisy and show only that every path runs; XLA:CPU has
no bfloat16 units and no peak in the table (no MFU). 2026-11-22 21:53 UTC, jax 0.10.2, flax
0.12.8: `python benchmarks/bench_models.py --preset cpu --precision P --steps 10`

    model     way   precision               throughput  TFLOP/s     MFU    step ms compile s
    resnet50  hand  float32                769.3 img/s    0.010    n/a       41.6       6.6
    resnet50  fit   float32                895.2 img/s    0.012    n/a       35.7      12.4
    lm        hand  float32              2,294.5 tok/s    0.007    n/a      446.3       5.9
    lm        fit   float32              2,565.6 tok/s    0.008    n/a      399.1      12.6
    resnet50  hand  mixed_bfloat16         303.2 img/s    0.004    n/a      105.5      50.4
    resnet50  fit   mixed_bfloat16         719.6 img/s    0.009    n/a       44.5      48.1
    lm        hand  mixed_bfloat16       3,248.3 tok/s    0.010    n/a      315.2      16.7
    lm        fit   mixed_bfloat16      11,356.1 tok/s    0.036    n/a       90.2      10.0

(peak GiB: n/a, XLA:CPU keeps no memory statistics.)

One H100 80GB HBM3 (jax 0.11.2, flax 0.12.10, CUDA 13; 2026-11-23 01:53-02:05 UTC):
`python benchmarks/bench_models.py --preset full --precision mixed_bfloat16 --steps 20`

    model    way  precision        throughput  TFLOP/s    MFU  step ms compile s peak GiB
    resnet50 hand mixed_bfloat16  5,282.6 img/s    1.389  0.3 %     48.5      33.6    14.04
    resnet50 fit  mixed_bfloat16  5,162.4 img/s    1.357  0.3 %     49.6      12.4    14.04
    lm       hand mixed_bfloat16 92,824.3 tok/s  401.820 40.6 %    176.5      20.2    45.88
    lm       fit  mixed_bfloat16 92,632.5 tok/s  400.990 40.5 %    176.9      11.2    45.88

`fit` is 0.98x the hand loop on ResNet-50 and 1.00x on the LM (whose stock `nnx.Embed`
computes in bfloat16 under the policy). The LM's MFU printed in that run read 81 %: the peak
table was looked up as float32 for the `jnp.bfloat16` type (fixed since; the column above
is recomputed against 989 TFLOP/s). ResNet-50's FLOP count comes from XLA's cost analysis of
the compiled forward, which on the GPU leaves out the cuDNN convolutions, so its TFLOP/s and
MFU are far too low; the images/s are what to compare.

References measured on one H100 by the issue's author (hand-written NNX, bfloat16, data on
the device):
- ResNet-50, batch 256: 5,293 images/s.
- LM, batch 16: 126.7k tokens/s (55.5 % MFU); batch 32: 131.3k tokens/s.
- Keras 3 `fit` on the LM shapes: 128.1k (batch 16) and 134.2k (batch 32) tokens/s.
- phalanx `fit` before issue 7 (stock `nnx.Embed` stayed float32): 60.4k tokens/s (26 %).
The issue's target on the GPU: `fit` >= 0.99x the hand loop, >= 55 % MFU on the LM with the
stock `nnx.Embed` under 'mixed_bfloat16'.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PRESETS = {
    "full": {
        "resnet50": {
            "stages": (3, 4, 6, 3),
            "width": 64,
            "image": 224,
            "batch": 256,
            "classes": 1000,
        },
        "lm": {"layers": 12, "d": 2048, "heads": 16, "seq": 1024, "batch": 16, "vocab": 32768},
    },
    "cpu": {
        "resnet50": {"stages": (1, 1, 1, 1), "width": 16, "image": 32, "batch": 32, "classes": 10},
        "lm": {"layers": 2, "d": 128, "heads": 4, "seq": 128, "batch": 8, "vocab": 512},
    },
}


# ---- the modules ----------------------------------------------------------------------------
def _resnet(cfg: dict, dtype, seed: int = 0):
    import jax
    from flax import nnx

    def conv(cin, cout, k, stride, rngs):
        pad = "SAME" if k > 1 else "VALID"
        return nnx.Conv(
            cin, cout, (k, k), strides=stride, padding=pad, use_bias=False, dtype=dtype, rngs=rngs
        )

    def norm(c, rngs):
        return nnx.BatchNorm(c, momentum=0.9, epsilon=1e-5, dtype=dtype, rngs=rngs)

    class Bottleneck(nnx.Module):
        def __init__(self, cin, width, stride, rngs):
            cout = 4 * width
            self.conv1, self.bn1 = conv(cin, width, 1, 1, rngs), norm(width, rngs)
            self.conv2, self.bn2 = conv(width, width, 3, stride, rngs), norm(width, rngs)
            self.conv3, self.bn3 = conv(width, cout, 1, 1, rngs), norm(cout, rngs)
            project = stride != 1 or cin != cout
            self.proj = conv(cin, cout, 1, stride, rngs) if project else None
            self.proj_bn = norm(cout, rngs) if project else None

        def __call__(self, x):
            h = jax.nn.relu(self.bn1(self.conv1(x)))
            h = jax.nn.relu(self.bn2(self.conv2(h)))
            h = self.bn3(self.conv3(h))
            skip = x if self.proj is None else self.proj_bn(self.proj(x))
            return jax.nn.relu(h + skip)

    class ResNet(nnx.Module):
        def __init__(self, rngs):
            w = cfg["width"]
            self.stem, self.bn = conv(3, w, 7, 2, rngs), norm(w, rngs)
            blocks, cin = [], w
            for i, depth in enumerate(cfg["stages"]):
                for j in range(depth):
                    blocks.append(Bottleneck(cin, w * 2**i, 2 if (i > 0 and j == 0) else 1, rngs))
                    cin = 4 * w * 2**i
            self.blocks = nnx.List(blocks)
            self.head = nnx.Linear(cin, cfg["classes"], dtype=dtype, rngs=rngs)

        def __call__(self, x):
            h = jax.nn.relu(self.bn(self.stem(x)))
            h = nnx.max_pool(h, (3, 3), strides=(2, 2), padding="SAME")
            for block in self.blocks:
                h = block(h)
            return self.head(h.mean(axis=(1, 2)))

    return ResNet(nnx.Rngs(seed))


def _lm(cfg: dict, dtype, seed: int = 0):
    import jax
    from flax import nnx

    d, heads = cfg["d"], cfg["heads"]

    def linear(din, dout, rngs):
        return nnx.Linear(din, dout, use_bias=False, dtype=dtype, rngs=rngs)

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.norm1 = nnx.RMSNorm(d, dtype=dtype, rngs=rngs)
            self.qkv, self.out = linear(d, 3 * d, rngs), linear(d, d, rngs)
            self.norm2 = nnx.RMSNorm(d, dtype=dtype, rngs=rngs)
            self.up, self.down = linear(d, 4 * d, rngs), linear(4 * d, d, rngs)

        def __call__(self, x):
            b, t, _ = x.shape
            q, k, v = jax.numpy.split(self.qkv(self.norm1(x)).reshape(b, t, 3 * heads, -1), 3, 2)
            a = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, t, d)
            x = x + self.out(a)
            return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))

    class LM(nnx.Module):
        def __init__(self, rngs):
            # The fit variant passes dtype=None, nnx.Embed's default: float32 output.
            self.embed = nnx.Embed(cfg["vocab"], d, dtype=dtype, rngs=rngs)
            self.blocks = nnx.List([Block(rngs) for _ in range(cfg["layers"])])
            self.norm = nnx.RMSNorm(d, dtype=dtype, rngs=rngs)
            self.head = linear(d, cfg["vocab"], rngs)

        def __call__(self, tokens):
            h = self.embed(tokens)
            for block in self.blocks:
                h = block(h)
            return self.head(self.norm(h))

    return LM(nnx.Rngs(seed))


def _data(name: str, cfg: dict, rows: int):
    import numpy as np

    rng = np.random.default_rng(0)
    if name == "resnet50":
        x = rng.standard_normal((rows, cfg["image"], cfg["image"], 3), dtype=np.float32)
        return x, rng.integers(0, cfg["classes"], rows, dtype=np.int32)
    tokens = rng.integers(0, cfg["vocab"], (rows, cfg["seq"] + 1), dtype=np.int32)
    return tokens[:, :-1], tokens[:, 1:]


def _optimizer(name: str):
    import optax

    if name == "resnet50":
        return optax.sgd(0.1, momentum=0.9)
    return optax.adamw(3e-4, weight_decay=0.1)


# ---- one measurement (a child process) ------------------------------------------------------
def _measure(name: str, way: str, preset: str, precision: str, steps: int, warmup: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    import phalanx
    from phalanx._src.train.engine import flop_rate

    cfg = PRESETS[preset][name]
    batch = cfg["batch"]
    compute = jnp.bfloat16 if precision == "mixed_bfloat16" else jnp.float32
    build = _resnet if name == "resnet50" else _lm
    x, y = _data(name, cfg, batch * (warmup + steps))
    ends: list[float] = []
    start = time.perf_counter()

    if way == "fit":
        module = build(cfg, None)
        model = phalanx.Model(module)
        model.compile(
            optimizer=_optimizer(name),
            loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
            precision=precision,
        )

        class Clock(phalanx.callbacks.Callback):
            def on_train_batch_end(self, batch_index, logs=None):
                # A sync per step: the step times are device times, as in the hand loop.
                jax.block_until_ready(self.model.engine.state["params"])
                ends.append(time.perf_counter())

        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[Clock()])
    else:
        module = build(cfg, compute if compute != jnp.float32 else None)
        tx = _optimizer(name)
        graphdef, params, rest = nnx.split(module, nnx.Param, ...)
        opt_state = tx.init(params)
        mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
        shard = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        params, rest, opt_state = jax.device_put((params, rest, opt_state), replicated)
        batches = [
            jax.device_put((x[i : i + batch], y[i : i + batch]), shard)
            for i in range(0, len(x), batch)
        ]

        def step(params, rest, opt_state, xb, yb):
            def loss_fn(params, rest):
                m = nnx.merge(graphdef, params, rest, copy=True)  # fresh variables in this trace
                logits = m(xb).astype(jnp.float32)
                loss = optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()
                return loss, nnx.state(m, nnx.Not(nnx.Param))

            (loss, rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, rest)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), rest, opt_state, loss

        step = jax.jit(step, donate_argnums=(0, 1, 2))
        for xb, yb in batches:
            params, rest, opt_state, loss = step(params, rest, opt_state, xb, yb)
            jax.block_until_ready(loss)
            ends.append(time.perf_counter())

    per_step = np.diff(ends[warmup - 1 :]) if warmup >= 1 else np.diff([start, *ends])
    step_s = float(np.median(per_step))
    if name == "lm":
        params_all = sum(p.size for p in jax.tree.leaves(nnx.state(module, nnx.Param)))
        n = params_all - cfg["vocab"] * cfg["d"]  # without the input embedding
        flops_per_item = 6 * n + 12 * cfg["layers"] * cfg["d"] * cfg["seq"]
        items = batch * cfg["seq"]
    else:
        fresh = build(cfg, None)
        gd, state = nnx.split(fresh)
        forward = jax.jit(lambda s, xb: nnx.merge(gd, s, copy=True)(xb))
        lowered = forward.lower(state, x[:batch])
        # XLA:GPU (jax 0.11) gives no estimate before compiling a convnet: compile it then.
        cost = lowered.cost_analysis() or lowered.compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        flops_per_item = 3 * float(cost["flops"]) / batch
        items = batch
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    return {
        "model": name,
        "way": way,
        "precision": precision,
        "device_kind": device.device_kind,
        "devices": jax.device_count(),
        "items_per_s": items / step_s,
        "step_ms": 1e3 * step_s,
        "compile_s": ends[0] - start,
        "flops_per_step": flops_per_item * items,
        "peak_bytes": stats.get("peak_bytes_in_use"),
        "default_peak_tflops": flop_rate.peak_tflops(device.device_kind, compute),
    }


# ---- the table ------------------------------------------------------------------------------
def _row(r: dict, peak: float | None) -> str:
    unit = "img/s" if r["model"] == "resnet50" else "tok/s"
    peak = peak or r["default_peak_tflops"]
    tflops = r["flops_per_step"] / (r["step_ms"] / 1e3) / 1e12
    mfu = f"{100 * tflops / (peak * r['devices']):5.1f} %" if peak else "   n/a"
    memory = f"{r['peak_bytes'] / 2**30:6.2f}" if r["peak_bytes"] else "   n/a"
    return (
        f"{r['model']:9} {r['way']:5} {r['precision']:15} {r['items_per_s']:12,.1f} {unit} "
        f"{tflops:8.3f} {mfu} {r['step_ms']:10.1f} {r['compile_s']:9.1f} {memory}"
    )


HEADER = (
    f"{'model':9} {'way':5} {'precision':15} {'throughput':>18} {'TFLOP/s':>8} {'MFU':>7} "
    f"{'step ms':>10} {'compile s':>9} {'peak GiB':>8}"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["resnet50", "lm", "all"], default="all")
    parser.add_argument("--preset", choices=["full", "cpu", "auto"], default="auto")
    parser.add_argument("--precision", choices=["float32", "mixed_bfloat16"], default=None)
    parser.add_argument("--steps", type=int, default=20, help="timed steps after the warm-up")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=None, help="per device, for MFU")
    parser.add_argument("--child", nargs=4, metavar=("MODEL", "WAY", "PRESET", "PRECISION"))
    args = parser.parse_args()
    if args.warmup < 1:
        parser.error(f"--warmup must be >= 1 (the first step compiles), got {args.warmup}")
    if args.child:
        name, way, preset, precision = args.child
        print(
            "RESULT " + json.dumps(_measure(name, way, preset, precision, args.steps, args.warmup))
        )
        return

    import jax

    on_cpu = jax.default_backend() == "cpu"
    preset = args.preset if args.preset != "auto" else ("cpu" if on_cpu else "full")
    precision = args.precision or ("float32" if on_cpu else "mixed_bfloat16")
    names = ["resnet50", "lm"] if args.model == "all" else [args.model]
    print(f"preset {preset}, {jax.device_count()} x {jax.devices()[0].device_kind}")
    print(HEADER)
    for name in names:
        for way in ("hand", "fit"):
            command = [
                sys.executable, __file__, "--child", name, way, preset, precision,
                "--steps", str(args.steps), "--warmup", str(args.warmup),
            ]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
            if done.returncode != 0 or not lines:
                print(f"{name} {way}: failed\n{done.stderr[-3000:]}")
                continue
            print(_row(json.loads(lines[-1][len("RESULT ") :]), args.peak_tflops), flush=True)


if __name__ == "__main__":
    main()
