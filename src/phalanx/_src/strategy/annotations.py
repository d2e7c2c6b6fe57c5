"""A model's own sharding annotations, resolved on the strategy's mesh.

Flax NNX parameters carry their layout as axis names: `nnx.with_partitioning(init, (None,
"model"))`, or `kernel_metadata={"out_sharding": ...}`, store `out_sharding=(None, "model")`
on the Variable (stack-facts section 11). A name is either a mesh axis (`data`, `model`) or
a logical name (`"embed"`, `"mlp"`, as MaxText writes them) that
`Strategy(axis_rules=[("mlp", "model"), ("embed", None)])` maps onto one (or onto None:
replicated). An axis the mesh does not have means replicated, so the same annotated model
builds and trains on `Strategy()` (data only), on one device, and with `model_parallel=M`.

Example:
  >>> rules = AxisRules([("mlp", "model")], {"data": 4, "model": 2}, "data")
  >>> rules.spec((None, "mlp"), (16, 64), "kernel")
  PartitionSpec(None, 'model')
  >>> AxisRules([("mlp", "model")], {"data": 8}, "data").spec((None, "mlp"), (16, 64), "kernel")
  PartitionSpec()
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from flax import nnx
from jax.sharding import PartitionSpec as P

from phalanx._src.strategy.mesh import MODEL_AXIS

_METADATA_KEYS = ("out_sharding", "sharding_names", "sharding")


def annotation(leaf: Any) -> tuple | None:
    """The axis names an NNX Variable was annotated with, or None (none, or not a Variable).

    Example:
      >>> init = nnx.with_partitioning(nnx.initializers.ones, (None, "model"))
      >>> with nnx.use_eager_sharding(False):
      ...     layer = nnx.Linear(2, 4, kernel_init=init, rngs=nnx.Rngs(0))
      >>> annotation(layer.kernel)
      (None, 'model')
    """
    if not isinstance(leaf, nnx.Variable):
        return None
    metadata = leaf.get_metadata()
    for key in _METADATA_KEYS:
        names = metadata.get(key)
        if names:
            return tuple(names)
    return None


def check_rules(axis_rules: Any) -> tuple[tuple[str, Any], ...]:
    """`axis_rules` as a tuple of `(logical name, mesh axis | tuple of axes | None)` pairs.

    Raises:
      ValueError: for anything else, e.g. a dict, or a pair whose target is not a name.
    """
    if axis_rules is None:
        return ()
    if isinstance(axis_rules, Mapping | str):
        raise ValueError(
            f"axis_rules must be a list of (logical name, mesh axis) pairs, as Flax's "
            f"logical_axis_rules; got {axis_rules!r}. E.g. axis_rules=[('mlp', 'model'), "
            "('embed', None)]"
        )
    rules = []
    for rule in axis_rules:
        ok = isinstance(rule, tuple | list) and len(rule) == 2 and isinstance(rule[0], str)
        target = rule[1] if ok else None
        ok = ok and (
            target is None
            or isinstance(target, str)
            or (isinstance(target, tuple | list) and all(isinstance(t, str) for t in target))
        )
        if not ok:
            raise ValueError(
                f"axis_rules: {rule!r} is not a (logical name, mesh axis or None) pair; e.g. "
                "('mlp', 'model') splits 'mlp' over the model axis, ('embed', None) replicates"
            )
        rules.append((rule[0], tuple(target) if isinstance(target, list) else target))
    return tuple(rules)


class AxisRules:
    """Resolves annotations to `PartitionSpec`s on a mesh of the given axis sizes.

    Args:
      rules: `(logical name, target)` pairs (`check_rules`).
      sizes: the mesh's axis sizes, e.g. `{"data": 4, "model": 2}`; axes may be
        hypothetical (a benchmark's 8B model on 64 devices).
      data_axis: the name of the data axis.
    """

    def __init__(self, rules: Sequence[tuple[str, Any]], sizes: Mapping[str, int], data_axis: str):
        self.rules = dict(rules)
        self.sizes = dict(sizes)
        self.data_axis = data_axis

    def _targets(self, name: Any, where: str, names: tuple) -> tuple[str, ...]:
        """The mesh axes (present in the mesh) one annotation entry maps to."""
        if name is None:
            return ()
        if isinstance(name, tuple | list):
            return tuple(a for n in name for a in self._targets(n, where, names))
        if name in self.rules:
            target = self.rules[name]
            targets = () if target is None else (target if isinstance(target, tuple) else (target,))
        elif name in (self.data_axis, MODEL_AXIS):
            targets = (name,)
        else:
            raise ValueError(
                f"{where} is annotated {names}, and {name!r} is neither a mesh axis "
                f"({self.data_axis!r}, {MODEL_AXIS!r}) nor mapped by axis_rules. Map it, e.g. "
                f"phalanx.Strategy(axis_rules=[({name!r}, {MODEL_AXIS!r})]) to split it over "
                f"the model axis, or [({name!r}, None)] to replicate it"
            )
        return tuple(t for t in targets if t in self.sizes)

    def spec(self, names: tuple, shape: tuple[int, ...], where: str) -> P:
        """The `PartitionSpec` of an array of `shape` annotated `names`.

        Raises:
          ValueError: a name neither a mesh axis nor mapped by the rules; more names than
            the array has axes; a mesh axis used twice; or an axis whose size the mesh axes
            it is split over do not divide.
        """
        if len(names) > len(shape):
            raise ValueError(
                f"{where} of shape {shape} is annotated {names}: more axis names than the "
                "array has axes"
            )
        entries: list[Any] = []
        used: set[str] = set()
        for dim, name in enumerate(names):
            axes = self._targets(name, where, names)
            if used & set(axes):
                raise ValueError(f"{where} is annotated {names}: a mesh axis is used twice")
            used.update(axes)
            parts = math.prod(self.sizes[a] for a in axes)
            if shape[dim] % parts:
                raise ValueError(
                    f"{where} of shape {shape} is annotated {names}: its axis {dim} of size "
                    f"{shape[dim]} does not split over {' x '.join(axes)} ({parts} devices). "
                    "Choose a model_parallel that divides it, or map that name to None in "
                    "axis_rules to replicate it"
                )
            entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
        while entries and entries[-1] is None:
            entries.pop()
        return P(*entries)

    def flax_rules(self) -> tuple[tuple[str, Any], ...]:
        """The rules Flax applies while a model is built inside `strategy.scope()`: the
        user's, with targets the mesh lacks dropped, and `model` -> None without a model
        axis, so annotated variables are created laid out (or replicated)."""
        out = []
        for name, target in self.rules.items():
            targets = () if target is None else (target if isinstance(target, tuple) else (target,))
            kept = tuple(t for t in targets if t in self.sizes)
            out.append((name, None if not kept else kept[0] if len(kept) == 1 else kept))
        if MODEL_AXIS not in self.sizes and MODEL_AXIS not in self.rules:
            out.append((MODEL_AXIS, None))
        return tuple(out)


_NOT_IN_MESH = re.compile(r"Resource axis: (\S+) of (.+) is not found in mesh")


_INDIVISIBLE = re.compile(
    r"spec=(P\(.*?\)).*implies that array axis (\d+) is partitioned (\d+) times, but the "
    r"dimension size is (\d+) \(full shape: (\(.*?\))"
)


def translated(error: ValueError, rules: AxisRules) -> ValueError | None:
    """A clear error for JAX's 'Resource axis ... is not found in mesh' (a variable
    annotated with an unmapped name) or '... should evenly divide the shape' (an axis the
    mesh does not divide), raised when such a variable is built inside `strategy.scope()`;
    None for any other error."""
    uneven = _INDIVISIBLE.search(str(error))
    if uneven is not None:
        spec, axis, parts, size, shape = uneven.groups()
        return ValueError(
            f"a variable of shape {shape} built inside strategy.scope() is laid out {spec}: "
            f"its axis {axis} of size {size} does not split over {parts} devices. Choose a "
            "model_parallel that divides it, or annotate that axis None (or map its name to "
            "None in axis_rules) to replicate it"
        )
    match = _NOT_IN_MESH.search(str(error))
    if match is None:
        return None
    name, spec = match.group(1), match.group(2)
    return ValueError(
        f"a variable built inside strategy.scope() is annotated {spec}, and {name!r} is "
        f"neither a mesh axis ({', '.join(map(repr, rules.sizes))}) nor mapped by "
        f"axis_rules. Map it, e.g. phalanx.Strategy(axis_rules=[({name!r}, "
        f"{MODEL_AXIS!r})]) to split it over the model axis, or [({name!r}, None)] to "
        "replicate it"
    )
