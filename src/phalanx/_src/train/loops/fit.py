"""`fit`: Keras's arguments, then the epoch loop over `phase.run_phase`.

Example:
  >>> history = fit(model, x_train, y_train, batch_size=1024, epochs=5)
  >>> history.history["loss"]
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from phalanx._src.data.autotune import Tuner
from phalanx._src.data.executors import AUTOTUNE
from phalanx._src.data.wait import InputWaitMeter
from phalanx._src.train.api import fit_options
from phalanx._src.train.api.callbacks.callback_list import CallbackList
from phalanx._src.train.checkpoint import preemption
from phalanx._src.train.engine import checks, flop_rate
from phalanx._src.train.engine.transfers import Counts
from phalanx._src.train.feeding import reuse, sources
from phalanx._src.train.feeding.blocks import Blocks
from phalanx._src.train.feeding.feeders import Carry
from phalanx._src.train.loops.evaluate import validation_logs, validation_source
from phalanx._src.train.loops.phase import InFlight, run_phase

_AUTOTUNE_DEPTH = 2  # batches ahead when AUTOTUNE picks the thread

if TYPE_CHECKING:
    from phalanx._src.train.engine.engine import Engine


def fit(
    model: Any,
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
    """Trains `model` (a compiled `phalanx.Model`) for `epochs` epochs, as `keras.Model.fit`.

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
      seed: the shuffle seed for arrays (default: drawn from NumPy's global generator, so
        `keras.utils.set_random_seed` or `np.random.seed` makes the order reproducible;
        with several processes, process 0's draw).
      prefetch: batches made ahead in a thread and put on the devices ahead of use; 0 makes
        each batch in the loop's own thread when it is needed; `phalanx.data.AUTOTUNE`
        measures over the first batches which of the two feeds the loop faster (a
        Python-bound pipeline competes with the loop for the GIL) and keeps it for the
        whole call. Device-resident data
        (`device_data`) needs no thread: its row numbers go over ~128 steps at a time.
      device_data: keep an in-memory phalanx Dataset's arrays on the devices and send only
        row numbers: 'auto' (when they fit), True, or False.

    Returns:
      The `History` callback (`history.history` maps each log name to per-epoch values).
      Besides the loss and metrics, each epoch logs `examples_per_second`,
      `input_wait_fraction`, and what crossed between host and devices for it (the
      ledger, `engine/transfers.py`): `host_to_device_mib` and `host_to_device_arrays`
      (the data, masks and row numbers placed, counting every device's copy),
      `device_to_host_mib` and `device_to_host_arrays` (logs and metrics read back).
      With device-resident data the first epoch places the data and the later ones
      next to nothing.

    Raises:
      ValueError: for bad arguments or data, before anything is compiled: data without
        labels, a step count or `validation_freq` below 1, shapes or labels the model
        cannot take (`engine.checks`).
    """
    _check_arguments(epochs, prefetch, initial_epoch, validation_freq)
    steps_per_epoch = fit_options.step_count(steps_per_epoch, "steps_per_epoch")
    validation_steps = fit_options.step_count(validation_steps, "validation_steps")
    engine = model.engine
    if validation_split:
        (x, y, sample_weight), held_out = fit_options.validation_split(
            x, y, sample_weight, validation_split
        )
        if validation_data is None:  # as in Keras, validation_data wins
            validation_data = tuple(v for v in held_out if v is not None)
    if class_weight is not None:
        sample_weight = fit_options.class_weights(y, class_weight, sample_weight)
    host = sources.host_data(x, y, sample_weight, batch_size, shuffle, seed)
    # Shapes and labels, before anything compiles.
    checked = checks.check_data(engine, host, "fit")
    data, source = sources.on_devices(engine.strategy, host, device_data)
    source, blocks = reuse.kept(engine, source)  # the last call's placement, when safe
    steps_known = steps_per_epoch or sources.length(data)
    if steps_known is None and _is_infinite(data):
        raise ValueError(
            "the dataset repeats forever; pass steps_per_epoch=N so fit knows where an epoch ends"
        )
    val_data = None
    if validation_data is not None:
        val_source = validation_source(validation_data, validation_batch_size or batch_size)
        # In-memory validation arrays, before epoch 1; other datasets batch by batch.
        val_checked = checks.check_data(engine, val_source, "validation")
        val_data = (*sources.on_devices(engine.strategy, val_source, device_data), val_checked)
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
    engine.stop_training = False
    engine.position.start(initial_epoch)
    validation = (val_data, validation_freq, validation_steps)
    run = _Epochs(engine, cbs, data, source, steps_per_epoch, steps_known, epochs, prefetch, blocks)
    run.validation = validation  # (data or None, every N epochs, steps)
    cbs.on_train_begin()
    epoch_logs = run.all(checked)
    cbs.on_train_end(epoch_logs)
    return model.history


def _check_arguments(epochs: Any, prefetch: Any, initial_epoch: Any, validation_freq: Any) -> None:
    if not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be an int >= 0, got {epochs!r}")
    freq = validation_freq
    if isinstance(freq, bool) or not isinstance(freq, int) or freq < 1:
        raise ValueError(
            f"validation_freq must be an int >= 1 (validate every N epochs), got "
            f"{validation_freq!r}; e.g. validation_freq=1"
        )
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < AUTOTUNE:
        raise ValueError(
            "prefetch must be an int >= 0 (0: no prefetch thread) or phalanx.data.AUTOTUNE, "
            f"got {prefetch!r}"
        )
    if not 0 <= initial_epoch <= max(epochs, 0):
        raise ValueError(f"initial_epoch {initial_epoch} must be in [0, epochs={epochs}]")


class _Epochs:
    """Fit's epochs over prepared data: the epoch loop, and what it carries between epochs
    (the data iterator, the next epoch's first inputs, an epoch end still to run)."""

    def __init__(
        self,
        engine: Engine,
        cbs: CallbackList,
        data: Iterable[Any],
        source: Any,
        steps_per_epoch: int | None,
        steps_known: int | None,
        epochs: int,
        prefetch: int,
        blocks: Blocks | None = None,
    ) -> None:
        self.engine = engine
        self.cbs = cbs
        self.data = data
        self.source = source
        self.blocks = blocks  # `source`'s in-order batches (`reuse.kept`)
        self.steps_per_epoch = steps_per_epoch
        self.steps_known = steps_known
        self.epochs = epochs
        # AUTOTUNE: the thread (2 ahead) or the loop's own thread, decided once per call.
        self.tuner = Tuner(max_level=1) if prefetch == AUTOTUNE else None
        self.prefetch = _AUTOTUNE_DEPTH if prefetch == AUTOTUNE else prefetch
        self.validation: tuple[Any, int, int | None] = (None, 1, None)
        self.meter = InputWaitMeter()
        self.in_flight = InFlight()  # across epochs: the next one's calls queue behind
        self.carried: Iterator[Any] | None = None  # an iterator read on by the next epoch
        self.carry: Carry | None = None  # the next epoch's first inputs, made by this one
        self.finished: float | None = None  # when the last epoch's work was seen done

    def all(self, checked: bool) -> dict[str, float]:
        """Runs the epochs from `engine.position.epoch` (BackupAndRestore may have moved it
        in `on_train_begin`); returns the last epoch's logs."""
        engine, cbs = self.engine, self.cbs
        epoch_logs: dict[str, float] = {}
        # An epoch's end (its logs, `on_epoch_end`) and the next one's `on_epoch_begin` run
        # once the next epoch's first call is dispatched, when every callback with an epoch
        # hook is async-safe and nothing else happens in between (validation, a stop).
        overlap = cbs.epoch_hooks_deferred()
        deferred: Callable[[], dict[str, float]] | None = None
        iterator: Iterator[Any] | None = None
        # SIGTERM: every process backs up at one agreed step and exits 143 (preemption.py).
        watch = preemption.PreemptionWatch(engine, cbs).start()
        try:
            for epoch in range(engine.position.epoch, self.epochs):
                engine.position.epoch = epoch
                window = engine.transfers.begin()  # the epoch's ledger window
                engine.reset_metrics()
                begin = functools.partial(cbs.on_epoch_begin, epoch)
                if deferred is None:
                    begin()
                else:
                    begin = _then(deferred, begin)
                iterator, end = self.one(
                    epoch, checked, None if deferred is None else begin, window
                )
                last = epoch + 1 == self.epochs
                if (
                    overlap
                    and not last
                    and end.steps
                    and not (end.validates or engine.stop_training)
                ):
                    deferred = end  # the logs of an epoch before the last are only the hooks'
                    continue
                deferred = None
                self.in_flight.drain()
                epoch_logs = end()
                if engine.stop_training:
                    break
        finally:
            # Whether fit returns, raises or is interrupted, no pipeline thread outlives it.
            sources.close(iterator)
            sources.close(self.carried)
            watch.stop()
            self.carry = None
            self.in_flight.drain()
            engine.transfers.end()  # evaluate and predict after fit are no epoch's
        return epoch_logs

    def one(
        self,
        epoch: int,
        checked: bool,
        after_first: Callable[[], None] | None,
        window: Counts,
    ) -> tuple[Iterator[Any], _EpochEnd]:
        """Runs epoch `epoch`'s steps; returns its iterator and its end, still to run.
        `after_first`: run once the epoch's first call is dispatched; `window`: the epoch's
        counts in the ledger of transfers."""
        engine = self.engine
        t0 = time.perf_counter()
        iterator, limit = self._iterator()
        iterator = checks.watch(engine, iterator, self.source, checked, "fit")  # if not all
        result = run_phase(
            engine,
            "train",
            iterator,
            limit,
            self.cbs,
            self.meter,
            engine.on_train_steps,
            self.prefetch,
            self.source,
            tuner=self.tuner,
            steps_hint=self.steps_known,
            # A carried iterator's next epoch starts reading before this one ends.
            next_limit=self.steps_per_epoch if epoch + 1 < self.epochs else None,
            blocks=self.blocks,
            after_first=after_first,
            in_flight=self.in_flight,
            ahead=self.carry,
        )
        self.carry = result.carry
        engine.position.data_state = result.position
        if after_first is not None and result.steps == 0:
            after_first()  # no call was dispatched to run it after
        engine.position.steps_done = 0
        exhausted = result.exhausted or self.steps_per_epoch is None
        self.carried = None if exhausted else iterator
        if self.carried is None:
            sources.close(iterator)
        val_data, freq, val_steps = self.validation
        validates = val_data is not None and (epoch + 1) % freq == 0
        end = _EpochEnd(
            self,
            epoch,
            engine.last_logs,  # the last call's logs, before the next reset
            result.steps,
            t0,
            self.meter.epoch_summary()["input_wait_fraction"],
            iterator,
            val_data if validates else None,
            val_steps,
            window,
        )
        return iterator, end

    def _iterator(self) -> tuple[Iterator[Any], int | None]:
        """The epoch's host iterator and step limit, resuming a restored position if any."""
        position = self.engine.position
        resume = position.take_resume()
        if resume is None:
            carried = self.carried
            return (carried if carried is not None else iter(self.data)), self.steps_per_epoch
        iterator = iter(self.data)
        if resume["data"] is not None and getattr(iterator, "checkpointable", False):
            iterator.set_state(resume["data"])
            if resume["epoch_done"] and self.steps_per_epoch is None:
                iterator = iter(self.data)  # the saved position ends an epoch: start the next
        position.steps_done = resume["steps_done"]
        if self.steps_per_epoch is None:
            return iterator, None
        return iterator, self.steps_per_epoch - resume["steps_done"]


class _EpochEnd:
    """An epoch's end, run now or once the next epoch's first call is dispatched: its logs
    (validating if due) after `on_epoch_end` got them.

    The epoch's time ends when its work is done, not when its last call is dispatched: up to
    `MAX_IN_FLIGHT` calls of K steps may still be queued then (with K = 32, most of a short
    epoch). Reading the last call's logs waits for that call, and so for every call before
    it, so the clock stops once they are read; no step waits for the device for it. The
    epoch's clock starts when the host starts it or when the last epoch's work was seen
    done, whichever is later: its first calls queue behind the last epoch's, and the
    devices run them only once those are done.
    """

    def __init__(
        self,
        epochs: _Epochs,
        epoch: int,
        values: Any,
        steps: int,
        started: float,
        wait: float,
        iterator: Iterator[Any],
        val_data: Any,
        validation_steps: int | None,
        window: Counts,
    ) -> None:
        self.epochs = epochs
        self.epoch = epoch
        self.values = values  # the epoch's last call's log values
        self.steps = steps
        self.started = started  # perf_counter() when the epoch began on the host
        self.wait = wait
        self.iterator = iterator
        self.val_data = val_data
        self.validation_steps = validation_steps
        self.window = window  # what crossed for this epoch (its reads below included)

    @property
    def validates(self) -> bool:
        return self.val_data is not None

    def __call__(self) -> dict[str, float]:
        # Run after the next epoch began (deferred), its reads still count for this one.
        with self.epochs.engine.transfers.charging(self.window):
            logs = self._logs()
        logs.update(self.window.logs())
        self.epochs.cbs.on_epoch_end(self.epoch, logs)
        return logs

    def _logs(self) -> dict[str, float]:
        epochs = self.epochs
        engine = epochs.engine
        logs = engine.fetch_logs(self.values)  # waits for the epoch's last call
        finished = time.perf_counter()
        started = self.started if epochs.finished is None else max(self.started, epochs.finished)
        epochs.finished = finished
        elapsed = finished - started
        examples = float(self.steps * _global_batch(epochs.data))
        logs["examples_per_second"] = examples / elapsed if elapsed > 0 else 0.0
        logs["input_wait_fraction"] = self.wait
        logs.update(flop_rate.epoch_logs(engine, self.steps, elapsed))
        if self.val_data is not None:
            val_logs = validation_logs(engine, self.val_data, self.validation_steps)
            logs.update({f"val_{k}": v for k, v in val_logs.items()})
        if self.steps == 0:
            warnings.warn(
                f"epoch {self.epoch + 1} ran no step: the data is empty or ran out", stacklevel=6
            )
        return logs


def _then(first: Callable[[], Any], second: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        first()
        second()

    return both


def _is_infinite(data: Any) -> bool:
    cardinality = getattr(data, "cardinality", None)
    if callable(cardinality):
        cardinality = cardinality()
    return cardinality == float("inf")


def _global_batch(data: Any) -> int:
    batch = getattr(data, "batch_size", None)
    return int(batch) if isinstance(batch, int) else 0
