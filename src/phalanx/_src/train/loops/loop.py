"""The fit / evaluate / predict loops (Keras's arguments), over `feed.run_phase`."""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from phalanx._src.data.adapters import as_batches
from phalanx._src.data.prefetch import DevicePrefetcher
from phalanx._src.data.wait import InputWaitMeter
from phalanx._src.strategy.distribute import BatchDistributor
from phalanx._src.train.api import fit_options
from phalanx._src.train.api.callbacks.callback_list import CallbackList
from phalanx._src.train.checkpoint import preemption
from phalanx._src.train.engine import checks, execution, flop_rate
from phalanx._src.train.feeding import feed
from phalanx._src.train.feeding.device_data import Blocks

if TYPE_CHECKING:
    from phalanx._src.train.model import Model


def fit(
    model: Model,
    x: Any = None,
    y: Any = None,
    *,
    batch_size: int | None = None,
    epochs: int = 1,
    verbose: int | str = "auto",
    callbacks: Iterable[Any] | None = None,
    validation_data: Any = None,
    shuffle: bool = True,
    sample_weight: Any = None,
    initial_epoch: int = 0,
    steps_per_epoch: int | None = None,
    validation_steps: int | None = None,
    validation_batch_size: int | None = None,
    validation_freq: int = 1,
    validation_split: float = 0.0,
    class_weight: dict[int, float] | None = None,
    seed: int | None = None,
    prefetch: int = 2,
    device_data: bool | str = "auto",
) -> Any:
    """Trains `model` for `epochs` epochs, as `keras.Model.fit`.

    Args:
      x, y, sample_weight: NumPy arrays (batched by `batch_size`, default 32, and shuffled
        every epoch when `shuffle`), or in `x` alone a dataset yielding `(x, y)` /
        `(x, y, sample_weight)` batches: a phalanx Dataset, Grain dataset or loader, tf.data
        dataset, PyTorch DataLoader, or any iterable of NumPy batches.
      epochs: the epoch to stop at (with `initial_epoch`, the epochs run are
        initial_epoch .. epochs-1).
      verbose: 0 silent, 1 progress bar, 2 one line per epoch; 'auto' = 1.
      callbacks: `phalanx.callbacks.Callback`s; a History is always added.
      validation_data: `(x_val, y_val[, sw])` arrays or a dataset, evaluated every
        `validation_freq` epochs; its logs are prefixed 'val_'.
      validation_split: for array inputs, the fraction of examples (the last ones, before
        shuffling, as Keras) held out as validation data when `validation_data` is None.
      class_weight: for a single-output model on array inputs, `{class index: weight}`;
        each example's weight (classes not listed: 1.0) is multiplied into
        `sample_weight`. See `phalanx._src.train.api.fit_options`.
      steps_per_epoch: batches per epoch; required for an infinite dataset. With a finite
        one, the data iterator then carries over from epoch to epoch and restarts when it
        runs out.
      seed: the shuffle seed for arrays (default: a fresh random seed).
      prefetch: batches made ahead in a thread and put on the devices ahead of use; 0 makes
        each batch in the loop's own thread when it is needed. Device-resident data
        (`device_data`) needs no thread: its row numbers go over ~128 steps at a time.
      device_data: keep an in-memory phalanx Dataset's arrays on the devices and send only
        row numbers: 'auto' (when they fit), True, or False.

    Returns:
      The `History` callback (`history.history` maps each log name to per-epoch values).

    Raises:
      ValueError: for bad arguments or data, before anything is compiled.
    """
    if not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be an int >= 0, got {epochs!r}")
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"prefetch must be an int >= 0 (0: no prefetch thread), got {prefetch!r}")
    if not 0 <= initial_epoch <= max(epochs, 0):
        raise ValueError(f"initial_epoch {initial_epoch} must be in [0, epochs={epochs}]")
    if validation_split:
        (x, y, sample_weight), held_out = fit_options.validation_split(
            x, y, sample_weight, validation_split
        )
        if validation_data is None:  # as in Keras, validation_data wins
            validation_data = tuple(v for v in held_out if v is not None)
    if class_weight is not None:
        sample_weight = fit_options.class_weights(y, class_weight, sample_weight)
    host = feed.host_data(x, y, sample_weight, batch_size, shuffle, seed)
    checked = checks.check_data(model, host)  # shapes and labels, before anything compiles
    data, source = feed.on_devices(model, host, device_data)
    blocks = None if source is None else Blocks(source, model.strategy)
    steps_known = steps_per_epoch or feed.length(data)
    if steps_known is None and _is_infinite(data):
        raise ValueError(
            "the dataset repeats forever; pass steps_per_epoch=N so fit knows where an epoch ends"
        )
    val_data = None
    if validation_data is not None:
        val_source = _validation_source(validation_data, validation_batch_size or batch_size)
        checks.check_data(model, val_source)  # in-memory validation arrays, before epoch 1
        val_data = feed.on_devices(model, val_source, device_data)
    verbose = 1 if verbose == "auto" else verbose
    cbs = CallbackList(
        callbacks,
        add_history=True,
        add_progbar=verbose != 0,
        model=model,
        epochs=epochs,
        steps=steps_known,
        verbose=verbose,
    )
    model.history = cbs.history
    model.stop_training = False
    model._fit_epoch = initial_epoch
    model._fit_resume = None
    model._fit_steps_done = 0
    meter = InputWaitMeter()
    epoch_logs: dict[str, float] = {}
    carried: Iterator[Any] | None = None
    cbs.on_train_begin()
    start_epoch = model._fit_epoch  # BackupAndRestore may move it in on_train_begin
    iterator: Iterator[Any] | None = None
    # An epoch's end (its logs, `on_epoch_end`) and the next one's `on_epoch_begin` run
    # once the next epoch's first call is dispatched, when every callback with an epoch
    # hook is async-safe and nothing else happens in between (validation, a stop).
    overlap = cbs.epoch_hooks_deferred()
    deferred: Callable[[], None] | None = None
    in_flight = feed.InFlight()  # across epochs: the next one's calls queue behind this one's
    # SIGTERM: every process backs up at one agreed step and exits 143 (see preemption.py).
    watch = preemption.PreemptionWatch(model, cbs).start()
    try:
        for epoch in range(start_epoch, epochs):
            model._fit_epoch = epoch
            feed.reset_metrics(model)
            begin = functools.partial(cbs.on_epoch_begin, epoch)
            if deferred is None:
                begin()
            else:
                begin = _then(deferred, begin)
            t0 = time.perf_counter()
            iterator, limit = _epoch_iterator(model, data, steps_per_epoch, carried)
            iterator = checks.watch(model, iterator, source, checked)  # each batch, if not all
            iterator = flop_rate.watch(model, iterator)  # keeps batch 1 for the FLOP count
            steps, exhausted, model._last_data_state = feed.run_phase(
                model,
                "train",
                iterator,
                limit,
                cbs,
                meter,
                model._on_train_steps,
                prefetch,
                source,
                steps_hint=steps_known,
                # A carried iterator's next epoch starts reading before this one ends.
                next_limit=steps_per_epoch if epoch + 1 < epochs else None,
                blocks=blocks,
                after_first=None if deferred is None else begin,
                in_flight=in_flight,
            )
            if deferred is not None and steps == 0:
                begin()  # no call was dispatched to run it after
            model._fit_steps_done = 0
            carried = None if (exhausted or steps_per_epoch is None) else iterator
            if carried is None:
                feed.close(iterator)
            elapsed = time.perf_counter() - t0
            validates = val_data is not None and (epoch + 1) % validation_freq == 0
            end = functools.partial(
                _end_epoch,
                model,
                cbs,
                epoch,
                model._last_logs,  # the last call's logs, before the next reset
                steps,
                float(steps * _global_batch(data)),
                elapsed,
                meter.epoch_summary()["input_wait_fraction"],
                iterator,
                source,
                val_data if validates else None,
                validation_steps,
            )
            if overlap and epoch + 1 < epochs and steps and not (validates or model.stop_training):
                deferred = end  # the logs of an epoch before the last are only the hooks'
                continue
            deferred = None
            in_flight.drain()
            epoch_logs = end()
            if model.stop_training:
                break
    finally:
        # Whether fit returns, raises or is interrupted, no pipeline thread outlives it.
        feed.close(iterator)
        feed.close(carried)
        watch.stop()
        model._next_table = None
        in_flight.drain()
    cbs.on_train_end(epoch_logs)
    return model.history


def _end_epoch(
    model: Model,
    cbs: CallbackList,
    epoch: int,
    values: Any,
    steps: int,
    examples: float,
    elapsed: float,
    wait: float,
    iterator: Iterator[Any],
    source: Any,
    val_data: Any,
    validation_steps: int | None,
) -> dict[str, float]:
    """The epoch's logs (validating on `val_data` if given) after `on_epoch_end` got them;
    `values`: the epoch's last call's log values."""
    logs = feed.fetch_logs(model, values)
    logs["examples_per_second"] = examples / elapsed if elapsed > 0 else 0.0
    logs["input_wait_fraction"] = wait
    logs.update(flop_rate.epoch_logs(model, iterator, steps, elapsed, source))
    if val_data is not None:
        val_logs = _evaluate_logs(model, val_data, validation_steps)
        logs.update({f"val_{k}": v for k, v in val_logs.items()})
    if steps == 0:
        warnings.warn(f"epoch {epoch + 1} ran no step: the data is empty or ran out", stacklevel=4)
    cbs.on_epoch_end(epoch, logs)
    return logs


def _then(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        first()
        second()

    return both


def _epoch_iterator(
    model: Model, data: Iterable[Any], steps_per_epoch: int | None, carried: Iterator | None
) -> tuple[Iterator[Any], int | None]:
    """The epoch's host iterator and step limit, resuming a restored position if any."""
    resume, model._fit_resume = model._fit_resume, None
    if resume is None:
        return (carried if carried is not None else iter(data)), steps_per_epoch
    iterator = iter(data)
    if resume["data"] is not None and getattr(iterator, "checkpointable", False):
        iterator.set_state(resume["data"])
        if resume["epoch_done"] and steps_per_epoch is None:
            iterator = iter(data)  # the saved position ends an epoch: start the next one
    model._fit_steps_done = resume["steps_done"]
    if steps_per_epoch is None:
        return iterator, None
    return iterator, steps_per_epoch - resume["steps_done"]


def _is_infinite(data: Any) -> bool:
    cardinality = getattr(data, "cardinality", None)
    if callable(cardinality):
        cardinality = cardinality()
    return cardinality == float("inf")


def _global_batch(data: Any) -> int:
    batch = getattr(data, "batch_size", None)
    return int(batch) if isinstance(batch, int) else 0


def _validation_source(validation_data: Any, batch_size: int | None) -> Iterable[Any]:
    if isinstance(validation_data, tuple) and all(
        isinstance(v, np.ndarray | jax.Array) for v in validation_data
    ):
        return as_batches(validation_data, batch_size)
    return as_batches(validation_data, None)


def _evaluate_logs(model: Model, data: tuple, steps: int | None) -> dict[str, float]:
    feed.reset_metrics(model)
    quiet = CallbackList([], model=model)
    batches, source = data
    iterator = iter(batches)
    try:
        feed.run_phase(
            model,
            "test",
            iterator,
            steps,
            quiet,
            None,
            source=source,
            steps_hint=feed.length(batches),
        )
    finally:
        feed.close(iterator)
    logs = feed.fetch_logs(model)
    feed.reset_metrics(model)
    return logs


def evaluate(
    model: Model,
    x: Any = None,
    y: Any = None,
    *,
    batch_size: int | None = None,
    verbose: int | str = "auto",
    sample_weight: Any = None,
    steps: int | None = None,
    callbacks: Iterable[Any] | None = None,
    return_dict: bool = False,
    device_data: bool | str = "auto",
) -> Any:
    """The loss and metrics over every example of the data, each counted once.

    Padded rows of a last partial batch never count, so the numbers are the one-device
    numbers on any replica count.

    Returns:
      `return_dict=True`: `{name: value}`. Otherwise, as Keras: the loss alone when there is
      no metric, else `[loss, *metrics]`.
    """
    host = feed.host_data(x, y, sample_weight, batch_size, shuffle=False, seed=None)
    checked = checks.check_data(model, host)  # shapes and labels, before anything compiles
    data, source = feed.on_devices(model, host, device_data)
    verbose = 1 if verbose == "auto" else verbose
    cbs = CallbackList(callbacks, model=model, steps=steps or feed.length(data), verbose=verbose)
    feed.reset_metrics(model)
    cbs.on_test_begin()
    iterator = checks.watch(model, iter(data), source, checked)
    try:
        feed.run_phase(
            model, "test", iterator, steps, cbs, None, source=source, steps_hint=feed.length(data)
        )
    finally:
        feed.close(iterator)
    logs = feed.fetch_logs(model)
    cbs.on_test_end(logs)
    if return_dict:
        return logs
    values = list(logs.values())
    return values[0] if len(values) == 1 else values


def predict(
    model: Model,
    x: Any,
    *,
    batch_size: int | None = None,
    verbose: int | str = "auto",
    steps: int | None = None,
    callbacks: Iterable[Any] | None = None,
    device_data: bool | str = "auto",
) -> Any:
    """The model's outputs for every example, in order, as NumPy (padded rows dropped).

    Batches go in groups of K = `steps_per_execution`: batch hooks run once per group
    (begin: its first batch, end: its last), and the outputs stay on the devices until up
    to `feed.MAX_IN_FLIGHT` groups' worth are copied to the host together (few large
    transfers, not one per batch). With `device_data=True` a group is one compiled call
    (single calls for a convnet on XLA:CPU, see execution.py); host batches ('auto') are
    sent ahead in a thread and run one call each.
    """
    # One pass reads each row once: sending it in its batch, sharded, moves less than
    # replicating the whole array on every device first, so 'auto' means host batches here.
    data, source = feed.on_devices(
        model,
        feed.host_data(x, None, None, batch_size, shuffle=False, seed=None),
        False if device_data == "auto" else device_data,
    )
    cbs = CallbackList(callbacks, model=model, steps=steps or feed.length(data))
    distributor = BatchDistributor(model.strategy, pad_at_end=True)
    k = model._execution_k(steps or feed.length(data))
    # Host batches run one call each: stacking K of them first is one more host copy of
    # every row, which costs more than the K-1 dispatches it saves (measured: 0.6x at K=50).
    mode = [None if k > 1 and source is not None else execution.LOOP]

    def put(group: list[Any]) -> tuple[list[tuple[Any, Any, Any, list[int]]], int]:
        """A group's calls `(fn, device batch, mask, real rows)` and its batch count."""
        if mode[0] is None:
            batch, mask = distributor.arrays(group[0])
            mode[0] = execution.predict_mode(model, source, batch)
        if mode[0] == execution.SCAN:
            batch, mask = distributor.stacked(group, k)
            calls = [(execution.predict_fn(model, many=True), batch, mask)]
        else:
            fn = execution.predict_fn(model)
            calls = [(fn, *distributor.arrays(host)) for host in group]
        reals = _split_rows(group, len(calls))
        return [(*call, real) for call, real in zip(calls, reals, strict=True)], len(group)

    parts: list[Any] = []  # host outputs, real rows only
    pending: list[tuple[Any, list[int], Any]] = []  # (device outputs, real rows, mask)
    cbs.on_predict_begin()
    iterator = iter(data)
    if source is not None:
        batches = feed.Ahead(feed.Groups(iterator, k, steps), put)
    else:  # host batches, one by one, made and sent ahead in a thread, overlapping the calls
        batches = DevicePrefetcher(feed.Groups(iterator, 1, steps), put, put_in_thread=True)
    index = 0
    try:
        with batches:
            for calls, n in batches:
                if index % k == 0:
                    cbs._call_batch("predict", "begin", index, None)
                for fn, batch, mask, real in calls:
                    pending.append((fn(model._state, source, batch), real, mask))
                if source is not None:
                    batches.advance()
                index += n
                if index % k == 0:
                    cbs._call_batch("predict", "end", index - 1, None)
                if len(pending) >= feed.MAX_IN_FLIGHT:
                    parts.extend(_to_host(pending))
                    pending = []
            if index % k:  # a last, short group
                cbs._call_batch("predict", "end", index - 1, None)
            parts.extend(_to_host(pending))
    finally:
        feed.close(iterator)
    cbs.on_predict_end()
    if not parts:
        raise ValueError("predict got no batch: the data is empty")
    return jax.tree.map(lambda *p: np.concatenate(p), *parts)


def _split_rows(group: list[Any], calls: int) -> list[list[int]]:
    """Each call's batches' real row counts: one call for the whole group, or one each."""
    rows = [int(np.shape(jax.tree.leaves(b)[0])[0]) for b in group]
    return [rows] if calls == 1 else [[r] for r in rows]


def _to_host(pending: list[tuple[Any, list[int], Any]]) -> list[Any]:
    """The real rows of queued outputs: one device-to-host copy of them all.

    With one process, padding sits after a batch's real rows (`pad_at_end`), so the first
    `real` rows are kept; with several, each process's share is padded on its own and the
    global mask says which rows are real.
    """
    if not pending:
        return []
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
