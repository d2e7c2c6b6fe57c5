"""`predict`: the model's outputs for every example, in order, as NumPy.

Example:
  >>> probabilities = predict(model, x_test, batch_size=1024)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np

from phalanx._src.strategy.distribute import BatchDistributor
from phalanx._src.train.api.callbacks.callback_list import CallbackList
from phalanx._src.train.engine import execution
from phalanx._src.train.engine.step import unpack
from phalanx._src.train.engine.transfers import Transfers
from phalanx._src.train.feeding import sources
from phalanx._src.train.feeding.batches import Groups
from phalanx._src.train.feeding.feeders import Feeder, HostFeeder, ResidentFeeder
from phalanx._src.train.loops.phase import MAX_IN_FLIGHT


def predict(
    model: Any,
    x: Any,
    *,
    batch_size: int | None = None,
    verbose: int | str = "auto",
    steps: int | None = None,
    callbacks: Iterable[Any] | None = None,
    device_data: bool | str = "auto",
) -> Any:
    """The outputs of `model` (a compiled `phalanx.Model`) for every example, in order, as
    NumPy (padded rows dropped).

    Batches go in groups of K = `steps_per_execution`: batch hooks run once per group
    (begin: its first batch, end: its last), and the outputs stay on the devices until up
    to `phase.MAX_IN_FLIGHT` groups' worth are copied to the host together (few large
    transfers, not one per batch). With `device_data=True` a group is one compiled call
    (single calls for a convnet on XLA:CPU, see execution.py); host batches ('auto') are
    sent ahead in a thread and run one call each.
    """
    # One pass reads each row once: sending it in its batch, sharded, moves less than
    # replicating the whole array on every device first, so 'auto' means host batches here.
    engine = model.engine
    data, source = sources.on_devices(
        engine.strategy,
        sources.host_data(x, None, None, batch_size, shuffle=False, seed=None),
        False if device_data == "auto" else device_data,
    )
    cbs = CallbackList(callbacks, model=model, steps=steps or sources.length(data))
    distributor = BatchDistributor(engine.strategy, pad_at_end=True)
    k = engine.steps_per_call(steps or sources.length(data))
    # Host batches run one call each: stacking K of them first is one more host copy of
    # every row, which costs more than the K-1 dispatches it saves (measured: 0.6x at K=50).
    mode = [None if k > 1 and source is not None else execution.LOOP]
    ledger, masks = engine.transfers, {}  # what crosses, counted (`engine.transfers`)

    def arrays(host: Any) -> tuple[Any, Any]:
        with ledger.door() as door:  # (through the ledger: see `transfers.Door`)
            return door.pair(distributor.arrays(host), masks)

    def put(group: list[Any]) -> tuple[list[tuple[Any, Any, Any, list[int]]], int]:
        """A group's calls `(fn, device batch, mask, real rows)` and its batch count."""
        if engine.input_spec is None:  # the inputs' shapes, for model.export and summary
            engine.input_spec = jax.tree.map(_spec, unpack(group[0])[0])
        if mode[0] is None:
            batch, mask = arrays(group[0])
            mode[0] = execution.predict_mode(engine, None if source is None else source.spec, batch)
        if mode[0] == execution.SCAN:
            with ledger.door() as door:
                batch, mask = door.pair(distributor.stacked(group, k), masks)
            calls = [(execution.predict_fn(engine, many=True), batch, mask)]
        else:
            fn = execution.predict_fn(engine)
            calls = [(fn, *arrays(host)) for host in group]
        reals = _split_rows(group, len(calls))
        return [(*call, real) for call, real in zip(calls, reals, strict=True)], len(group)

    parts: list[Any] = []  # host outputs, real rows only
    pending: list[tuple[Any, list[int], Any]] = []  # (device outputs, real rows, mask)
    cbs.on_predict_begin()
    iterator = iter(data)
    batches: Feeder
    if source is not None:  # one group ahead, made in this thread between calls
        batches = ResidentFeeder(Groups(iterator, k, steps), _one_each(put), 1)
    else:  # host batches, one by one, made and sent ahead in a thread, overlapping the calls
        batches = HostFeeder(Groups(iterator, 1, steps), put, prefetch=2)
    index = 0
    try:
        with batches:
            for calls, n in batches:
                if index % k == 0:
                    cbs.on_predict_batch_begin(index)
                for fn, batch, mask, real in calls:
                    placed = None if source is None else source.arrays(ledger.door())
                    pending.append((fn(engine.state, placed, batch), real, mask))
                batches.advance()
                index += n
                if index % k == 0:
                    cbs.on_predict_batch_end(index - 1)
                if len(pending) >= MAX_IN_FLIGHT:
                    parts.extend(_to_host(pending, ledger))
                    pending = []
            if index % k:  # a last, short group
                cbs.on_predict_batch_end(index - 1)
            parts.extend(_to_host(pending, ledger))
    finally:
        sources.close(iterator)
    cbs.on_predict_end()
    if not parts:
        raise ValueError("predict got no batch: the data is empty")
    return jax.tree.map(lambda *p: np.concatenate(p), *parts)


def _spec(array: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(array.shape, array.dtype)


def _one_each(put: Callable[[list[Any]], Any]) -> Callable:
    """`ResidentFeeder`'s fill for predict: each group's device input made by `put`."""

    def fill(taken: list[tuple[list[Any], Any]]) -> list[tuple[Any, Any]]:
        return [(put(group), state) for group, state in taken]

    return fill


def _split_rows(group: list[Any], calls: int) -> list[list[int]]:
    """Each call's batches' real row counts: one call for the whole group, or one each."""
    rows = [int(np.shape(jax.tree.leaves(b)[0])[0]) for b in group]
    return [rows] if calls == 1 else [[r] for r in rows]


def _to_host(pending: list[tuple[Any, list[int], Any]], ledger: Transfers) -> list[Any]:
    """The real rows of queued outputs: one device-to-host copy of them all (counted in
    `ledger`).

    With one process, padding sits after a batch's real rows (`pad_at_end`), so the first
    `real` rows are kept; with several, each process's share is padded on its own and the
    global mask says which rows are real.
    """
    if not pending:
        return []
    ledger.read([outputs for outputs, _, _ in pending])
    if jax.process_count() > 1:
        out = []
        for outputs, _, mask in pending:
            keep = _host(mask).astype(bool).reshape(-1)
            flat = jax.tree.map(lambda p, d=mask.ndim: _host(p).reshape(-1, *p.shape[d:]), outputs)
            out.append(jax.tree.map(lambda p, keep=keep: p[keep], flat))
        return out
    hosts = jax.device_get([outputs for outputs, _, _ in pending])
    out = []
    for host, (_, real, mask) in zip(hosts, pending, strict=True):
        if mask.ndim == 1:  # one batch
            out.append(jax.tree.map(lambda p, n=real[0]: p[:n], host))
        else:  # K stacked batches; missing ones (a short last group) have no real row
            for i, n in enumerate(real):
                out.append(jax.tree.map(lambda p, i=i, n=n: p[i, :n], host))
    return out


def _host(array: jax.Array) -> np.ndarray:
    if array.is_fully_addressable:
        return np.asarray(array)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
