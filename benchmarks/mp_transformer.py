"""A Llama-shaped decoder-only transformer annotated for model parallelism, the MaxText way.

Every weight carries logical axis names (`nnx.Param(value, out_sharding=names)`, what
`nnx.with_partitioning` stores), and `AXIS_RULES`, passed as `Strategy(axis_rules=...)`,
maps them onto the mesh:

| weight | shape | names |
| --- | --- | --- |
| token embedding | (vocab, d) | ("vocab", "embed") |
| q kernel | (d, heads, head_dim) | ("embed", "heads", "kv") |
| k, v kernels | (d, kv_heads, head_dim) | ("embed", "heads", "kv") |
| output projection | (heads, head_dim, d) | ("heads", "kv", "embed") |
| MLP gate, up | (d, mlp) | ("embed", "mlp") |
| MLP down | (mlp, d) | ("mlp", "embed") |
| RMSNorm scales | (d,) | ("embed",) |
| LM head | (d, vocab) | ("embed", "vocab") |

`heads`, `mlp` and `vocab` go over `model`, as Megatron splits a block: each device of a
model group computes its heads and its slice of the MLP, and one all-reduce per sub-block
joins them. `vocab` goes over `model` too (MaxText does the same): the embedding and the
LM head are 1.05B of an 8B model's 8.03B parameters (128,256 x 4,096 each), which would
otherwise stay whole on every device and be the largest part of its memory at
`model_parallel=8`; the price is a gather across the group for the embedding look-up and a
reduction over the vocabulary for the softmax, both inserted by XLA. Both vocabularies
here divide by 8.

Attention is grouped-query (`kv_heads` key/value heads shared by `heads // kv_heads` query
heads), causal, with no positional encoding: the benchmark measures layouts, not quality.
The MLP is SwiGLU. Float32 parameters.

Example:
  >>> strategy = phalanx.Strategy(model_parallel=2, axis_rules=AXIS_RULES)
  >>> with strategy.scope():
  ...     module = Transformer(CONFIGS["tiny"], nnx.Rngs(0))   # kernels split over model
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import nnx

# The logical names' mesh axes (Flax's logical_axis_rules); `kv` and `embed` replicated.
AXIS_RULES = (
    ("vocab", "model"),
    ("embed", None),
    ("heads", "model"),
    ("kv", None),
    ("mlp", "model"),
)


@dataclasses.dataclass(frozen=True)
class Config:
    """A transformer's sizes; `parameters` counts its weights exactly."""

    vocab: int
    d_model: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int

    @property
    def parameters(self) -> int:
        d, q, kv = self.d_model, self.heads * self.head_dim, self.kv_heads * self.head_dim
        block = d * q + 2 * d * kv + q * d + 3 * d * self.mlp + 2 * d
        return 2 * self.vocab * d + self.layers * block + d


CONFIGS = {
    # Llama 3.2 1B's blocks with a 32,000 vocabulary and an untied LM head: 1,104,218,112.
    "1b": Config(vocab=32000, d_model=2048, layers=16, heads=32, kv_heads=8, head_dim=64, mlp=8192),
    # Llama 3 8B: 8,030,261,248 parameters.
    "8b": Config(
        vocab=128256, d_model=4096, layers=32, heads=32, kv_heads=8, head_dim=128, mlp=14336
    ),
    # Runs in seconds on 8 fake CPU devices; every split axis divides by 8.
    "tiny": Config(vocab=512, d_model=64, layers=2, heads=16, kv_heads=8, head_dim=8, mlp=256),
}


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], names: tuple[str, ...], fan_in: int):
    init = nnx.initializers.normal(stddev=fan_in**-0.5)
    return nnx.Param(init(rngs.params(), shape, jnp.float32), out_sharding=names)


class RMSNorm(nnx.Module):
    def __init__(self, d: int):
        self.scale = nnx.Param(jnp.ones((d,), jnp.float32), out_sharding=("embed",))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * self.scale


class Attention(nnx.Module):
    def __init__(self, c: Config, rngs: nnx.Rngs):
        d, h, g, k = c.d_model, c.heads, c.kv_heads, c.head_dim
        self.q = _param(rngs, (d, h, k), ("embed", "heads", "kv"), d)
        self.k = _param(rngs, (d, g, k), ("embed", "heads", "kv"), d)
        self.v = _param(rngs, (d, g, k), ("embed", "heads", "kv"), d)
        self.out = _param(rngs, (h, k, d), ("heads", "kv", "embed"), h * k)

    def __call__(self, x: jax.Array) -> jax.Array:
        q = jnp.einsum("btd,dhk->bthk", x, self.q[...])
        k = jnp.einsum("btd,dgk->btgk", x, self.k[...])
        v = jnp.einsum("btd,dgk->btgk", x, self.v[...])
        a = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return jnp.einsum("bthk,hkd->btd", a, self.out[...])


class MLP(nnx.Module):
    def __init__(self, c: Config, rngs: nnx.Rngs):
        d, f = c.d_model, c.mlp
        self.gate = _param(rngs, (d, f), ("embed", "mlp"), d)
        self.up = _param(rngs, (d, f), ("embed", "mlp"), d)
        self.down = _param(rngs, (f, d), ("mlp", "embed"), f)

    def __call__(self, x: jax.Array) -> jax.Array:
        return (jax.nn.silu(x @ self.gate[...]) * (x @ self.up[...])) @ self.down[...]


class Block(nnx.Module):
    def __init__(self, c: Config, rngs: nnx.Rngs):
        self.norm1, self.attention = RMSNorm(c.d_model), Attention(c, rngs)
        self.norm2, self.mlp = RMSNorm(c.d_model), MLP(c, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(nnx.Module):
    """Tokens `(batch, seq)` int32 -> logits `(batch, seq, vocab)` float32.

    Example:
      >>> module = Transformer(CONFIGS["tiny"], nnx.Rngs(0))
      >>> module(jnp.zeros((2, 16), jnp.int32)).shape
      (2, 16, 512)
    """

    def __init__(self, c: Config, rngs: nnx.Rngs):
        self.embed = _param(rngs, (c.vocab, c.d_model), ("vocab", "embed"), 1)
        self.blocks = nnx.List([Block(c, rngs) for _ in range(c.layers)])
        self.norm = RMSNorm(c.d_model)
        self.head = _param(rngs, (c.d_model, c.vocab), ("embed", "vocab"), c.d_model)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        h = jnp.take(self.embed[...], tokens, axis=0)
        for block in self.blocks:
            h = block(h)
        return self.norm(h) @ self.head[...]


def abstract_state(config: Config) -> dict:
    """Parameters and AdamW state as `jax.ShapeDtypeStruct`s inside NNX Variables (which
    keep the annotations), from `nnx.eval_shape` and `jax.eval_shape`: nothing allocated.

    Example:
      >>> state = abstract_state(CONFIGS["8b"])
      >>> sum(leaf.size for leaf in jax.tree.leaves(state["params"]))
      8030261248
    """
    # Outside a strategy's scope there is no mesh to place annotated variables on.
    with nnx.use_eager_sharding(False):
        module = nnx.eval_shape(lambda: Transformer(config, nnx.Rngs(0)))
    params = nnx.state(module, nnx.Param)
    return {"params": params, "opt": jax.eval_shape(optax.adamw(3e-4).init, params)}
