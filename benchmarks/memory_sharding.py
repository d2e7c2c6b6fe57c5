"""Per-device memory of a 1B-parameter Adam model, replicated and sharded (a script, not a test).

    python benchmarks/memory_sharding.py                     # 8, 64 and 256 replicas
    python benchmarks/memory_sharding.py --replicas 4 16 1024

Builds a decoder-shaped Flax NNX model of about 1.07B float32 parameters (a 32000 x 2048
embedding and 20 blocks of attention projections and a 4x MLP) with `nnx.eval_shape`, and
the optimizer state `Model.compile(optimizer="adam")` builds with `jax.eval_shape`: nothing
is allocated, so any replica count can be asked for on any machine. For each count it prints
the bytes one device holds of parameters + optimizer state under each
`Strategy(state_sharding=...)` mode, using the per-leaf layout the strategy uses
(`phalanx._src.strategy.sharding.state_memory`). Activations, gradients and XLA's
temporaries come on top and depend on the batch.
"""

from __future__ import annotations

import argparse

import jax
from flax import nnx

from phalanx._src.strategy.sharding import MODES, state_memory
from phalanx._src.train.api import optimizers, precision
from phalanx._src.train.engine.accumulation import accumulate_gradients

VOCAB, WIDTH, BLOCKS = 32000, 2048, 20


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.qkv = nnx.Linear(WIDTH, 3 * WIDTH, rngs=rngs)
        self.out = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
        self.norm2 = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.up = nnx.Linear(WIDTH, 4 * WIDTH, rngs=rngs)
        self.down = nnx.Linear(4 * WIDTH, WIDTH, rngs=rngs)


class Decoder(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
        self.blocks = nnx.List([Block(rngs) for _ in range(BLOCKS)])


def abstract_train_state() -> dict:
    """Parameters and Adam state as `jax.ShapeDtypeStruct`s, as `Model.compile` makes them."""
    model = nnx.eval_shape(lambda: Decoder(nnx.Rngs(0)))
    params = nnx.state(model, nnx.Param)
    tx = precision.get("float32").wrap_optimizer(accumulate_gradients(optimizers.get("adam"), 1))
    return {"params": params, "opt": jax.eval_shape(tx.init, params)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[8, 64, 256])
    args = parser.parse_args()
    state = abstract_train_state()
    count = sum(leaf.size for leaf in jax.tree.leaves(state["params"]))
    print(f"parameters: {count:,} float32 ({count * 4 / 2**30:.2f} GiB); optimizer: adam\n")
    print("| replicas | " + " | ".join(MODES) + " |")
    print("|---:|" + "---:|" * len(MODES))
    for n in args.replicas:
        cells = []
        for mode in MODES:
            memory = state_memory(state, n, mode)
            cells.append(f"{memory['total'] / 2**30:.2f} GiB")
        print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
