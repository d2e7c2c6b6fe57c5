"""fit's compiled train call against hand-written loops' steps, each alone in a tight loop.

    python benchmarks/bench_fit_call.py     # one device; on a GPU, where steps are short
    python benchmarks/bench_fit_call.py --steps-per-execution 50 --rounds 5 --no-profile

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

At K > 1 fit's call runs K steps in one `lax.scan` over device-resident data (issue 35;
since issue 43 the whole data as one `(steps, batch, ...)` array read at a cursor); the
loop's is a hand-written `lax.scan` of the same K steps over a `(K, batch, ...)` block.
Beside both runs the fastest loop a JAX user writes (issue 43: a reference that is itself
slow hid a slow fit): the whole data placed once, a step counter in the donated state, a
dynamic index per step (`fastest_loop`); fit is compared with the faster of the two
loops. All are timed call by call, interleaved round by round (the machine is shared), and
compared at the median step (a call's time / K); the fusion and copy counts cover every
computation of each program (the scan's body included), not only the entry's.

Issue 43, 2026-11-28 17:15 UTC, 2 CPU cores (load 2.2), `python benchmarks/bench_fit_call.py
--steps-per-execution 50 --rounds 5 --steps 500 --no-profile`: fit's K=50 call (now the
whole data and a cursor) 1,245.8 us a step at the median, the block loop 1,250.2, the
fastest loop 1,267.5 (0.996x the faster); the commit before (its call on a (50, B) block)
1,208.5, 1,213.1 and 1,216.6 (0.996x). The three loops are within 2 % of one another: the
block loop was not 1.4x slow here. A jax.profiler trace of fit's call against the fastest
loop (10 calls each, interleaved) gave the same thunks at the same times a step (the
first layer's dot fusion ~450 us, the batch's dynamic slice 70-74 us, the two dots 60 us
each, Adam's fusions), 1,281 against 1,283 us a step.

Issue 35, 2026-11-26 19:22-19:24 UTC, 2 CPU cores (XLA:CPU, one device, jax 0.10.2,
load 0.4-2.8), `python benchmarks/bench_fit_call.py --steps-per-execution 50 --rounds 5
--no-profile`: fit's K=50 call 4,418 us a step at the median over 5 rounds of 1,000
steps, the hand-written scan 4,343 us (1.017x; rounds 4,243-4,692 against 3,083-4,770
us). Fusions and copies over every computation: fit 53 and 5, the loop 42 and 4, with 4
dynamic slices each (the scan's own take of each step's batch from its block: no slice
of the whole data) and one gather each (the labels' loss); at the entry, fit has 14
fusions and 2 copies (the state's scalars packed into vectors, the metric sums) against
4 and 1.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import re
import statistics
import sys
import time

import bench_fit


def top_level_ops(compiled) -> dict[str, int]:
    """The entry computation's operations by kind (fusions, copies, dots, ...)."""
    text = compiled.as_text()
    return dict(
        collections.Counter(re.findall(r"=\s*\S+\s+(\w[\w-]*)\(", text[text.index("ENTRY") :]))
    )


def all_ops(compiled) -> dict[str, int]:
    """Fusions, copies and dynamic slices over every computation of the program (a scan's
    body included)."""
    kinds = collections.Counter(re.findall(r"=\s*\S+\s+(\w[\w-]*)\(", compiled.as_text()))
    return {kind: kinds[kind] for kind in ("fusion", "copy", "dynamic-slice", "gather")}


def fit_call(x, y, k: int = 1):
    """`(call, metrics, others, rest)`: fit's train call and its arguments after a short fit
    (`k`: steps per execution)."""
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
            model.compile("adam", loss, steps_per_execution=k)
        ds = phalanx.data.Dataset.from_tensor_slices((x, y)).repeat().batch(bench_fit.BATCH)
        model.fit(ds, epochs=2, steps_per_epoch=bench_fit.STEPS, verbose=0)
    finally:
        flop_rate.count = count
    leaves, packing = model.engine.leaves()  # the state now (the captured one was donated)
    n = packing.metric_count
    return seen["call"], list(leaves[:n]), list(leaves[n:]), seen["args"][2:]


def loop_step(x, y, k: int = 1):
    """`(step, state, batch)`: the hand-written loop's jitted, donated step on one batch, or
    at `k` > 1 its `lax.scan` of k steps over a `(k, batch, ...)` block."""
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

    rows = bench_fit.BATCH
    if k == 1:
        batch = (jax.device_put(x[:rows]), jax.device_put(y[:rows]))
        return jax.jit(step, donate_argnums=0), jax.device_put(leaves), batch

    def scan(leaves, block):
        leaves, losses = jax.lax.scan(step, leaves, block)
        return leaves, losses[-1]

    block = (
        jax.device_put(x[: k * rows].reshape(k, rows, -1)),
        jax.device_put(y[: k * rows].reshape(k, rows)),
    )
    return jax.jit(scan, donate_argnums=0), jax.device_put(leaves), block


def fastest_loop(x, y, k: int = 1):
    """`(step, state, data)`: the fastest loop a JAX user writes over resident data (issue
    43): the whole data placed once as one `(steps, batch, ...)` array, a step counter in
    the donated state, and each step taking its batch with a dynamic index; at `k` > 1, k
    such steps in one `lax.scan`. Its call is `step(state, data)`."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    graphdef, params = nnx.split(bench_fit._mlp())
    tx = optax.adam(1e-3)
    leaves, treedef = jax.tree.flatten((params, tx.init(params), jnp.zeros((), jnp.int32)))
    rows = bench_fit.BATCH
    whole = x.shape[0] // rows

    def step(leaves, data):
        params, opt, i = jax.tree.unflatten(treedef, leaves)
        take = lambda a: jax.lax.dynamic_index_in_dim(a, i % whole, keepdims=False)  # noqa: E731
        params, opt, loss = bench_fit._adam_step(graphdef, tx, params, opt, *map(take, data))
        return jax.tree.leaves((params, opt, i + 1)), loss

    def run(leaves, data):
        if k == 1:
            return step(leaves, data)
        leaves, losses = jax.lax.scan(lambda s, _: step(s, data), leaves, None, length=k)
        return leaves, losses[-1]

    data = (
        jax.device_put(x[: whole * rows].reshape(whole, rows, -1)),
        jax.device_put(y[: whole * rows].reshape(whole, rows)),
    )
    return jax.jit(run, donate_argnums=0), jax.device_put(leaves), data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1000, help="steps timed per round")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled fit")
    args = parser.parse_args()
    k = args.steps_per_execution
    x, y = bench_fit._data()
    call, metrics, others, rest = fit_call(x, y, k)
    step, state, batch = loop_step(x, y, k)
    fast, fast_state, fast_data = fastest_loop(x, y, k)
    fit_compiled = call.lower(metrics, others, *rest).compile()
    loop_compiled = step.lower(state, batch).compile()
    fast_compiled = fast.lower(fast_state, fast_data).compile()
    print("fit's call:", top_level_ops(fit_compiled), "all:", all_ops(fit_compiled))
    print("the loop's:", top_level_ops(loop_compiled), "all:", all_ops(loop_compiled))
    print("fastest:", top_level_ops(fast_compiled), "all:", all_ops(fast_compiled))

    def fit_once():
        nonlocal metrics, others
        metrics, others, logs, _ = call(metrics, others, *rest)
        return logs[0]

    def loop_once():
        nonlocal state
        state, loss = step(state, batch)
        return loss

    def fast_once():
        nonlocal fast_state
        fast_state, loss = fast(fast_state, fast_data)
        return loss

    def timed(once, calls: int) -> list[float]:
        """Microseconds per step of `calls` calls of `once`, each waited for."""
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            float(once())
            times.append((time.perf_counter() - start) / k * 1e6)
        return times

    calls = max(1, args.steps // k)
    for once in (fit_once, loop_once, fast_once):  # warm-up
        timed(once, max(1, 50 // k))
    fits, loops, fasts = [], [], []
    for r in range(args.rounds):  # interleaved: a slow spell hits all three
        fit_times, loop_times, fast_times = (
            timed(f, calls) for f in (fit_once, loop_once, fast_once)
        )
        fits += fit_times
        loops += loop_times
        fasts += fast_times
        print(f"round {r}: median step, fit's call {statistics.median(fit_times):.1f} us, "
              f"the loop's {statistics.median(loop_times):.1f} us, the fastest loop's "
              f"{statistics.median(fast_times):.1f} us (K={k})")  # fmt: skip
    medians = [statistics.median(t) for t in (fits, loops, fasts)]
    best = [min(statistics.median(t[i : i + calls]) for i in range(0, len(t), calls))
            for t in (fits, loops, fasts)]  # fmt: skip
    reference = min(medians[1:])  # the faster hand-written loop: a slow one hides nothing
    print(f"all rounds, median step: fit's call {medians[0]:.1f} us, the loop's "
          f"{medians[1]:.1f} us, the fastest loop's {medians[2]:.1f} us: fit / the faster "
          f"loop {medians[0] / reference:.3f}x (best rounds: {best[0]:.1f}, {best[1]:.1f}, "
          f"{best[2]:.1f} us)")  # fmt: skip
    if args.no_profile:
        return 0
    profile = cProfile.Profile()
    profile.enable()
    result = bench_fit.with_fit(x, y, k, 2000, verbose=0)
    profile.disable()
    print(f"fit, profiled: {result['rate']:,.0f} ex/s")
    pstats.Stats(profile).sort_stats("tottime").print_stats(18)
    return 0


if __name__ == "__main__":
    sys.exit(main())
