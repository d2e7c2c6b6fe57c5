"""The fit / evaluate / predict loops: feed, step, bound what is in flight, report.

The device never waits for the host: host batches are made ahead in a thread and put on the
devices ahead of use (`DevicePrefetcher`); K steps run per compiled call; logs are fetched
only every K steps when a callback wants them, and at the end of an epoch. On XLA:CPU more
than ~30 queued calls with a collective deadlock (stack-facts), so at most
`MAX_IN_FLIGHT` calls are queued.
"""

from __future__ import annotations

import collections
import time
import warnings
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from phalanx._src.data.adapters import as_batches
from phalanx._src.data.dataset import Dataset
from phalanx._src.data.prefetch import DevicePrefetcher
from phalanx._src.data.wait import InputWaitMeter
from phalanx._src.strategy.distribute import BatchDistributor
from phalanx._src.train import device_data, execution
from phalanx._src.train.callbacks.callback_list import CallbackList

if TYPE_CHECKING:
    from phalanx._src.train.model import Model

MAX_IN_FLIGHT = 8


def host_data(
    x: Any, y: Any, sample_weight: Any, batch_size: int | None, shuffle: bool, seed: int | None
) -> Iterable[Any]:
    """Keras's inputs as an iterable of host batches: arrays (with y, sample_weight) or any
    source `phalanx.data.as_batches` accepts."""
    if x is None:
        raise ValueError("no data: pass x (arrays or a dataset), e.g. model.fit(x_train, y_train)")
    if y is None and sample_weight is None:
        data = x
    else:
        data = tuple(v for v in (x, y, sample_weight) if v is not None)
    if shuffle and seed is None:
        seed = int(np.random.SeedSequence().generate_state(1)[0])
    batches = as_batches(data, batch_size, shuffle=shuffle, seed=seed)
    if jax.process_count() > 1 and isinstance(batches, Dataset) and batches.split is None:
        batches = batches.process_split()  # each process reads only its share of a batch
    return batches


def on_devices(model: Model, data: Iterable[Any], mode: bool | str) -> tuple[Iterable, Any]:
    """`(what to iterate, on-device source arrays or None)`; see `device_data`."""
    placed = device_data.prepare(data, model.strategy, mode)
    return (data, None) if placed is None else (placed.indices, placed.arrays)


class Groups:
    """Groups of up to K host batches, at most `limit` batches in all (None: to the end)."""

    def __init__(self, source: Iterator[Any], k: int, limit: int | None) -> None:
        self._source = source
        self._k = k
        self._left = limit
        self.checkpointable = bool(getattr(source, "checkpointable", False))
        self.exhausted = False

    def __iter__(self) -> Groups:
        return self

    def __next__(self) -> list[Any]:
        group: list[Any] = []
        while len(group) < self._k and (self._left is None or self._left > 0):
            try:
                group.append(next(self._source))
            except StopIteration:
                self.exhausted = True
                break
            if self._left is not None:
                self._left -= 1
        if not group:
            raise StopIteration
        return group

    def get_state(self) -> Any:
        return self._source.get_state()


class Direct:
    """Device batches made in the calling thread, when no prefetch is asked (`prefetch=0`)."""

    def __init__(self, groups: Groups, put: Any) -> None:
        self._groups = groups
        self._put = put
        self.checkpointable = groups.checkpointable

    def __enter__(self) -> Direct:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __iter__(self) -> Direct:
        return self

    @staticmethod
    def ready() -> bool:
        return False  # every batch is made when it is asked for

    def __next__(self) -> Any:
        return self._put(next(self._groups))

    def get_state(self) -> Any:
        return self._groups.get_state()


class _InFlight:
    """Blocks on the oldest call once `MAX_IN_FLIGHT` are queued."""

    def __init__(self) -> None:
        self._ticks: collections.deque = collections.deque()

    def add(self, tick: jax.Array) -> None:
        self._ticks.append(tick)
        if len(self._ticks) > MAX_IN_FLIGHT:
            self._ticks.popleft().block_until_ready()

    def drain(self) -> None:
        while self._ticks:
            self._ticks.popleft().block_until_ready()


def _next_batch(feed: Any, in_flight: _InFlight, meter: InputWaitMeter | None) -> Any:
    """The next device batch, timing only what the devices wait for.

    With async dispatch the host often waits for a batch while the devices still run the
    steps already queued; that is not input wait. So when no batch is ready, the queued work
    is waited for first (nothing else could be dispatched anyway), and only the time the
    idle devices then wait for the batch is counted.
    """
    if meter is None or feed.ready():
        return next(feed, None)
    in_flight.drain()
    with meter.waiting():
        return next(feed, None)


def _reset_metrics(model: Model) -> None:
    metrics = jax.tree.map(jnp.zeros_like, model._state["metrics"])
    model._state = {**model._state, "metrics": metrics}


def fetch_logs(model: Model) -> dict[str, float]:
    """The current loss and metric values as Python floats (one device fetch)."""
    fn = model._compiled_fns.get("logs")
    if fn is None:
        graphdef = model.steps.metrics_graphdef

        def compute(metrics: Any) -> list[jax.Array]:
            return [m.result() for m in nnx.merge(graphdef, metrics)]

        fn = model._compiled_fns["logs"] = jax.jit(compute)
    values = jax.device_get(fn(model._state["metrics"]))
    names = [m.name for m in (model.loss_tracker, *model.metrics)]  # Keras's order: loss first
    return {name: float(np.asarray(v)) for name, v in zip(names, values, strict=True)}


def _run_phase(
    model: Model,
    phase: str,
    iterator: Iterator[Any],
    limit: int | None,
    callbacks: CallbackList,
    meter: InputWaitMeter | None,
    on_state: Any = None,
    prefetch: int = 2,
    source: Any = None,
    steps_hint: int | None = None,
) -> tuple[int, bool, Any]:
    """Runs `phase` ('train' or 'test') over up to `limit` batches of `iterator`.

    Returns:
      `(steps run, whether the source ran out, the source's position after the last batch
      run, or None when the source cannot report it)`.
    """
    k = model._execution_k(limit or steps_hint)
    distributor = BatchDistributor(model.strategy)
    groups = Groups(iterator, k, limit)
    runner = execution.Runner(model, phase, k, distributor, source)
    needs_hooks = callbacks.needs_batch_hooks(phase)
    interval = callbacks.batch_logs_interval(phase)
    in_flight = _InFlight()
    steps = 0
    next_fetch = interval or 0
    logs: dict[str, float] = {}
    if prefetch > 0:
        feed = DevicePrefetcher(
            groups, runner.put, host_depth=prefetch, device_depth=prefetch, put_in_thread=True
        )
    else:
        feed = Direct(groups, runner.put)
    with feed:
        while True:
            if steps > 0:
                item = _next_batch(feed, in_flight, meter)
            else:
                item = next(feed, None)
                if meter is not None:
                    # The wait for the first batch is the pipeline's start-up (threads,
                    # workers, the first transfer), not its steady state: the clock starts here.
                    meter.start_epoch()
            if item is None:
                break
            n = runner.batches_in(item)
            if needs_hooks:
                callbacks._call_batch(phase, "begin", steps, None)
            in_flight.add(runner.execute(item))
            steps += n
            if phase == "train":
                model.train_step_count += n
            if meter is not None:
                for _ in range(n):
                    meter.step_done()
            if on_state is not None:
                on_state(steps, feed)
            if needs_hooks:
                if interval is not None and steps >= next_fetch:
                    logs = fetch_logs(model)
                    next_fetch = steps + interval
                callbacks._call_batch(phase, "end", steps - 1, dict(logs))
            if phase == "train" and model.stop_training:
                break
        in_flight.drain()
        position = feed.get_state() if feed.checkpointable else None
    return steps, groups.exhausted, position


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
      steps_per_epoch: batches per epoch; required for an infinite dataset. With a finite
        one, the data iterator then carries over from epoch to epoch and restarts when it
        runs out.
      seed: the shuffle seed for arrays (default: a fresh random seed).
      prefetch: batches made ahead in a thread and put on the devices ahead of use; 0 makes
        each batch in the loop's own thread when it is needed.
      device_data: keep an in-memory phalanx Dataset's arrays on the devices and send only
        row numbers per step: 'auto' (when they fit), True, or False.

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
    data, source = on_devices(
        model, host_data(x, y, sample_weight, batch_size, shuffle, seed), device_data
    )
    steps_known = steps_per_epoch or _length(data)
    if steps_known is None and _is_infinite(data):
        raise ValueError(
            "the dataset repeats forever; pass steps_per_epoch=N so fit knows where an epoch ends"
        )
    val_data = None
    if validation_data is not None:
        val_data = on_devices(
            model,
            _validation_source(validation_data, validation_batch_size or batch_size),
            device_data,
        )
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
    try:
        for epoch in range(start_epoch, epochs):
            model._fit_epoch = epoch
            _reset_metrics(model)
            cbs.on_epoch_begin(epoch)
            t0 = time.perf_counter()
            iterator, limit = _epoch_iterator(model, data, steps_per_epoch, carried)
            steps, exhausted, model._last_data_state = _run_phase(
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
            )
            model._fit_steps_done = 0
            carried = None if (exhausted or steps_per_epoch is None) else iterator
            if carried is None:
                _close(iterator)
            elapsed = time.perf_counter() - t0
            epoch_logs = fetch_logs(model)
            examples = float(steps * _global_batch(model, data))
            epoch_logs["examples_per_second"] = examples / elapsed if elapsed > 0 else 0.0
            epoch_logs["input_wait_fraction"] = meter.epoch_summary()["input_wait_fraction"]
            if val_data is not None and (epoch + 1) % validation_freq == 0:
                val_logs = _evaluate_logs(model, val_data, validation_steps)
                epoch_logs.update({f"val_{k}": v for k, v in val_logs.items()})
            if steps == 0:
                warnings.warn(
                    f"epoch {epoch + 1} ran no step: the data is empty or ran out", stacklevel=3
                )
            cbs.on_epoch_end(epoch, epoch_logs)
            if model.stop_training:
                break
    finally:
        # Whether fit returns, raises or is interrupted, no pipeline thread outlives it.
        _close(iterator)
        _close(carried)
    cbs.on_train_end(epoch_logs)
    return model.history


def _close(iterator: Any) -> None:
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


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


def _length(data: Any) -> int | None:
    try:
        n = len(data)
    except TypeError:
        return None
    return n if n < float("inf") else None


def _is_infinite(data: Any) -> bool:
    cardinality = getattr(data, "cardinality", None)
    if callable(cardinality):
        cardinality = cardinality()
    return cardinality == float("inf")


def _global_batch(model: Model, data: Any) -> int:
    batch = getattr(data, "batch_size", None)
    return int(batch) if isinstance(batch, int) else 0


def _validation_source(validation_data: Any, batch_size: int | None) -> Iterable[Any]:
    if isinstance(validation_data, tuple) and all(
        isinstance(v, np.ndarray | jax.Array) for v in validation_data
    ):
        return as_batches(validation_data, batch_size)
    return as_batches(validation_data, None)


def _evaluate_logs(model: Model, data: tuple, steps: int | None) -> dict[str, float]:
    _reset_metrics(model)
    quiet = CallbackList([], model=model)
    batches, source = data
    iterator = iter(batches)
    try:
        _run_phase(
            model, "test", iterator, steps, quiet, None, source=source, steps_hint=_length(batches)
        )
    finally:
        _close(iterator)
    logs = fetch_logs(model)
    _reset_metrics(model)
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
    data, source = on_devices(
        model, host_data(x, y, sample_weight, batch_size, shuffle=False, seed=None), device_data
    )
    verbose = 1 if verbose == "auto" else verbose
    cbs = CallbackList(callbacks, model=model, steps=steps or _length(data), verbose=verbose)
    _reset_metrics(model)
    cbs.on_test_begin()
    iterator = iter(data)
    try:
        _run_phase(
            model, "test", iterator, steps, cbs, None, source=source, steps_hint=_length(data)
        )
    finally:
        _close(iterator)
    logs = fetch_logs(model)
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
    """The model's outputs for every example, in order, as NumPy (padded rows dropped)."""
    data, source = on_devices(
        model, host_data(x, None, None, batch_size, shuffle=False, seed=None), device_data
    )
    cbs = CallbackList(callbacks, model=model, steps=steps or _length(data))
    distributor = BatchDistributor(model.strategy)
    predict_fn = execution.predict_fn(model)
    outputs: list[Any] = []
    cbs.on_predict_begin()
    iterator = iter(data)
    try:
        for index, host_batch in enumerate(iterator):
            if steps is not None and index >= steps:
                break
            batch, mask = distributor.arrays(host_batch)
            cbs._call_batch("predict", "begin", index, None)
            y_pred = predict_fn(model._state, source, batch)
            keep = _host(mask).astype(bool)
            outputs.append(jax.tree.map(lambda p, keep=keep: _host(p)[keep], y_pred))
            cbs._call_batch("predict", "end", index, None)
    finally:
        _close(iterator)
    cbs.on_predict_end()
    if not outputs:
        raise ValueError("predict got no batch: the data is empty")
    return jax.tree.map(lambda *parts: np.concatenate(parts), *outputs)


def _host(array: jax.Array) -> np.ndarray:
    if array.is_fully_addressable:
        return np.asarray(array)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
