"""fit's compiled train call against the hand-written loop's step, each alone in a tight loop.

    python benchmarks/bench_fit_call.py     # one device; on a GPU, where steps are short

Tells fit's own per-step cost apart from its compiled call's: it runs a short `fit` of
`bench_fit`'s MLP (K=1), takes the train call and the arguments of its first execution
(through the FLOP counter, which receives both), and times that call alone in a loop that
reads every loss, against a plain jitted step of the same model, optimizer and batch size;
it prints each program's top-level HLO operations, then profiles a whole `fit` of 2,000
steps (bench_fit's `with_fit`: a callback reads every loss).

Results on one NVIDIA H200 (jax 0.11.2), 2026-11-26 04:50 UTC: fusions 16 and copies 2 in
fit's call against 14 and 1 in the loop's; per step over 5 rounds of 1,000, 393-593 us
against 383-683 us; under cProfile, fit's Python around each call (dispatch, log fetch,
hooks) ~10-30 us a step. On 2 CPU cores (XLA:CPU, one device, jax 0.10.2), 05:55 UTC: 37
fusions in each, and 4,948-5,875 against 5,292-5,811 us a step.
"""

from __future__ import annotations

import collections
import cProfile
import pstats
import re
import sys
import time

import bench_fit


def top_level_ops(compiled) -> dict[str, int]:
    """The entry computation's operations by kind (fusions, copies, dots, ...)."""
    text = compiled.as_text()
    return dict(
        collections.Counter(re.findall(r"=\s*\S+\s+(\w[\w-]*)\(", text[text.index("ENTRY") :]))
    )


def fit_call(x, y):
    """`(call, metrics, others, rest)`: fit's train call and its arguments after a short fit."""
    import phalanx
    from phalanx._src.train.engine import flop_rate

    seen = {}
    count = flop_rate.count

    def spy(engine, call, args):
        seen["call"], seen["args"] = call, args
        return count(engine, call, args)

    flop_rate.count = spy
    try:
        with phalanx.Strategy().scope():
            model = phalanx.Model(bench_fit._mlp())
            loss = phalanx.losses.SparseCategoricalCrossentropy(from_logits=True)
            model.compile("adam", loss, steps_per_execution=1)
        ds = phalanx.data.Dataset.from_tensor_slices((x, y)).repeat().batch(bench_fit.BATCH)
        model.fit(ds, epochs=2, steps_per_epoch=bench_fit.STEPS, verbose=0)
    finally:
        flop_rate.count = count
    leaves, packing = model.engine.leaves()  # the state now (the captured one was donated)
    n = packing.metric_count
    return seen["call"], list(leaves[:n]), list(leaves[n:]), seen["args"][2:]


def loop_step(x, y):
    """`(step, state, batch)`: the hand-written loop's jitted, donated step on one batch."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    graphdef, params = nnx.split(bench_fit._mlp())
    tx = optax.adam(1e-3)
    leaves, treedef = jax.tree.flatten((params, tx.init(params), jnp.zeros((), jnp.int32)))

    def step(leaves, batch):
        params, opt, i = jax.tree.unflatten(treedef, leaves)
        params, opt, loss = bench_fit._adam_step(graphdef, tx, params, opt, *batch)
        return jax.tree.leaves((params, opt, i + 1)), loss

    batch = (jax.device_put(x[: bench_fit.BATCH]), jax.device_put(y[: bench_fit.BATCH]))
    return jax.jit(step, donate_argnums=0), jax.device_put(leaves), batch


def main() -> int:
    x, y = bench_fit._data()
    call, metrics, others, rest = fit_call(x, y)
    step, state, batch = loop_step(x, y)
    print("fit's call:", top_level_ops(call.lower(metrics, others, *rest).compile()))
    print("the loop's step:", top_level_ops(step.lower(state, batch).compile()))

    def time_fit(steps: int) -> float:
        nonlocal metrics, others
        start = time.perf_counter()
        for _ in range(steps):
            metrics, others, logs, _ = call(metrics, others, *rest)
            float(logs[0])
        return (time.perf_counter() - start) / steps * 1e6

    def time_loop(steps: int) -> float:
        nonlocal state
        start = time.perf_counter()
        for _ in range(steps):
            state, loss = step(state, batch)
            float(loss)
        return (time.perf_counter() - start) / steps * 1e6

    time_fit(50), time_loop(50)
    for r in range(5):
        print(f"round {r}: fit's call {time_fit(1000):.1f} us a step, the loop's "
              f"{time_loop(1000):.1f}")  # fmt: skip
    profile = cProfile.Profile()
    profile.enable()
    result = bench_fit.with_fit(x, y, 1, 2000, verbose=0)
    profile.disable()
    print(f"fit, profiled: {result['rate']:,.0f} ex/s")
    pstats.Stats(profile).sort_stats("tottime").print_stats(18)
    return 0


if __name__ == "__main__":
    sys.exit(main())
