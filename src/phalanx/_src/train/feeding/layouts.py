"""How in-order resident data is laid out on the devices (for `blocks.Blocks`).

Placed from the host once (`lay_out`): every whole batch split over the replicas, as one
`(P, B, ...)` body for a scan or one array per batch for single calls, and the padded
partial last batch with its mask; a body with a padded batch is written in parts into an
array made on the devices, so that no host copy of the data is made. Everything else
happens on the devices, with nothing crossing: the blocks cut from the source replicated
there (`lay_out` of device arrays), one layout restacked into the other (`restack`,
`restack_masks`), the blocks flattened back into the replicated source that windows read
(`flatten`), and a cursor moved between a block and its first row (`convert`). Each
program is compiled once per sharding and shape for the process (`functools.cache`).

Example:
  >>> made = lay_out(host, rows=1024, length=60000, stacked=True, data=..., stacked_on=...)
  >>> made["layout"]["body"], made["crossed"]     # the body, and what crossed
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from phalanx._src.strategy import layout
from phalanx._src.train.engine.execution import WINDOW

_WRITES = 8  # a padded last batch: the body is written in ~8 parts (peak: 1/8 more memory)


@functools.cache
def convert(sharding: Any, rows: int, to: str) -> Callable:
    """A block cursor to the window at its first row, or back (compiled once per size)."""
    return jax.jit(lambda c: c * rows if to == WINDOW else c // rows, out_shardings=sharding)


def lay_out(
    host: Any, rows: int, length: int, stacked: bool, data: NamedSharding, stacked_on: Any
) -> dict[str, Any]:
    """The blocks of `host` (NumPy arrays, or the source already replicated on the
    devices): `{"layout": {...}, "crossed": what was put from the host}`."""
    whole, tail = divmod(length, rows)
    from_host = not isinstance(jax.tree.leaves(host)[0], jax.Array)
    out: dict[str, Any] = {}
    crossed: list = []
    index = mask = None
    if tail:
        # The host pipeline's padding (a pad repeats a real row), so the numbers match.
        index, mask = layout.padded_index(tail, 1, rows)
    if not from_host:  # cut on the devices: nothing crosses but the masks
        pad = None if index is None else tuple(int(i) for i in index)
        cut = _cut(stacked_on if stacked else data, stacked, rows, whole, pad)
        out["body" if stacked else "batches"] = cut(host)
    elif stacked:
        out["body"] = _place_body(host, rows, whole, index, stacked_on, crossed)
    else:

        def one(first: int) -> Any:
            return jax.tree.map(
                lambda a: jax.device_put(a[first * rows : (first + 1) * rows], data), host
            )

        batches = [one(j) for j in range(whole)]
        if tail:
            padded = jax.tree.map(lambda a: np.take(a[whole * rows :], index, axis=0), host)
            batches.append(jax.device_put(padded, data))
        crossed.extend(batches)
        out["batches"] = batches
    if tail:
        if stacked:
            masks = np.ones((whole + 1, rows), dtype=bool)
            masks[whole] = mask
            out["masks"] = jax.device_put(masks, stacked_on)
            crossed.append(out["masks"])
        else:
            out["tail_mask"] = jax.device_put(mask, data)
            crossed.append(out["tail_mask"])
    return {"layout": out, "crossed": crossed}


def _place_body(
    host: Any, rows: int, whole: int, index: np.ndarray | None, sharding: Any, crossed: list
) -> Any:
    """`(P, rows, ...)` per leaf from the host arrays, with no host copy of the data:
    views of the whole batches, and the padded last batch written in after them."""

    def view(a: np.ndarray, first: int, count: int) -> np.ndarray:
        part = a[first * rows : (first + count) * rows]
        return part.reshape(count, rows, *a.shape[1:])

    if index is None:
        body = jax.tree.map(lambda a: jax.device_put(view(a, 0, whole), sharding), host)
        crossed.append(body)
        return body
    # The padded batch is not a view: the body is made on the devices and written in parts
    # of `per` batches (in place: donated), the last one with the padded batch after its
    # whole ones (a host copy of at most `per` batches).
    count = whole + 1
    per = -(-count // _WRITES)
    shapes = tuple(((count, rows, *a.shape[1:]), np.dtype(a.dtype)) for a in jax.tree.leaves(host))
    body = _zeros(sharding, jax.tree.structure(host), shapes)()
    for first in range(0, count, per):
        size = min(per, count - first)

        def part(a: np.ndarray, first: int = first, size: int = size) -> np.ndarray:
            if first + size <= whole:
                return view(a, first, size)
            padded = np.take(a[whole * rows :], index, axis=0)[None]
            return np.concatenate([view(a, first, whole - first), padded])

        placed = jax.device_put(jax.tree.map(part, host), sharding)
        at = jax.device_put(np.int32(first), NamedSharding(sharding.mesh, PartitionSpec()))
        crossed.extend([placed, at])
        body = _write(sharding)(body, placed, at)
    return body


@functools.cache
def _zeros(sharding: Any, treedef: Any, shapes: tuple) -> Callable:
    """A compiled `() -> zeros` of the body's shapes (made on the devices: nothing crosses)."""

    def zeros() -> Any:
        leaves = [jnp.zeros(shape, dtype) for shape, dtype in shapes]
        return jax.tree.unflatten(treedef, leaves)

    return jax.jit(zeros, out_shardings=sharding)


@functools.cache
def _write(sharding: Any) -> Callable:
    """`(body, part, at) -> body` with `part` written at batch `at`, in place."""

    def write(body: Any, part: Any, at: jax.Array) -> Any:
        return jax.tree.map(lambda b, p: lax.dynamic_update_slice_in_dim(b, p, at, 0), body, part)

    return jax.jit(write, donate_argnums=0, out_shardings=sharding)


@functools.cache
def _cut(sharding: Any, stacked: bool, rows: int, whole: int, pad: tuple | None) -> Callable:
    """The blocks cut on the devices from the replicated source: the `(P, rows, ...)` body
    (`stacked`) or the list of `(rows, ...)` batches; `pad`: the padded last batch's rows
    (compiled once per layout)."""

    def blocks(a: jax.Array) -> Any:
        body = a[: whole * rows].reshape(whole, rows, *a.shape[1:])
        if pad is not None:
            padded = jnp.take(a[whole * rows :], jnp.asarray(pad), axis=0)
            body = jnp.concatenate([body, padded[None]])
        return body if stacked else [body[j] for j in range(body.shape[0])]

    def cut(source: Any) -> Any:
        leaves, treedef = jax.tree.flatten(source)
        made = [blocks(a) for a in leaves]
        if stacked:
            return jax.tree.unflatten(treedef, made)
        return [jax.tree.unflatten(treedef, list(parts)) for parts in zip(*made, strict=True)]

    return jax.jit(cut, out_shardings=sharding)


@functools.cache
def restack(stacked: bool, sharding: Any) -> Callable:
    """One array per batch into one `(P, B, ...)` body (`stacked`), or back, on the
    devices: what `auto`'s trial needs when it goes from single calls to a scan."""

    def restack(parts: Any) -> Any:
        if stacked:
            return jax.tree.map(lambda *batches: jnp.stack(batches), *parts)
        count = jax.tree.leaves(parts)[0].shape[0]
        return [jax.tree.map(lambda a, j=j: a[j], parts) for j in range(count)]

    return jax.jit(restack, out_shardings=sharding)


@functools.cache
def restack_masks(stacked: bool, count: int, sharding: Any) -> Callable:
    """The padded batch's mask in the other layout's form (see `_lay_out`): the `(P, B)`
    masks of a body (`stacked`; all True but the last), or its last row alone."""

    def restack(mask: jax.Array) -> jax.Array:
        if stacked:
            return jnp.concatenate([jnp.ones((count - 1, mask.shape[0]), bool), mask[None]])
        return mask[-1]

    return jax.jit(restack, out_shardings=sharding)


@functools.cache
def flatten(sharding: Any, tail: int, stacked: bool) -> Callable:
    """`blocks -> (N, ...)` arrays replicated by `sharding`: the whole batches' rows and the
    partial one's real rows, in order (the source the windows and gathers read)."""

    def flat(parts: Any) -> Any:
        if stacked:

            def one(body: jax.Array) -> jax.Array:
                rows = body.shape[1]
                whole = body.shape[0] - (1 if tail else 0)
                out = body[:whole].reshape(whole * rows, *body.shape[2:])
                return jnp.concatenate([out, body[whole, :tail]]) if tail else out

            return jax.tree.map(one, parts)

        def join(*batches: jax.Array) -> jax.Array:
            whole = batches[:-1] if tail else batches
            out = jnp.concatenate(whole)
            return jnp.concatenate([out, batches[-1][:tail]]) if tail else out

        return jax.tree.map(join, *parts)

    return jax.jit(flat, out_shardings=sharding)
