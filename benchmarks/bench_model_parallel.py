"""Model parallelism: per-device memory of 1B and 8B transformers, step time on 8 devices.

    python benchmarks/bench_model_parallel.py                 # memory tables, then step times
    python benchmarks/bench_model_parallel.py --memory-only --devices 8 64 256
    python benchmarks/bench_model_parallel.py --quick         # smoke run: tiny, one round

The model is `mp_transformer.Transformer`, a Llama-shaped decoder annotated the MaxText way
(heads, MLP width and vocabulary over the `model` axis; `mp_transformer.AXIS_RULES`).

Memory: for the "1b" (1,104,218,112 parameters) and "8b" (8,030,261,248) configurations,
the parameters and AdamW state are built from shapes only (`nnx.eval_shape`,
`jax.eval_shape(optax.adamw(...).init, ...)`: nothing allocated, so any device count can be
asked for on any machine), and each layout's per-device bytes come from the layout the
strategy uses (`state_memory`: the model's annotations on a `data x model` mesh, then
`state_sharding` over `data`). Layouts: data-only (replicated), FSDP, `model_parallel=2/4/8`,
and FSDP with `model_parallel=2` and 8. Gradients, activations and XLA's temporaries come
on top and depend on the batch.

Step time: the "tiny" configuration (213,312 parameters, every split axis divisible by 8)
on 8 fake CPU devices, each layout as a user writes it (`Strategy(model_parallel=M,
axis_rules=AXIS_RULES, state_sharding=...)`, the module built inside its scope,
`phalanx.Model(module)`, `compile`, `fit` on NumPy token arrays, `steps_per_execution` 1).
A callback waits for the parameters after each batch and stamps the time; a round's figure
is the median interval after `--warmup` steps, and the table gives the median over the
interleaved rounds (and the range). Each layout's final loss is checked against data-only's
(the same numbers on any layout). XLA:CPU fake devices share the host's cores, so the
times show the collectives' overhead on one host, not a speed-up.
"""

from __future__ import annotations

import argparse
import statistics
import time

LAYOUTS = (
    # (name, state_sharding, model_parallel)
    ("data-only", "replicated", 1),
    ("fsdp", "fsdp", 1),
    ("mp 2", "replicated", 2),
    ("mp 4", "replicated", 4),
    ("mp 8", "replicated", 8),
    ("fsdp + mp 2", "fsdp", 2),
    ("fsdp + mp 8", "fsdp", 8),
)
UNITS = {"GiB": 2**30, "KiB": 2**10}


# ---- memory, from shapes ---------------------------------------------------------------------
def memory_rows(config, devices: int, layouts=LAYOUTS) -> list[dict]:
    """Per-device bytes of `config`'s parameters and AdamW state under each layout on
    `devices` devices; layouts whose `model_parallel` does not divide `devices` are left out.

    Example:
      >>> rows = memory_rows(CONFIGS["8b"], 64)
      >>> rows[0]["layout"], rows[0]["mesh"], round(rows[0]["total"] / 2**30, 2)
      ('data-only', '64 x 1', 89.75)
    """
    from mp_transformer import AXIS_RULES, abstract_state

    from phalanx._src.strategy.sharding import state_memory

    state = abstract_state(config)
    rows = []
    for name, mode, m in layouts:
        if devices % m:
            continue
        memory = state_memory(state, devices // m, mode, m, AXIS_RULES)
        rows.append({"layout": name, "mesh": f"{devices // m} x {m}", **memory})
    return rows


def print_memory(name: str, config, device_counts: list[int]) -> None:
    unit = "GiB" if config.parameters * 4 >= 2**30 else "KiB"
    print(f"\n{name}: {config.parameters:,} float32 parameters, AdamW; {unit} per device\n")
    print("| devices | layout | data x model | params | optimizer | total |")
    print("|---:|---|---|---:|---:|---:|")
    for devices in device_counts:
        for row in memory_rows(config, devices):
            cells = [f"{row[key] / UNITS[unit]:.2f}" for key in ("params", "optimizer", "total")]
            print(f"| {devices} | {row['layout']} | {row['mesh']} | " + " | ".join(cells) + " |")


# ---- step time, on the devices at hand ----------------------------------------------------
def fit_once(layout: tuple, config, x, y, batch: int, warmup: int) -> dict:
    """One cold `fit` of one epoch under `layout`: the median step (ms) after `warmup`
    steps, and the epoch's loss."""
    import jax
    import numpy as np
    import optax
    from flax import nnx
    from mp_transformer import AXIS_RULES, Transformer

    import phalanx

    _, mode, m = layout
    strategy = phalanx.Strategy(model_parallel=m, axis_rules=AXIS_RULES, state_sharding=mode)
    ends: list[float] = []

    class Clock(phalanx.callbacks.Callback):
        def on_train_batch_end(self, batch_index, logs=None):
            # A sync per step, so that the intervals are the devices' step times.
            jax.block_until_ready(self.model.engine.state["params"])
            ends.append(time.perf_counter())

    with strategy.scope():
        model = phalanx.Model(Transformer(config, nnx.Rngs(0)))
        model.compile(
            optimizer=optax.adamw(1e-3),
            loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        history = model.fit(
            x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[Clock()]
        )
    step_ms = 1e3 * float(np.median(np.diff(ends[warmup - 1 :])))
    return {"ms": step_ms, "loss": history.history["loss"][-1]}


def print_step_times(config, batch: int, seq: int, steps: int, warmup: int, rounds: int) -> None:
    import jax
    import numpy as np

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.vocab, (batch * (warmup + steps), seq + 1), dtype=np.int32)
    x, y = tokens[:, :-1], tokens[:, 1:]
    n = jax.device_count()
    layouts = [layout for layout in LAYOUTS if n % layout[2] == 0]
    results: dict[str, list[dict]] = {layout[0]: [] for layout in layouts}
    for _ in range(rounds):  # interleaved: a slow spell on a shared machine hits every layout
        for layout in layouts:
            results[layout[0]].append(fit_once(layout, config, x, y, batch, warmup))
    base = results["data-only"][0]["loss"]
    print(
        f"\nstep time: 'tiny' ({config.parameters:,} parameters), {n} x "
        f"{jax.devices()[0].device_kind}, global batch {batch} x {seq} tokens, {steps} timed "
        f"steps after {warmup}, {rounds} rounds\n"
    )
    print("| layout | data x model | median ms | range ms | final loss | - data-only |")
    print("|---|---|---:|---:|---:|---:|")
    for name, _, m in layouts:
        times = [r["ms"] for r in results[name]]
        loss = results[name][0]["loss"]
        print(
            f"| {name} | {n // m} x {m} | {statistics.median(times):.1f} | "
            f"{min(times):.1f}-{max(times):.1f} | {loss:.6f} | {loss - base:+.1e} |"
        )
    worst = max(abs(results[name][0]["loss"] - base) for name in results)
    verdict = "agree" if worst <= 1e-4 * abs(base) else "DISAGREE"
    print(f"\nfinal losses {verdict} with data-only's (largest difference {worst:.1e})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[8, 64], help="for memory")
    parser.add_argument("--memory-only", action="store_true")
    parser.add_argument("--fake-devices", type=int, default=8, help="CPU devices for step time")
    parser.add_argument("--batch", type=int, default=16, help="global batch (sequences)")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10, help="timed steps after the warm-up")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny config, 1 round")
    args = parser.parse_args()
    if args.warmup < 1:
        parser.error(f"--warmup must be >= 1 (the first step compiles), got {args.warmup}")

    import jax

    # Before anything starts JAX's backend; CPU only (other platforms ignore it).
    jax.config.update("jax_num_cpu_devices", args.fake_devices)
    from mp_transformer import CONFIGS

    sizes = ["tiny"] if args.quick else ["1b", "8b"]
    for name in sizes:
        print_memory(name, CONFIGS[name], args.devices)
    if args.memory_only:
        return
    if args.quick:
        args.steps, args.warmup, args.rounds = 3, 1, 1
    print_step_times(CONFIGS["tiny"], args.batch, args.seq, args.steps, args.warmup, args.rounds)


if __name__ == "__main__":
    main()
