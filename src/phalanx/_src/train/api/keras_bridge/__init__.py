"""Keras 3 optimizers, losses and metrics as phalanx's optax / Loss / Metric objects.

Nothing here imports keras unless a Keras object was already created (keras is in
`sys.modules`): an optional dependency costs nothing to users who do not pass one.

Keras objects are recognised everywhere. Names only Keras knows ('nadam', 'huber', ...)
resolve only while a Keras model is compiled (`keras_names()`), so what a name means never
depends on whether some other code happened to import keras.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator
from typing import Any

_KERAS_NAMES: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "phalanx_keras_names", default=False
)


@contextlib.contextmanager
def keras_names(enabled: bool = True) -> Iterator[None]:
    """Within the block, names phalanx does not know are looked up in Keras."""
    token = _KERAS_NAMES.set(enabled)
    try:
        yield
    finally:
        _KERAS_NAMES.reset(token)


def is_keras_object(obj: Any, base: str) -> bool:
    """Whether `obj` is an instance of `keras.<base>` (e.g. 'Model', 'optimizers.Optimizer'),
    without importing keras when none was imported."""
    if "keras" not in sys.modules:
        return False
    target: Any = sys.modules["keras"]
    for part in base.split("."):
        target = getattr(target, part, None)
        if target is None:
            return False
    return isinstance(target, type) and isinstance(obj, target)


def keras_by_name(kind: str, name: str) -> Any | None:
    """Keras's object for a string phalanx does not know (`kind`: 'optimizers', 'losses' or
    'metrics'), while a Keras model is compiled (`keras_names()`); None otherwise. Keras
    names some losses by their per-example function (e.g. 'huber'): that function is
    returned."""
    keras = sys.modules.get("keras")
    if keras is None or not _KERAS_NAMES.get():
        return None
    module = getattr(keras, kind)
    try:
        found = module.get(name)
    except (ValueError, TypeError):
        return None
    if kind == "metrics" and not isinstance(found, keras.metrics.Metric) and callable(found):
        return keras.metrics.MeanMetricWrapper(found, name=name)
    return found
