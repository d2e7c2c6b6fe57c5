"""Keras's multi-output compile API: one loss per output, `loss_weights`, per-output metrics.

A model whose outputs are a dict (or a tuple / list) is compiled with a dict (or list) of
losses. The total loss per example is `sum_i loss_weights[i] * loss_i(y_i, y_pred_i)`, which
the training step reduces over the batch as it does a single loss. As in Keras 3:

- with more than one loss, the logs hold each output's *unweighted* loss as
  `{output}_loss`, beside the total `loss`;
- metrics given per output (`{output: [metrics]}` or a list with one entry per output) are
  logged as `{output}_{metric}`, e.g. `'digit_accuracy'`;
- an output whose loss is None is not trained (its metrics still work).

Outputs are named by their dict keys. A tuple / list output has no names of its own: its
outputs are `output_1`, `output_2`, ... (tf.keras's names for a subclassed model's outputs),
or the names given as `compile(output_names=[...])`. Labels `y` may be a dict keyed by those
names or a tuple / list in output order.

Example:
  >>> model.compile(
  ...     optimizer="adam",
  ...     loss={"digit": "sparse_categorical_crossentropy", "size": "mse"},
  ...     loss_weights={"digit": 1.0, "size": 0.5},
  ...     metrics={"digit": ["accuracy"]},
  ... )
  >>> model.fit(x, {"digit": y_digit, "size": y_size})   # logs: loss, digit_loss,
  ...                                                     # size_loss, digit_accuracy
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from phalanx._src.train.api import losses as losses_lib
from phalanx._src.train.api.metrics.base import Metric
from phalanx._src.train.api.metrics.mean import Mean


def is_multi(loss: Any) -> bool:
    """Whether `loss` is a per-output configuration (a dict, list or tuple of losses)."""
    return isinstance(loss, Mapping | list | tuple)


def _pick(values: Any, key: str, index: int, what: str, names: Sequence[str]) -> Any:
    """The entry of one output in `values` (a dict by name, or a sequence by position)."""
    if isinstance(values, Mapping):
        if key not in values:
            raise ValueError(
                f"{what} is a dict with keys {sorted(values)} but has no entry {key!r}; give "
                f"one entry per output named {list(names)}"
            )
        return values[key]
    if isinstance(values, list | tuple) and not hasattr(values, "_fields"):
        if index >= len(values):
            raise ValueError(
                f"{what} has {len(values)} entries but the model has outputs {list(names)}; "
                "give one entry per output, in order, or a dict keyed by output name"
            )
        return values[index]
    raise ValueError(
        f"{what} is a single {type(values).__name__}, but the loss is configured per output "
        f"{list(names)}; give a dict keyed by output name or a tuple in output order"
    )


class MultiOutputLoss(losses_lib.Loss):
    """The weighted sum over outputs of each output's per-example loss.

    Args:
      losses: a dict `{output: loss}` or a sequence with one loss per output; a loss is
        anything `phalanx.losses.get` accepts, or None for an output with no loss.
      loss_weights: None (all 1.0), a dict `{output: weight}` (missing outputs: 1.0) or a
        sequence with one float per output.
      output_names: names of a tuple / list output, in order (default `output_1`, ...);
        for a dict loss over a tuple output they give each name its position.

    Raises:
      ValueError: weights that do not match the losses, or no loss at all.

    Example:
      >>> loss = MultiOutputLoss({"a": "mse", "b": "mae"}, {"a": 1.0, "b": 0.5})
      >>> loss({"a": ya, "b": yb}, {"a": pa, "b": pb}).shape   # (batch,)
    """

    def __init__(
        self,
        losses: Mapping[str, Any] | Sequence[Any],
        loss_weights: Mapping[str, float] | Sequence[float] | None = None,
        output_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__("loss")
        if isinstance(losses, Mapping):
            names = list(output_names) if output_names else [str(k) for k in losses]
            unknown = [k for k in losses if k not in names]
            if unknown:
                raise ValueError(
                    f"loss keys {unknown} are not outputs of the model {names}; use the "
                    "output dict's keys (or the names given as output_names=)"
                )
            configured = [losses.get(n) for n in names]
        else:
            count = len(losses)
            names = (
                list(output_names) if output_names else [f"output_{i + 1}" for i in range(count)]
            )
            if len(names) != count:
                raise ValueError(
                    f"{count} losses for {len(names)} output names {names}; give one loss per "
                    "output (None for an output without a loss)"
                )
            configured = list(losses)
        self.output_names = names
        weights = _weights(loss_weights, names)
        self.entries = [
            (i, name, losses_lib.get(loss), weights[i])
            for i, (name, loss) in enumerate(zip(names, configured, strict=True))
            if loss is not None
        ]
        if not self.entries:
            raise ValueError(f"every output's loss is None in {losses!r}; give at least one loss")

    def output_loss(self, index: int, name: str, y_true: Any, y_pred: Any) -> Any:
        """Output `name`'s `(y_true, y_pred)` picked from the full structures."""
        labels = _pick(y_true, name, index, "y (the labels)", self.output_names)
        preds = _pick(y_pred, name, index, "the model's output", self.output_names)
        return labels, preds

    def __call__(self, y_true: Any, y_pred: Any) -> jax.Array:
        total = None
        for index, name, loss, weight in self.entries:
            value = loss(*self.output_loss(index, name, y_true, y_pred)) * jnp.float32(weight)
            total = value if total is None else total + value
        return total

    def trackers(self) -> list[OutputLoss]:
        """Keras's `{output}_loss` trackers: one per loss when there are several, else none."""
        if len(self.entries) < 2:
            return []
        return [OutputLoss(self, index, name, loss) for index, name, loss, _ in self.entries]

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}: {loss.name} x {w}" for _, n, loss, w in self.entries)
        return f"MultiOutputLoss({parts})"


def _weights(loss_weights: Any, names: list[str]) -> list[float]:
    if loss_weights is None:
        return [1.0] * len(names)
    if isinstance(loss_weights, Mapping):
        unknown = [k for k in loss_weights if k not in names]
        if unknown:
            raise ValueError(
                f"loss_weights keys {unknown} are not outputs of the model {names}; e.g. "
                f"loss_weights={{{names[0]!r}: 1.0}}"
            )
        return [float(loss_weights.get(n, 1.0)) for n in names]
    if isinstance(loss_weights, list | tuple):
        if len(loss_weights) != len(names):
            raise ValueError(
                f"loss_weights has {len(loss_weights)} entries for {len(names)} outputs "
                f"{names}; give one float per output"
            )
        return [float(w) for w in loss_weights]
    if isinstance(loss_weights, int | float) and not isinstance(loss_weights, bool):
        return [float(loss_weights)] * len(names)
    raise TypeError(
        f"loss_weights must be a dict, a list or a float; got {loss_weights!r} of type "
        f"{type(loss_weights).__name__}"
    )


class OutputLoss(Mean):
    """Keras's `{output}_loss` log: the mean over real examples of one output's unweighted
    loss times `sample_weight`, exactly as the `loss` tracker averages the total.

    The training step calls `update_with_mask` (it needs the padding mask apart from the
    sample weights, which a metric's `update_state` does not get).
    """

    def __init__(self, parent: MultiOutputLoss, index: int, name: str, loss: Any) -> None:
        super().__init__(name=f"{name}_loss")
        self._select = (parent, index, name)
        self.loss = loss

    def update_with_mask(self, y_true: Any, y_pred: Any, sw: Any, mask: Any) -> None:
        parent, index, name = self._select
        per_example = self.loss(*parent.output_loss(index, name, y_true, y_pred))
        Mean.update_state(self, per_example * sw, mask)


class OutputMetric(Metric):
    """A metric applied to one output of a multi-output model, logged as `{output}_{name}`.

    Args:
      metric: the metric (updated with that output's labels and predictions).
      output: the output's name.
      index: its position (for tuple outputs and labels).
      names: all output names, in order.
    """

    def __init__(self, metric: Metric, output: str, index: int, names: Sequence[str]) -> None:
        super().__init__(name=f"{output}_{metric.name}")
        self.metric = metric
        self.direction = metric.direction
        self._where = (output, index, tuple(names))

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        output, index, names = self._where
        self.metric.update_state(
            _pick(y_true, output, index, "y (the labels)", names),
            _pick(y_pred, output, index, "the model's output", names),
            sample_weight=sample_weight,
        )

    def result(self) -> jax.Array:
        return self.metric.result()


def per_output_metrics(metrics: Any, loss: MultiOutputLoss, get_metric: Any) -> list[Metric]:
    """Keras 3's per-output metric configuration as `OutputMetric`s.

    Args:
      metrics: a dict `{output: metric or [metrics]}`, or a list with one entry (a metric,
        a list of metrics, or None) per output.
      loss: the multi-output loss (output names, and each output's loss for 'accuracy').
      get_metric: `metrics.registry.get`.

    Raises:
      ValueError: for a configuration that does not name the outputs.
    """
    names = loss.output_names
    if isinstance(metrics, Mapping):
        unknown = [k for k in metrics if k not in names]
        if unknown:
            raise ValueError(
                f"metrics keys {unknown} are not outputs of the model {names}; e.g. "
                f"metrics={{{names[0]!r}: ['accuracy']}}"
            )
        per_output = [metrics.get(n) for n in names]
    elif len(metrics) == len(names):
        per_output = list(metrics)
    else:
        raise ValueError(
            f"a model with outputs {names} needs metrics per output: a dict such as "
            f"{{{names[0]!r}: ['accuracy']}} or a list with one entry per output; got "
            f"{metrics!r}"
        )
    losses_by_name = {n: loss_fn for _, n, loss_fn, _ in loss.entries}
    out: list[Metric] = []
    for index, (name, entry) in enumerate(zip(names, per_output, strict=True)):
        if entry is None:
            continue
        for m in entry if isinstance(entry, list | tuple) else [entry]:
            metric = get_metric(m, loss=losses_by_name.get(name))
            out.append(OutputMetric(metric, name, index, names))
    return out


def resolve(
    loss: Any,
    metrics: Any,
    loss_weights: Any,
    output_names: Sequence[str] | None,
    get_metric: Any,
) -> tuple[losses_lib.Loss, list[Metric]]:
    """`compile`'s loss / metrics / loss_weights as the step's loss and the logged metrics.

    Returns:
      `(loss, metrics)`: the per-example loss the step calls, and the metrics after the loss
      tracker in log order (Keras's: per-output losses, then the compiled metrics).
    """
    if not is_multi(loss):
        base = losses_lib.get(loss)
        if is_multi(metrics) and isinstance(metrics, Mapping):
            raise ValueError(
                f"metrics is a dict {sorted(metrics)} but the loss is a single loss; give the "
                "loss per output too, e.g. loss={'a': 'mse', 'b': 'mae'}"
            )
        if loss_weights is not None:
            if isinstance(loss_weights, bool) or not isinstance(loss_weights, int | float):
                raise ValueError(
                    f"loss_weights={loss_weights!r} needs a loss per output; with one loss "
                    "give a float, or give loss as a dict / list with one loss per output"
                )
            return _scaled(base, float(loss_weights)), [
                get_metric(m, loss=base) for m in (metrics or [])
            ]
        return base, [get_metric(m, loss=base) for m in (metrics or [])]
    combined = MultiOutputLoss(loss, loss_weights, output_names)
    out: list[Metric] = list(combined.trackers())
    if metrics:
        out += per_output_metrics(metrics, combined, get_metric)
    return combined, out


def _scaled(base: losses_lib.Loss, weight: float) -> losses_lib.Loss:
    scaled = losses_lib.FunctionLoss(lambda y, p: base(y, p) * jnp.float32(weight), base.name)
    scaled.base = base  # what it scales, for the label checks (checks.py)
    return scaled
