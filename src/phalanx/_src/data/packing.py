"""Sequence packing: variable-length sequences packed first-fit into fixed-length rows.

A transformer fed one sequence per row pads every row to the longest length it accepts;
with skewed lengths most of each batch is padding. Packing puts several sequences in one
row, each tagged by a segment id (1, 2, ... in the row; 0 is padding) and positions that
restart at 0, so attention kept inside a segment (`segment_attention_mask`) and position
embeddings read from the positions give every sequence what it would get alone.

The algorithm is Grain's `FirstFitPackIterDataset` (and T5's packing, in spirit): sequences
are read in order into `num_packing_bins` rows; each goes into the first row with room for
all its features; when one fits nowhere, the rows so far are emitted (optionally in a
seeded random order) and a new group begins with it. The output names follow Grain and T5:
a dict element's feature `k` gives `k`, `k_segment_ids` and `k_positions` (int32); a bare
array gives the tuple `(tokens, segment_ids, positions)`.

A packed pipeline streams (see `stream`); its state is the parent's state where the current
group began, the rows of it already emitted and the rows emitted before it, so a restored
iterator packs that group again and continues in the middle of it exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from phalanx._src.data import validation
from phalanx._src.data.plan import Key, Node
from phalanx._src.data.stream import Stream, open_node


@dataclasses.dataclass(eq=False)
class Pack(Stream):
    """`pack_sequences`' node; `keys` None means bare array elements."""

    parent: Node
    keys: tuple[str, ...] | None
    lengths: tuple[int, ...]
    paddings: tuple[Any, ...]
    bins: int
    shuffle: bool
    seed: int
    max_sequences: int | None

    level = 0

    def open(self, key: Key, state: dict | None) -> Any:
        return _PackCursor(self, key, state)

    def features(self, element: Any) -> list[np.ndarray]:
        """The element's sequences, in `keys` order, checked."""
        if self.keys is None:
            if isinstance(element, dict | tuple | list):
                raise ValueError(
                    f"pack_sequences was given sequence_length as an int for bare arrays, "
                    f"but the element is a {type(element).__name__}; pass a dict of "
                    "lengths for dict elements, e.g. sequence_length={'inputs': 128}"
                )
            arrays = [np.asarray(element)]
        else:
            if not isinstance(element, dict) or set(element) != set(self.keys):
                got = sorted(element) if isinstance(element, dict) else type(element).__name__
                raise ValueError(
                    f"pack_sequences packs features {sorted(self.keys)}, but an element "
                    f"holds {got}; give every feature a length, e.g. sequence_length="
                    f"{dict.fromkeys(got if isinstance(got, list) else self.keys, 128)}, or "
                    "drop the others with map() first"
                )
            arrays = [np.asarray(element[k]) for k in self.keys]
        names = self.keys or ("the sequence",)
        for name, array, length in zip(names, arrays, self.lengths, strict=True):
            if array.ndim == 0 or array.dtype.kind in "OUS":
                raise ValueError(
                    f"pack_sequences packs numeric sequences (arrays of rank >= 1); "
                    f"{name} is {array!r}"
                )
            if len(array) > length:
                raise ValueError(
                    f"{name} holds {len(array)} tokens, more than its sequence_length "
                    f"{length}; truncate first, e.g. ds.map(lambda x: x[:{length}])"
                )
        return arrays


class _Group:
    """`bins` rows being filled first-fit (as Grain's `FirstFitPackedBatch`)."""

    def __init__(self, node: Pack, first: list[np.ndarray]) -> None:
        self.node = node
        bins = node.bins
        self.values = [
            np.full((bins, length, *a.shape[1:]), pad, a.dtype)
            for a, length, pad in zip(first, node.lengths, node.paddings, strict=True)
        ]
        self.segments = [np.zeros((bins, n), np.int32) for n in node.lengths]
        self.positions = [np.zeros((bins, n), np.int32) for n in node.lengths]
        self.free = np.zeros((len(first), bins), np.int64)  # first free cell, per feature
        self.count = np.zeros(bins, np.int32)  # sequences per row
        self.capacity = np.asarray(node.lengths, np.int64)[:, None]

    def add(self, arrays: list[np.ndarray]) -> bool:
        """Puts the sequences in the first row with room for all; False if none has."""
        for i, (array, buffer) in enumerate(zip(arrays, self.values, strict=True)):
            if array.dtype != buffer.dtype or array.shape[1:] != buffer.shape[2:]:
                name = self.node.keys[i] if self.node.keys else "the sequence"
                raise ValueError(
                    f"{name} is a {array.dtype} array of shape {array.shape}; earlier ones "
                    f"were {buffer.dtype} with rows of shape {buffer.shape[2:]}: cast them "
                    "alike (a packed row holds one dtype)"
                )
        needs = np.array([len(a) for a in arrays], np.int64)[:, None]
        fits = np.all(self.free + needs <= self.capacity, axis=0)
        if self.node.max_sequences is not None:
            fits &= self.count < self.node.max_sequences
        if not fits.any():
            return False
        row = int(np.argmax(fits))
        self.count[row] += 1
        for i, array in enumerate(arrays):
            start = int(self.free[i, row])
            end = start + len(array)
            self.values[i][row, start:end] = array
            self.segments[i][row, start:end] = self.count[row]
            self.positions[i][row, start:end] = np.arange(len(array), dtype=np.int32)
            self.free[i, row] = end
        return True

    def rows(self) -> list[Any]:
        """The filled rows as elements (first fit fills rows in order: a prefix)."""
        used = int(np.count_nonzero(self.count))
        out = []
        for r in range(used):
            if self.node.keys is None:
                out.append((self.values[0][r], self.segments[0][r], self.positions[0][r]))
                continue
            row = {}
            for i, k in enumerate(self.node.keys):
                row[k] = self.values[i][r]
                row[f"{k}_segment_ids"] = self.segments[i][r]
                row[f"{k}_positions"] = self.positions[i][r]
            out.append(row)
        return out


class _PackCursor:
    def __init__(self, node: Pack, key: Key, state: dict | None) -> None:
        self.node, self.key = node, key
        self.start = None if state is None else state["parent"]  # where this group began
        self.row = 0 if state is None else int(state["row"])  # rows of it emitted
        self.emitted = 0 if state is None else int(state["emitted"])  # rows before it
        self.parent = open_node(node.parent, key, self.start)
        self.rows: list[Any] | None = None
        self.order: np.ndarray | None = None
        self.pending: list[np.ndarray] | None = None  # read, fit nowhere: the next group's
        self.next_start: Any = None

    def _pack(self) -> None:
        group = None
        while True:
            if self.pending is not None:
                arrays, before, self.pending = self.pending, self.start, None
            else:
                before = self.parent.state()
                try:
                    element = next(self.parent)
                except StopIteration:
                    if group is None:
                        raise
                    self.next_start = self.parent.state()
                    break
                arrays = self.node.features(element)
            if group is None:
                group = _Group(self.node, arrays)
            if not group.add(arrays):
                self.pending, self.next_start = arrays, before
                break
        self.rows = group.rows()
        count = len(self.rows)
        if self.node.shuffle:
            words = (self.node.seed, len(self.key), *self.key, self.emitted)
            self.order = np.random.default_rng(words).permutation(count)
        else:
            self.order = np.arange(count)

    def __next__(self) -> Any:
        if self.rows is None:
            self._pack()
        assert self.rows is not None and self.order is not None
        element = self.rows[int(self.order[self.row])]
        self.row += 1
        if self.row == len(self.rows):  # the group is done: the state moves past it
            self.start, self.emitted = self.next_start, self.emitted + len(self.rows)
            self.row, self.rows = 0, None
        return element

    def state(self) -> dict:
        return {"parent": self.start, "row": self.row, "emitted": self.emitted}


def pack_sequences(
    dataset: Any,
    sequence_length: int | dict[str, int],
    num_packing_bins: int = 32,
    *,
    shuffle_bins: bool = False,
    seed: int = 0,
    padding_value: Any = 0,
    max_sequences_per_bin: int | None = None,
) -> Any:
    """Packs variable-length sequences first-fit into rows of `sequence_length` tokens.

    Why: with sequences of skewed lengths, one sequence per padded row spends most of a
    transformer's compute on padding; packed rows hold several sequences, which the
    model keeps apart by their segment ids (`segment_attention_mask`) and positions.
    The algorithm and parameters are Grain's `FirstFitPackIterDataset`: sequences are
    read in order into `num_packing_bins` rows, each into the first row with room for
    all its features; when one fits nowhere, the rows are emitted and it starts the next
    group. More bins leave less padding and mix sequences from further apart.

    Each element is a dict of 1-D (or higher) arrays, or one bare array. A dict
    feature `k` becomes `k` (padded with `padding_value`), `k_segment_ids` (1, 2, ... per
    sequence in the row, 0 on padding) and `k_positions` (0, 1, ... within each
    sequence), int32 as in Grain and T5; a bare array becomes `(tokens, segment_ids,
    positions)`. Batch after packing. An iterator restored from `get_state` continues in
    the middle of a group exactly (the group is packed again from where it began).

    Args:
      dataset: a `phalanx.data.Dataset` of unbatched sequences.
      sequence_length: the row length: an int for bare arrays, or a dict giving every
        feature's (Grain's `length_struct`).
      num_packing_bins: rows filled at once (Grain's; default 32).
      shuffle_bins: emit each group's rows in a random order drawn from `seed`, the
        epoch and the group (Grain's; default False: in packing order).
      seed: the seed of `shuffle_bins`.
      padding_value: the value of padding cells: a scalar, or a dict per feature.
      max_sequences_per_bin: at most this many sequences per row (None: no limit).

    Returns:
      The packed dataset (streaming: its cardinality is unknown).

    Raises:
      ValueError: a batched dataset, a sequence longer than its length, an element
        whose features differ from `sequence_length`'s, bad arguments.

    Example:
      >>> ds = Dataset.from_generator(token_lists, output_signature=TensorSpec([None], np.int32))
      >>> packed = pack_sequences(ds, 128).batch(32)
      >>> tokens, segment_ids, positions = next(iter(packed))     # each (32, 128)
      >>> mask = segment_attention_mask(segment_ids, causal=True)  # (32, 128, 128)
    """
    node = getattr(dataset, "_node", None)
    if node is None or not callable(getattr(dataset, "_then", None)):
        raise TypeError(f"pack_sequences takes a phalanx.data.Dataset, got {dataset!r}")
    if node.level != 0:
        raise ValueError("pack_sequences packs single sequences; call it before batch()")
    if isinstance(sequence_length, dict):
        keys: tuple[str, ...] | None = tuple(sorted(sequence_length))
        lengths = [sequence_length[k] for k in keys]  # type: ignore[index]
        names = [f"sequence_length[{k!r}]" for k in keys]  # type: ignore[union-attr]
    else:
        keys, lengths, names = None, [sequence_length], ["sequence_length"]
    lengths = [
        validation.check_positive(n, w, "pack_sequences(ds, 128)")
        for n, w in zip(lengths, names, strict=True)
    ]
    if isinstance(padding_value, dict):
        if keys is None or set(padding_value) != set(keys):
            raise ValueError(
                f"padding_value {padding_value!r} must be a scalar, or a dict with the "
                f"features of sequence_length ({list(keys or [])})"
            )
        paddings = tuple(padding_value[k] for k in keys)
    else:
        paddings = (padding_value,) * len(lengths)
    bins = validation.check_positive(
        num_packing_bins, "num_packing_bins", "pack_sequences(ds, 128, 32)"
    )
    most = max_sequences_per_bin
    if most is not None:
        most = validation.check_positive(most, "max_sequences_per_bin", "max_sequences_per_bin=8")
    seed = int(seed)
    return dataset._then(
        Pack(node, keys, tuple(lengths), paddings, bins, bool(shuffle_bins), seed, most)
    )


def segment_attention_mask(
    segment_ids: Any, key_segment_ids: Any = None, *, causal: bool = False
) -> Any:
    """The attention mask that keeps packed sequences apart: True where a query may attend.

    Query i attends to key j when both carry the same segment id (padding, id 0, attends
    only to padding, so no row is all False and a softmax never divides by zero) and,
    with `causal`, j <= i. NumPy in, NumPy out (in a host pipeline); a JAX array or a
    tracer in, JAX out (inside a jitted model).

    Use it as `mask` in Flax NNX attention (`nnx.MultiHeadAttention(...)(x, mask=
    mask[:, None])`, the None a heads axis, or `nnx.dot_product_attention`) and as
    `attention_mask` in Keras's `MultiHeadAttention(...)(x, x, attention_mask=mask)`.
    Position embeddings then read `positions` (from `pack_sequences`), not the cell index.

    Args:
      segment_ids: int array (..., q_length): the queries' segment ids.
      key_segment_ids: the keys' (..., k_length); default `segment_ids` (self-attention).
      causal: also mask keys after the query (self-attention only).

    Returns:
      A bool array (..., q_length, k_length).

    Raises:
      ValueError: `causal` with keys of another length than the queries.

    Example:
      >>> segment_attention_mask(np.array([1, 1, 2, 0]), causal=True).astype(int)
      array([[1, 0, 0, 0],
             [1, 1, 0, 0],
             [0, 0, 1, 0],
             [0, 0, 0, 1]])
    """
    import jax

    keys = segment_ids if key_segment_ids is None else key_segment_ids
    xp: Any = np
    if isinstance(segment_ids, jax.Array) or isinstance(keys, jax.Array):
        import jax.numpy as xp
    queries, keys = xp.asarray(segment_ids), xp.asarray(keys)
    mask = queries[..., :, None] == keys[..., None, :]
    if causal:
        if queries.shape[-1] != keys.shape[-1]:
            raise ValueError(
                f"causal=True needs queries and keys of one length, got {queries.shape[-1]} "
                f"and {keys.shape[-1]}; pass causal=False for cross-attention"
            )
        n = queries.shape[-1]
        mask = mask & xp.tril(xp.ones((n, n), bool))
    return mask
