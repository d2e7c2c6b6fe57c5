"""What arguments cost a compiled call: the reason the state's scalars are packed.

    python benchmarks/bench_dispatch.py            # 1 and 8 fake CPU devices

A jitted pass-through (+1 on every entry), donated, over the MLP's training state: its 12
parameter and Adam-moment arrays and 10 replicated float32 scalars (what metric sums, an
optimizer's count and injected hyperparameters add), called in a loop that reads one
scalar back after every call, as fit's does. The same values in three layouts: 22
arguments (nothing packed); 13 (the scalars in one vector: what `train/engine/packing.py`
does); 4 (what it did before issue 23: every leaf of at most `SMALL` elements, here the
biases, the 128x10 kernel and its moments and the scalars, in one vector, beside the three
784x128 arrays; dropped because XLA:CPU compiles a kernel for each packed array's bit cast,
+4 s before the first step of keras.io's TabTransformer). Best of 7
interleaved rounds of 300 calls; each call's time includes its (identical) arithmetic.

Results on 2 CPU cores (jax 0.10.2), 2026-11-25 03:50 UTC, three runs in a row (the
machine is shared: on one device the differences are within its noise, on 8 they are not):

| devices | 22 arguments, us/call | 13 (scalars) | 4 (small leaves) |
|---|---|---|---|
| 1 | 162 | 162 | 179 |
| 8 | 1031 | 968 | 887 |
| 1 | 238 | 192 | 207 |
| 8 | 1040 | 986 | 701 |
| 1 | 206 | 218 | 201 |
| 8 | 1017 | 817 | 674 |

An earlier version (2026-11-24, 0 or 10 extra scalars only) measured +23 and +43 us for
the 10 scalars on one device and +135 and +157 us on 8.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

ROUNDS = 7
SMALL = 4096  # elements: the largest leaf the "small" layout packs


def child(devices: int) -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", devices)
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    repl = NamedSharding(mesh, PartitionSpec())
    shapes = [(784, 128), (128,), (128, 10), (10,)] * 3  # parameters, Adam's two moments
    big = [s for s in shapes if np.prod(s) > SMALL]
    small = sum(int(np.prod(s)) for s in shapes if np.prod(s) <= SMALL)
    states = {  # the same values: 12 arrays + 10 scalars, laid out three ways
        "unpacked": [*shapes, *[()] * 10],
        "scalars": [*shapes, (10,)],
        "small": [*big, (small + 10,)],
    }
    calls = {}
    for name, layout in states.items():
        host = [np.full(s, i, np.float32) for i, s in enumerate(layout)]
        leaves = jax.device_put(host, repl)
        fn = jax.jit(
            lambda leaves: ([x + 1 for x in leaves], leaves[0].sum()),
            donate_argnums=0,
            out_shardings=(repl, repl),
        )
        leaves, total = fn(leaves)
        float(total)
        calls[name] = [fn, leaves]
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(ROUNDS):  # interleaved: the machine is shared
        for name, call in calls.items():
            fn, leaves = call
            start = time.perf_counter()
            for _ in range(300):
                leaves, total = fn(leaves)
                float(total)
            best[name] = min(best[name], (time.perf_counter() - start) / 300)
            call[1] = leaves
    cells = " | ".join(f"{best[name] * 1e6:.0f}" for name in states)
    print(f"| {devices} | {cells} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, action="append")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    print("| devices | 22 arguments (none packed), us/call | 13 (scalars) | 4 (small leaves) |")
    print("|---|---|---|---|")
    for devices in args.devices or [1, 8]:  # one process each: the device count is fixed early
        subprocess.run([sys.executable, __file__, "--child", str(devices)], check=True)


if __name__ == "__main__":
    main()
