"""`evaluate`, and fit's validation: the test phase over every example, counted once.

Example:
  >>> evaluate(model, x_test, y_test, batch_size=1024, return_dict=True)
  {'loss': 0.08, 'accuracy': 0.975}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from phalanx._src.data.adapters import as_batches
from phalanx._src.train.api import fit_options
from phalanx._src.train.api.callbacks.callback_list import CallbackList
from phalanx._src.train.engine import checks
from phalanx._src.train.feeding import reuse, sources
from phalanx._src.train.loops.phase import run_phase

if TYPE_CHECKING:
    from phalanx._src.train.engine.engine import Engine


def validation_source(validation_data: Any, batch_size: int | None) -> Iterable[Any]:
    """Fit's `validation_data` as host batches (arrays batched by `batch_size`)."""
    if isinstance(validation_data, tuple) and all(
        isinstance(v, np.ndarray | jax.Array) for v in validation_data
    ):
        return as_batches(validation_data, batch_size)
    return as_batches(validation_data, None)


def validation_logs(engine: Engine, data: tuple, steps: int | None) -> dict[str, float]:
    """Fit's validation: the logs over `data` (`(batches, source, checked)`: `on_devices`'s
    pair and whether `checks.check_data` saw all of it), with no callback; the metric sums
    are zero again after."""
    engine.reset_metrics()
    quiet = CallbackList([])
    batches, source, checked = data
    iterator = checks.watch(engine, iter(batches), source, checked, "validation")
    try:
        ran = run_phase(
            engine,
            "test",
            iterator,
            steps,
            quiet,
            None,
            source=source,
            steps_hint=sources.length(batches),
        ).steps
    finally:
        sources.close(iterator)
    _some_steps(ran, "validation")
    logs = engine.fetch_logs()
    engine.reset_metrics()
    return logs


def evaluate(
    model: Any,
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
    """The loss and metrics of `model` (a compiled `phalanx.Model`) over every example of the
    data, each counted once.

    Padded rows of a last partial batch never count, so the numbers are the one-device
    numbers on any replica count.

    Returns:
      `return_dict=True`: `{name: value}`. Otherwise, as Keras: the loss alone when there is
      no metric, else `[loss, *metrics]`.

    Raises:
      ValueError: before anything compiles, for data without labels (the loss needs them),
        `steps` < 1, or features and labels the model cannot take (`checks`); data that
        yields no batch.
    """
    engine = model.engine
    steps = fit_options.step_count(steps, "steps")
    host = sources.host_data(x, y, sample_weight, batch_size, shuffle=False, seed=None)
    # Shapes and labels, before anything compiles.
    checked = checks.check_data(engine, host, "evaluate")
    data, source = sources.on_devices(engine.strategy, host, device_data)
    source, _ = reuse.kept(engine, source)  # the last call's placement, when safe
    verbose = 1 if verbose == "auto" else verbose
    length = sources.length(data)
    cbs = CallbackList(callbacks, model=model, steps=steps or length, verbose=verbose)
    engine.reset_metrics()
    cbs.on_test_begin()
    iterator = checks.watch(engine, iter(data), source, checked, "evaluate")
    try:
        ran = run_phase(
            engine, "test", iterator, steps, cbs, None, source=source, steps_hint=length
        ).steps
    finally:
        sources.close(iterator)
    _some_steps(ran, "evaluate")
    logs = engine.fetch_logs()
    cbs.on_test_end(logs)
    if return_dict:
        return logs
    values = list(logs.values())
    return values[0] if len(values) == 1 else values


def _some_steps(steps: int, phase: str) -> None:
    """Refuses a phase that read no batch: its metrics would be 0, not a measurement."""
    if steps == 0:
        raise ValueError(
            f"{phase} got no batch: the data is empty (e.g. a filter that keeps nothing, or "
            "batch(n, drop_remainder=True) of fewer than n elements)"
        )
