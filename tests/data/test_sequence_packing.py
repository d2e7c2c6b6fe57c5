"""pack_sequences and segment_attention_mask: Grain's first-fit packing, resumed exactly, and
a packed model computes what the unpacked one does."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import phalanx
from phalanx.data import Dataset
from phalanx.data.experimental import pack_sequences, segment_attention_mask

L = 16


def sequences(n: int, seed: int = 0, longest: int = L, skew: float = 1.0) -> list[np.ndarray]:
    """Token sequences of lognormal (skewed) lengths in [1, longest]."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(longest / 6), skew, n).astype(int), 1, longest)
    return [rng.integers(1, 50, k).astype(np.int32) for k in lengths]


def source(items: list) -> Dataset:
    # A generator that takes a start position: restoring it is exact (see from_generator).
    def gen(start=0):
        yield from items[start:]

    return Dataset.from_generator(gen)


def as_lists(element) -> object:
    return jax.tree.map(lambda a: np.asarray(a).tolist(), element)


@pytest.mark.parametrize("bins", [1, 3, 8])
def test_equals_grains_first_fit(bins):
    grain = pytest.importorskip("grain")
    inputs, targets = sequences(40, seed=1), sequences(40, seed=2, longest=8)
    items = [{"inputs": a, "targets": b} for a, b in zip(inputs, targets, strict=True)]
    lengths = {"inputs": L, "targets": 8}
    theirs = grain.experimental.FirstFitPackIterDataset(
        grain.MapDataset.source(items).to_iter_dataset(),
        length_struct=lengths,
        num_packing_bins=bins,
        shuffle_bins=False,
    )
    ours = pack_sequences(source(items), lengths, bins)
    assert [as_lists(e) for e in ours] == [as_lists(e) for e in theirs]


def test_bare_arrays_golden():
    items = [np.array(s) for s in ([1, 2, 3, 4], [5, 6], [11, 12, 13, 14], [7], [8])]
    rows = [as_lists(r) for r in pack_sequences(source(items), 4, 2, padding_value=-1)]
    assert rows == [
        ([1, 2, 3, 4], [1, 1, 1, 1], [0, 1, 2, 3]),
        ([5, 6, -1, -1], [1, 1, 0, 0], [0, 1, 0, 0]),
        ([11, 12, 13, 14], [1, 1, 1, 1], [0, 1, 2, 3]),
        ([7, 8, -1, -1], [1, 2, 0, 0], [0, 0, 0, 0]),
    ]
    limited = pack_sequences(source(items), 4, 1, max_sequences_per_bin=1)
    assert len(list(limited)) == 5


@pytest.mark.parametrize("shuffle_bins", [False, True])
def test_resume_in_the_middle_of_a_pack_is_exact(shuffle_bins):
    items = [{"tokens": s} for s in sequences(60, seed=3)]

    def packed():
        ds = source(items).filter(lambda e: len(e["tokens"]) != 3)
        ds = pack_sequences(ds, {"tokens": L}, 4, shuffle_bins=shuffle_bins, seed=7)
        return ds.batch(2)

    it = iter(packed())
    states, batches = [], []
    while True:
        states.append(json.loads(json.dumps(it.get_state())))
        try:
            batches.append(as_lists(next(it)))
        except StopIteration:
            break
    assert len(batches) > 5
    for k, state in enumerate(states):
        restored = iter(packed())
        restored.set_state(state)
        assert [as_lists(b) for b in restored] == batches[k:], k
    # Every token is packed exactly once (in order, without shuffle_bins).
    packed_tokens = sorted(
        t
        for b in batches
        for row, seg in zip(b["tokens"], b["tokens_segment_ids"], strict=True)
        for t, s in zip(row, seg, strict=True)
        if s
    )
    expected = sorted(t for e in items if len(e["tokens"]) != 3 for t in e["tokens"].tolist())
    assert packed_tokens == expected


def padding_share(rows) -> float:
    segments = np.stack([np.asarray(r[1]) for r in rows])
    return float(np.mean(segments == 0))


def test_the_padding_share_falls_on_skewed_lengths():
    items = sequences(400, seed=4, longest=64, skew=0.9)
    one_per_row = 1 - sum(len(s) for s in items) / (64 * len(items))
    shares = [padding_share(list(pack_sequences(source(items), 64, b))) for b in (1, 4, 32)]
    assert one_per_row > 0.6  # most of an unpacked batch is padding
    assert one_per_row > shares[0] > shares[1] > shares[2]
    assert shares[2] < 0.1


def test_bad_input_is_refused_clearly():
    items = [np.arange(5), np.arange(20)]
    with pytest.raises(ValueError, match=r"holds 20 tokens, more than its sequence_length 16"):
        list(pack_sequences(source(items), L))
    with pytest.raises(ValueError, match="before batch"):
        pack_sequences(source(items).padded_batch(2), L)
    with pytest.raises(ValueError, match=r"features \['a'\], but an element holds \['a', 'b'\]"):
        list(pack_sequences(source([{"a": np.arange(3), "b": np.arange(2)}]), {"a": 8}))
    with pytest.raises(ValueError, match="num_packing_bins must be a positive integer"):
        pack_sequences(source(items), L, 0)
    with pytest.raises(ValueError, match="a dict of lengths for dict elements"):
        list(pack_sequences(source([{"a": np.arange(3)}]), 8))
    with pytest.raises(ValueError, match="cast them alike"):
        list(pack_sequences(source([np.arange(3), np.arange(3.0)]), 8))
    with pytest.raises(TypeError, match=r"takes a phalanx\.data\.Dataset"):
        pack_sequences([np.arange(3)], 8)


def test_segment_attention_mask():
    segments = np.array([[1, 1, 2, 2, 2, 0], [1, 2, 3, 0, 0, 0]])
    mask = segment_attention_mask(segments)
    brute = np.array([[[a == b for b in row] for a in row] for row in segments])
    np.testing.assert_array_equal(mask, brute)
    causal = segment_attention_mask(segments, causal=True)
    np.testing.assert_array_equal(causal, brute & np.tri(6, dtype=bool))
    assert isinstance(mask, np.ndarray) and mask.dtype == bool
    traced = jax.jit(lambda s: segment_attention_mask(s, causal=True))(jnp.asarray(segments))
    np.testing.assert_array_equal(traced, causal)
    cross = segment_attention_mask(segments[:, :4], segments)
    assert cross.shape == (2, 4, 6)
    with pytest.raises(ValueError, match="causal=True needs queries and keys of one length"):
        segment_attention_mask(segments[:, :4], segments, causal=True)


def _nnx_model(vocab: int = 50, width: int = 16):
    from flax import nnx

    class Tiny(nnx.Module):
        def __init__(self, rngs):
            self.tokens = nnx.Embed(vocab, width, rngs=rngs)
            self.positions = nnx.Embed(L, width, rngs=rngs)
            self.attention = nnx.MultiHeadAttention(
                num_heads=2, in_features=width, qkv_features=width, decode=False, rngs=rngs
            )
            self.out = nnx.Linear(width, vocab, rngs=rngs)

        def __call__(self, tokens, segments, positions):
            x = self.tokens(tokens) + self.positions(positions)
            mask = segment_attention_mask(segments, causal=True)[:, None]  # a heads axis
            return self.out(x + self.attention(x, mask=mask))

    return Tiny(nnx.Rngs(0))


def _segment_losses(logits, tokens, segments) -> dict:
    """{(row, segment): mean next-token cross-entropy inside the segment}."""
    import optax

    losses = np.asarray(
        optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:])
    )
    segments = np.asarray(segments)
    valid = (segments[:, :-1] == segments[:, 1:]) & (segments[:, 1:] > 0)
    out = {}
    for r, s in _segments(segments):
        where = valid[r] & (segments[r, :-1] == s)
        out[(r, s)] = float(losses[r][where].mean())
    return out


def _segments(segments) -> set[tuple[int, int]]:
    """The (row, segment id) pairs of a packed batch."""
    rows, cells = np.nonzero(np.asarray(segments))
    return {(int(r), int(segments[r, c])) for r, c in zip(rows, cells, strict=True)}


def test_the_packed_models_per_segment_loss_equals_the_unpacked_one():
    model = _nnx_model()
    items = [s for s in sequences(30, seed=5) if len(s) >= 2]
    packed = list(pack_sequences(source(items), L, 8).padded_batch(64))
    assert len(packed) == 1
    tokens, segments, positions = (jnp.asarray(a) for a in packed[0])
    losses = _segment_losses(model(tokens, segments, positions), tokens, segments)
    # The same sequences one per row, padded: their own positions, their own mask.
    alone = np.zeros((len(items), L), np.int32)
    single = np.zeros((len(items), L), np.int32)
    for i, s in enumerate(items):
        alone[i, : len(s)], single[i, : len(s)] = s, 1
    expected = _segment_losses(
        model(jnp.asarray(alone), jnp.asarray(single), jnp.tile(jnp.arange(L), (len(items), 1))),
        alone,
        single,
    )
    # Match each packed segment to its sequence: packing keeps the order of first fit.
    tokens_np, segments_np = np.asarray(tokens), np.asarray(segments)
    matched = 0
    for (r, s), loss in losses.items():
        seq = tokens_np[r][segments_np[r] == s]
        i = next(i for i, item in enumerate(items) if np.array_equal(item, seq))
        np.testing.assert_allclose(loss, expected[(i, 1)], rtol=0, atol=1e-5)
        matched += 1
    assert matched == len(items)


def test_keras_attention_keeps_packed_segments_apart():
    keras = pytest.importorskip("keras")
    items = sequences(6, seed=6)
    tokens, segments, _ = next(iter(pack_sequences(source(items), L, 6).padded_batch(6)))
    embed = np.random.default_rng(0).normal(size=(50, 8)).astype(np.float32)
    layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    x = embed[tokens]
    packed = np.asarray(layer(x, x, attention_mask=segment_attention_mask(segments)))
    # The same sequences one per row, each masked from its padding.
    alone = np.zeros((len(items), L), np.int32)
    single = np.zeros((len(items), L), np.int32)
    for i, s in enumerate(items):
        alone[i, : len(s)], single[i, : len(s)] = s, 1
    y = embed[alone]
    unpacked = np.asarray(layer(y, y, attention_mask=segment_attention_mask(single)))
    for r, s in _segments(segments):
        cells = segments[r] == s
        i = next(i for i, item in enumerate(items) if np.array_equal(item, tokens[r][cells]))
        np.testing.assert_allclose(packed[r, cells], unpacked[i, : len(items[i])], atol=1e-5)


@pytest.mark.multidevice
def test_packed_batches_go_to_every_replica():
    strategy = phalanx.Strategy()
    n = strategy.num_replicas_in_sync
    ds = pack_sequences(source(sequences(120, seed=7)), L, 4).batch(n, drop_remainder=True)
    host = list(ds)
    placed = list(strategy.experimental_distribute_dataset(ds))
    assert len(placed) == len(host) >= 2
    for a, b in zip(placed, host, strict=True):
        assert all(isinstance(leaf, jax.Array) for leaf in a)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
