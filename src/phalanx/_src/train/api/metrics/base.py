"""The metric base class: Keras's API over a Flax NNX object whose state is a pytree of sums.

Why sums: a metric's state (totals, counts, confusion-matrix cells) is only ever added to, so
two states merge by elementwise addition. That reduction is associative and commutative, so
the state accumulated on N replicas, summed across them, equals the state one device would
have accumulated over the same examples (like `clu.metrics`). `strategy.run` relies on it: it
sums every replica's increments to `nnx.metrics.MetricState` variables.

Padded rows never count. The training step passes `sample_weight = weight * mask` (mask 0.0 for
padding); inside `strategy.run` a metric also multiplies in the replica's own validity mask
(`replica_context.current_example_mask`), so a user's per-replica step gets exact numbers
without passing a mask.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

MetricState = nnx.metrics.MetricState


def replica_mask(batch_size: int) -> jax.Array | None:
    """The running replica's float32 row mask for a batch of `batch_size` rows, or None."""
    try:
        from phalanx._src.strategy.replica_context import current_example_mask
    except ImportError:  # the strategy layer is optional for plain-JAX use of metrics
        return None
    return current_example_mask(batch_size)


def example_weights(sample_weight: Any, batch_size: int | None) -> jax.Array | None:
    """`sample_weight` (or None) combined with the replica mask for `batch_size` rows.

    Returns a float32 array whose leading axis is the batch (or a scalar), or None when there
    is neither a weight nor a mask.
    """
    weight = None if sample_weight is None else jnp.asarray(sample_weight, jnp.float32)
    mask = None if batch_size is None else replica_mask(batch_size)
    if mask is None:
        return weight
    if weight is None or weight.ndim == 0:
        return mask if weight is None else weight * mask
    return weight * mask.reshape((-1,) + (1,) * (weight.ndim - 1))


def weighted_sums(values: jax.Array, sample_weight: Any = None) -> tuple[jax.Array, jax.Array]:
    """Keras's sample-weighted sum of `values` and the matching sum of weights.

    `values` has the batch first. Axes the weight does not cover are averaged first; weights
    of shape (batch, 1) against values (batch,) are squeezed, and a scalar weight broadcasts,
    as in `keras.metrics.Mean`. Weight 0 (padding) removes a row from both sums.

    Returns:
      `(total, count)`, two float32 scalars.
    """
    values = jnp.asarray(values, jnp.float32)
    weight = example_weights(sample_weight, values.shape[0] if values.ndim else None)
    if weight is None:
        per_example = _mean_trailing(values)
        return jnp.sum(per_example), jnp.asarray(per_example.size, jnp.float32)
    if weight.ndim == values.ndim + 1 and weight.shape[-1] == 1:
        weight = jnp.squeeze(weight, -1)
    elif values.ndim == weight.ndim + 1 and values.shape[-1] == 1:
        values = jnp.squeeze(values, -1)
    if weight.ndim and values.ndim > weight.ndim:
        values = jnp.mean(values, axis=tuple(range(weight.ndim, values.ndim)))
    weight = jnp.broadcast_to(weight, values.shape)
    # `where`, not a product: a padded row may hold inf/NaN garbage, and 0 * NaN is NaN.
    weighted = jnp.where(weight != 0, values * weight, 0.0)
    return jnp.sum(_mean_trailing(weighted)), jnp.sum(_mean_trailing(weight))


def _mean_trailing(x: jax.Array) -> jax.Array:
    return jnp.mean(x, axis=tuple(range(1, x.ndim))) if x.ndim > 1 else x


def merge_states(*states: Any) -> Any:
    """Elementwise sum of metric states (the cross-replica / cross-shard merge).

    Works on anything with matching structure: `nnx.state(metric)`, a dict of them, or the
    raw arrays. Since every metric state is a sum, `merge_states(state(A), state(B))` is the
    state of one metric updated with A then B.

    Example:
      >>> _, s1 = nnx.split(m1); _, s2 = nnx.split(m2)
      >>> nnx.update(m1, merge_states(s1, s2))   # m1 now covers both halves
    """
    if not states:
        raise ValueError("merge_states needs at least one state, got none")
    return jax.tree.map(lambda *xs: sum(xs[1:], xs[0]), *states)


class Metric(nnx.metrics.Metric):
    """Base class for phalanx metrics: Keras's API, NNX state, additive merge.

    Subclasses create their state as `MetricState` float32 arrays of sums (zero when empty)
    in `__init__` and implement `update_state` and `result`. `reset_state` zeroes every
    `MetricState`. Keras's and TF's other names work too: `reset_states()`, and calling the
    metric, `m(y_true, y_pred)`, which updates it and returns the result. The object works
    eagerly and inside `jax.jit` through `nnx.split` / `nnx.merge`; `update_state` changes
    the state in place.

    Attributes:
      name: the key under which the metric appears in logs.
      direction: 'up' when larger is better, 'down' otherwise (EarlyStopping's mode='auto').
      dtype: the `dtype=` given, as Keras accepts it (a float dtype). The sums are kept, and
        results returned, in float32 whatever it says: a bfloat16 sum of many batches would
        lose counts.

    Example:
      >>> m = phalanx.metrics.SparseCategoricalAccuracy()
      >>> graphdef, state = nnx.split(m)
      >>> @jax.jit
      ... def step(state, y, logits, weight):
      ...     m = nnx.merge(graphdef, state)
      ...     m.update_state(y, logits, sample_weight=weight)
      ...     return nnx.state(m)
      >>> nnx.update(m, step(state, y, logits, weight)); float(m.result())
    """

    direction: ClassVar[str] = "up"

    def __init__(self, name: str | None = None, dtype: Any = None) -> None:
        self.name = name or _snake(type(self).__name__)
        self.dtype = _float_dtype(dtype, self.name)

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        raise NotImplementedError

    def result(self) -> jax.Array:
        raise NotImplementedError

    def reset_state(self) -> None:
        """Zeroes every accumulator (in place)."""
        state = nnx.state(self, MetricState)
        nnx.update(self, jax.tree.map(jnp.zeros_like, state))

    def reset_states(self) -> None:
        """Zeroes every accumulator: TF 2 / Keras 2's name for `reset_state`."""
        self.reset_state()

    def __call__(self, *args: Any, **kwargs: Any) -> jax.Array:
        """Updates the metric with the arguments of `update_state` and returns `result()`,
        as calling a Keras metric does.

        Example:
          >>> m = phalanx.metrics.SparseCategoricalAccuracy()
          >>> float(m(jnp.array([1, 0]), jnp.array([[0.1, 0.9], [0.2, 0.8]])))
          0.5
        """
        self.update_state(*args, **kwargs)
        return self.result()

    def merge(self, other: Metric) -> None:
        """Adds `other`'s accumulators into this metric (in place); see `merge_states`."""
        if type(other) is not type(self):
            raise TypeError(
                f"cannot merge {type(other).__name__} into {type(self).__name__}; merge "
                "metrics of the same class and configuration"
            )
        mine, theirs = nnx.state(self, MetricState), nnx.state(other, MetricState)
        nnx.update(self, merge_states(mine, theirs))

    # flax.nnx.metrics.Metric's names, so nnx tooling (MultiMetric) can drive these too.
    def reset(self) -> None:
        self.reset_state()

    def update(self, y_true: Any = None, y_pred: Any = None, sample_weight: Any = None, **_):  # type: ignore[override]
        self.update_state(y_true, y_pred, sample_weight=sample_weight)

    def compute(self) -> jax.Array:
        return self.result()


def _float_dtype(dtype: Any, name: str) -> Any:
    """`dtype` as a NumPy dtype when it is a float one (default float32), else ValueError."""
    if dtype is None:
        return jnp.dtype(jnp.float32)
    try:
        resolved = jnp.dtype(getattr(dtype, "as_numpy_dtype", dtype))
    except TypeError:
        resolved = None
    if resolved is None or not jnp.issubdtype(resolved, jnp.floating):
        raise ValueError(
            f"metric {name!r} got dtype={dtype!r}; a metric's dtype must be a float dtype "
            "(its values are averages), e.g. dtype='float32' (phalanx sums in float32 anyway)"
        )
    return resolved


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")


def zeros(shape: tuple[int, ...] = ()) -> MetricState:
    """A float32 accumulator initialised to zero."""
    return MetricState(jnp.zeros(shape, jnp.float32))


def safe_divide(a: jax.Array, b: jax.Array) -> jax.Array:
    """a / b, and 0 where b == 0 (Keras's `divide_no_nan`)."""
    safe = jnp.where(b == 0, 1.0, b)
    return jnp.where(b == 0, 0.0, a / safe)
