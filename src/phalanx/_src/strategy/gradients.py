"""`optimizer.update` inside `strategy.run` sums the replicas' gradients, as TF's
`apply_gradients` does in a replica context.

A TF step applies each replica's local gradient with `optimizer.apply_gradients(...)`, and
the optimizer all-reduces (sums) the gradients across replicas first; with the loss scaled by
`compute_average_loss` that sum is the gradient of the global-batch mean. Inside
`strategy.run`, every `nnx.Optimizer` the step uses gets the same behaviour: its `update`
sums gradients that still differ by replica, and leaves alone gradients the step already
reduced (`get_replica_context().all_reduce("sum", grads)`), so none is counted twice.

A Keras 3 optimizer a step reaches gets the same in its `apply` (behind `apply_gradients`
and `stateless_apply`): see keras_state.py.

How it tells them apart: inside `shard_map`, JAX's type of a value records the mesh axes it
still varies over (`jax.typeof(x).manual_axis_type.varying`). A gradient taken with respect
to a replica's parameters varies over the data axis until a collective reduces it.
"""

from __future__ import annotations

from typing import Any

import jax
import optax
from flax import nnx
from jax import lax


def is_varying(x: Any, axis: str) -> bool:
    """True when `x` (inside `shard_map`) may still differ from replica to replica."""
    return axis in jax.typeof(x).manual_axis_type.varying


def sum_unreduced(grads: Any, axis: str, what: str = "optimizer.update") -> Any:
    """`grads` summed over replicas unless the step already reduced them.

    `what` names the call in the error (`optimizer.update`, or a Keras optimizer's
    `optimizer.apply_gradients`).

    Raises:
      ValueError: some gradient leaves were reduced and others were not, so whether the step
        meant to sum them cannot be known; training on one replica's part would be wrong.
    """
    leaves, _ = jax.tree_util.tree_flatten_with_path(grads)
    varying = [is_varying(leaf, axis) for _, leaf in leaves]
    if all(varying):
        return jax.tree.map(lambda g: lax.psum(g, axis), grads)
    if not any(varying):
        return grads
    reduced = [jax.tree_util.keystr(p) for (p, _), v in zip(leaves, varying, strict=True) if not v]
    local = [jax.tree_util.keystr(p) for (p, _), v in zip(leaves, varying, strict=True) if v]
    raise ValueError(
        f"{what} inside strategy.run got gradients of which some are already "
        f"reduced across replicas ({', '.join(reduced[:3])}{' ...' if len(reduced) > 3 else ''}) "
        f"and others are not ({', '.join(local[:3])}{' ...' if len(local) > 3 else ''}), so "
        "phalanx cannot tell whether to sum them. Pass the local gradients as they come from "
        f"the gradient call ({what} sums them across replicas, as TF's apply_gradients "
        "does), or reduce all of them first: "
        "grads = phalanx.get_replica_context().all_reduce('sum', grads)"
    )


def _aggregating(tx: optax.GradientTransformation, axis: str) -> optax.GradientTransformation:
    def update(updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        return tx.update(sum_unreduced(updates, axis), state, params, **extra)

    return optax.GradientTransformationExtraArgs(tx.init, update)


def aggregate_optimizers(nodes: Any, axis: str) -> None:
    """Makes every `nnx.Optimizer` in `nodes` (copies made inside the replica function's
    trace, never the user's objects) sum unreduced gradients over `axis` in `update`."""
    for _, node in nnx.iter_graph(nodes):
        if isinstance(node, nnx.Optimizer):
            node.tx = _aggregating(node.tx, axis)
