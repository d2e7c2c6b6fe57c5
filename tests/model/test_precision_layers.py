"""Mixed precision reaches every standard Flax layer, including those whose dtype defaults to
float32 (nnx.Embed); parameters, optimizer state, statistics and the loss stay float32."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from lowered_ops import matmuls

import phalanx

pytestmark = pytest.mark.multidevice

HALF = {"mixed_bfloat16": "bf16", "mixed_float16": "f16"}


class TinyLM(nnx.Module):
    """Embed -> Conv -> causal attention -> BatchNorm/LayerNorm -> Einsum -> Linear."""

    def __init__(self, rngs: nnx.Rngs, vocab: int = 32, d: int = 16, attention: bool = True):
        self.attention = attention
        self.embed = nnx.Embed(vocab, d, rngs=rngs)  # dtype defaults to float32
        self.conv = nnx.Conv(d, d, kernel_size=(3,), rngs=rngs)
        self.norm = nnx.LayerNorm(d, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=d, decode=False, rngs=rngs)
        self.bn = nnx.BatchNorm(d, rngs=rngs)
        self.mix = nnx.Einsum("btd,de->bte", (d, d), rngs=rngs)
        self.head = nnx.Linear(d, vocab, rngs=rngs)

    def __call__(self, tokens):
        h = self.embed(tokens)
        h = h + self.conv(h)
        if self.attention:
            h = h + self.attn(self.norm(h), mask=nnx.make_causal_mask(tokens))
        h = self.mix(self.bn(h))
        return self.head(h)


def _compiled_model(precision):
    strategy = phalanx.Strategy()
    # XLA:CPU has no float16 attention kernel (F16_F16_F32 dots); float16 is a GPU policy.
    attention = precision != "mixed_float16"
    with strategy.scope():
        model = phalanx.Model(TinyLM(nnx.Rngs(0), attention=attention))
        model.compile(
            optimizer="adam",
            loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
            precision=precision,
        )
    tokens = np.random.default_rng(0).integers(0, 32, (2 * strategy.num_replicas_in_sync, 8))
    return model, tokens.astype(np.int32)


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_no_float32_matmul_or_convolution_under_a_mixed_policy(precision):
    model, tokens = _compiled_model(precision)
    ops = matmuls(model, (tokens, tokens))
    assert {op for op, _ in ops} == {"dot_general", "convolution"}
    float32_only = [op for op in ops if set(op[1]) == {"f32"}]
    assert float32_only == [], float32_only
    # Every matmul reads half-precision data. The only float32 operand allowed is the
    # gradient of attention logits, which jax.nn.dot_product_attention deliberately keeps in
    # float32 (softmax stability); its forward product is half precision.
    assert all(HALF[precision] in operands for _, operands in ops)


def test_float32_policy_computes_in_float32():
    model, tokens = _compiled_model("float32")
    assert all(set(operands) == {"f32"} for _, operands in matmuls(model, (tokens, tokens)))


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_parameters_optimizer_state_statistics_and_loss_stay_float32(precision):
    model, tokens = _compiled_model(precision)
    history = model.fit(tokens, tokens, batch_size=len(tokens), epochs=2, verbose=0)
    assert all(np.isfinite(history.history["loss"]))
    state = model.engine.state
    for leaf in jax.tree.leaves((state["params"], state["rest"], state["opt"])):
        if jnp.issubdtype(leaf.dtype, jnp.floating):
            assert leaf.dtype == jnp.float32
    # The user's module is untouched: Embed still declares float32, nothing was rebuilt.
    assert model.module.embed.dtype == jnp.float32
    assert model.module.head.dtype is None
