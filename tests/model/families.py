"""The model families every invariant in `test_families.py` runs over.

One row per kind of network people train (the seeds name MLPs, ResNets with BatchNorm, CNNs
with dropout, transformers, multi-input / multi-output models). Each row is tiny, so that the
whole table trains in seconds on fake CPU devices, but keeps the layers that matter: BatchNorm
(running statistics, global-batch statistics), Dropout (RNG streams), Embed + causal attention
+ RMSNorm, dict inputs and dict outputs with a dict of losses.

A family is a frozen record: how to build the module from a seed, how to make `n` examples
of its synthetic task from a seed, and the Keras-style loss to compile it with.

Every family carries sharding annotations, as a model written for model parallelism does
(issue 24): kernels split over the `model` axis (`nnx.with_partitioning`), the decoder in
MaxText's logical names (`embed`, `heads`, `mlp`) mapped by the family's `axis_rules`. On a
strategy without a `model` axis they mean replicated, so the same modules serve every
layout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import nnx

import phalanx

CLASSES = 3


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family: module, synthetic task, loss.

    Attributes:
      name: the test id.
      module: `seed -> nnx.Module`, the same weights for the same seed.
      data: `(n, seed) -> (x, y)`, NumPy arrays (or dicts of them), learnable by the module.
      loss: what `Model.compile(loss=...)` takes: a loss, or a dict of losses by output.
      batchnorm: the module has `nnx.BatchNorm` layers.
      dropout: the module has `nnx.Dropout` layers (active in training).
      axis_rules: the `Strategy(axis_rules=...)` its logical annotation names need.
      split: paths of kernels annotated over the model axis (each device of a model
        group holds 1/M of them), as `nnx.state(module)` paths joined by '/'.
    """

    name: str
    module: Callable[[int], nnx.Module]
    data: Callable[[int, int], tuple[Any, Any]]
    loss: Any
    batchnorm: bool = False
    dropout: bool = False
    axis_rules: tuple = ()
    split: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return self.name


def _sparse_ce():
    return phalanx.losses.SparseCategoricalCrossentropy(from_logits=True)


def _split(*names):
    """A kernel initializer annotated with `names` (Flax's default initializer)."""
    return nnx.with_partitioning(nnx.initializers.lecun_normal(), names)


# ---- MLP ------------------------------------------------------------------------------------
class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, din: int = 8):
        self.l1 = nnx.Linear(din, 16, kernel_init=_split(None, "model"), rngs=rngs)
        self.l2 = nnx.Linear(16, CLASSES, kernel_init=_split("model", None), rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def _vectors(n: int, seed: int):
    x = np.random.default_rng(seed).normal(size=(n, 8)).astype(np.float32)
    return x, x[:, :CLASSES].argmax(1).astype(np.int32)


# ---- small ResNet with BatchNorm ------------------------------------------------------------
class ResidualBlock(nnx.Module):
    """conv-BN-relu-conv-BN plus the (projected when strided) input, then relu."""

    def __init__(self, cin: int, cout: int, stride: int, rngs: nnx.Rngs):
        out = _split(None, None, None, "model")  # output channels over the model axis
        self.conv1 = nnx.Conv(
            cin, cout, (3, 3), strides=stride, use_bias=False, kernel_init=out, rngs=rngs
        )
        self.bn1 = nnx.BatchNorm(cout, momentum=0.9, rngs=rngs)
        self.conv2 = nnx.Conv(cout, cout, (3, 3), use_bias=False, kernel_init=out, rngs=rngs)
        self.bn2 = nnx.BatchNorm(cout, momentum=0.9, rngs=rngs)
        self.project = (
            nnx.Conv(cin, cout, (1, 1), strides=stride, use_bias=False, rngs=rngs)
            if stride != 1 or cin != cout
            else None
        )

    def __call__(self, x):
        h = jax.nn.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return jax.nn.relu(h + (x if self.project is None else self.project(x)))


class ResNet(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, width: int = 8):
        self.stem = nnx.Conv(3, width, (3, 3), use_bias=False, rngs=rngs)
        self.bn = nnx.BatchNorm(width, momentum=0.9, rngs=rngs)
        self.block1 = ResidualBlock(width, width, 1, rngs)
        self.block2 = ResidualBlock(width, 2 * width, 2, rngs)
        self.head = nnx.Linear(2 * width, CLASSES, rngs=rngs)

    def __call__(self, x):
        h = jax.nn.relu(self.bn(self.stem(x)))
        h = self.block2(self.block1(h))
        return self.head(h.mean(axis=(1, 2)))


def _images(n: int, seed: int):
    """8x8 RGB noise; the label is the channel with the largest mean."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8, 8, 3)).astype(np.float32)
    labels = rng.integers(0, CLASSES, n)
    x[np.arange(n), :, :, labels] += 0.5
    return x, labels.astype(np.int32)


# ---- CNN with BatchNorm and Dropout ---------------------------------------------------------
class CNN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, width: int = 8):
        self.conv1 = nnx.Conv(3, width, (3, 3), rngs=rngs)
        self.bn1 = nnx.BatchNorm(width, momentum=0.9, rngs=rngs)
        out = _split(None, None, None, "model")
        self.conv2 = nnx.Conv(width, width, (3, 3), strides=2, kernel_init=out, rngs=rngs)
        self.bn2 = nnx.BatchNorm(width, momentum=0.9, rngs=rngs)
        self.drop = nnx.Dropout(0.3, rngs=rngs)
        self.head = nnx.Linear(width, CLASSES, kernel_init=_split("model", None), rngs=rngs)

    def __call__(self, x):
        h = jax.nn.relu(self.bn1(self.conv1(x)))
        h = jax.nn.relu(self.bn2(self.conv2(h)))
        return self.head(self.drop(h.mean(axis=(1, 2))))


# ---- small decoder LM -----------------------------------------------------------------------
VOCAB, SEQ = 16, 8


class DecoderBlock(nnx.Module):
    """Pre-norm: x + drop(causal attention(norm x)); x + drop(mlp(norm x)). Annotated in
    MaxText's logical names: attention heads and the MLP width split (`DECODER_RULES`)."""

    def __init__(self, d: int, rngs: nnx.Rngs):
        self.norm1 = nnx.RMSNorm(d, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(
            num_heads=2,
            in_features=d,
            decode=False,
            kernel_metadata={"out_sharding": ("embed", "heads", "kv")},
            out_kernel_metadata={"out_sharding": ("heads", "kv", "embed")},
            rngs=rngs,
        )
        self.norm2 = nnx.RMSNorm(d, rngs=rngs)
        self.up = nnx.Linear(d, 2 * d, kernel_init=_split("embed", "mlp"), rngs=rngs)
        self.down = nnx.Linear(2 * d, d, kernel_init=_split("mlp", "embed"), rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)

    def __call__(self, x, mask):
        x = x + self.drop(self.attn(self.norm1(x), mask=mask))
        return x + self.drop(self.down(jax.nn.gelu(self.up(self.norm2(x)))))


class DecoderLM(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, d: int = 16):
        self.embed = nnx.Embed(VOCAB, d, rngs=rngs)  # stock: dtype left to the policy
        self.block = DecoderBlock(d, rngs)
        self.norm = nnx.RMSNorm(d, rngs=rngs)
        self.head = nnx.Linear(d, VOCAB, rngs=rngs)

    def __call__(self, tokens):
        h = self.block(self.embed(tokens), nnx.make_causal_mask(tokens))
        return self.head(self.norm(h))


DECODER_RULES = (("embed", None), ("heads", "model"), ("kv", None), ("mlp", "model"))


def _sequences(n: int, seed: int):
    """Counting sequences `s, s+1, ...` (mod VOCAB): the next token follows from the last."""
    start = np.random.default_rng(seed).integers(0, VOCAB, (n, 1))
    tokens = ((start + np.arange(SEQ + 1)) % VOCAB).astype(np.int32)
    return tokens[:, :-1], tokens[:, 1:]


# ---- dict inputs, two outputs ---------------------------------------------------------------
class TwoHeads(nnx.Module):
    """{'dense', 'extra'} -> {'label': logits, 'value': regression}."""

    def __init__(self, rngs: nnx.Rngs):
        self.dense = nnx.Linear(6, 16, kernel_init=_split(None, "model"), rngs=rngs)
        self.extra = nnx.Linear(2, 16, rngs=rngs)
        self.label = nnx.Linear(16, CLASSES, kernel_init=_split("model", None), rngs=rngs)
        self.value = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, inputs):
        h = jax.nn.relu(self.dense(inputs["dense"]) + self.extra(inputs["extra"]))
        return {"label": self.label(h), "value": self.value(h)}


def _two_inputs(n: int, seed: int):
    rng = np.random.default_rng(seed)
    dense = rng.normal(size=(n, 6)).astype(np.float32)
    extra = rng.normal(size=(n, 2)).astype(np.float32)
    x = {"dense": dense, "extra": extra}
    y = {
        "label": dense[:, :CLASSES].argmax(1).astype(np.int32),
        "value": (dense[:, 3:4] - extra[:, :1]).astype(np.float32),
    }
    return x, y


FAMILIES = (
    Family(
        "mlp",
        lambda seed: MLP(nnx.Rngs(seed)),
        _vectors,
        _sparse_ce(),
        split=("l1/kernel", "l2/kernel"),
    ),
    Family(
        "resnet",
        lambda seed: ResNet(nnx.Rngs(seed)),
        _images,
        _sparse_ce(),
        batchnorm=True,
        split=("block1/conv1/kernel", "block2/conv2/kernel"),
    ),
    Family(
        "cnn",
        lambda seed: CNN(nnx.Rngs(seed)),
        _images,
        _sparse_ce(),
        batchnorm=True,
        dropout=True,
        split=("conv2/kernel", "head/kernel"),
    ),
    Family(
        "decoder_lm",
        lambda seed: DecoderLM(nnx.Rngs(seed)),
        _sequences,
        _sparse_ce(),
        dropout=True,
        axis_rules=DECODER_RULES,
        split=("block/attn/query/kernel", "block/attn/out/kernel", "block/up/kernel"),
    ),
    Family(
        "two_heads",
        lambda seed: TwoHeads(nnx.Rngs(seed)),
        _two_inputs,
        {"label": _sparse_ce(), "value": "mse"},
        split=("dense/kernel", "label/kernel"),
    ),
)


def per_example_loss(loss: Any, y: Any, y_pred: Any) -> np.ndarray:
    """A family's loss per example, by hand in NumPy (float64), as Keras defines it: the mean
    over any trailing axes (an LM's tokens); for a dict of losses, the sum over the outputs
    (Keras's total loss with unit loss weights).

    Args:
      loss: a family's `loss`: 'mse', a from-logits sparse categorical cross-entropy, or a
        dict of them by output name.
      y: the labels; y_pred: the model's outputs (NumPy, or dicts of them).
    """
    if isinstance(loss, dict):
        return sum(per_example_loss(fn, y[name], y_pred[name]) for name, fn in loss.items())
    y, y_pred = np.asarray(y), np.asarray(y_pred, np.float64)
    if loss == "mse":
        values = (y - y_pred) ** 2
    elif isinstance(loss, phalanx.losses.SparseCategoricalCrossentropy) and loss.from_logits:
        shifted = y_pred - y_pred.max(-1, keepdims=True)
        log_softmax = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        values = -np.take_along_axis(log_softmax, y[..., None].astype(np.int64), -1)[..., 0]
    else:
        raise NotImplementedError(f"no hand-written form of {loss!r}; add one here")
    return values.reshape(len(values), -1).mean(1)
