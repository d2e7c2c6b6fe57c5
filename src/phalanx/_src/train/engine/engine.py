"""`Engine`: the one owner of a model's training state, its compiled calls and fit's position.

`phalanx.Model` is the Keras-shaped face; everything it trains lives here, and the loops,
the feeders, the checkpoints and the callbacks reach it only through the methods below:

- the state `{params, rest, opt, metrics}` (`state`), kept between compiled calls as its
  packed leaves (`leaves`, `set_leaves`, see `packing`), with the logs of its metric sums;
- the compiled functions and what was learned about them (`memo`, `cache`), dropped when
  `build` lays out a new state;
- fit's position (`position`: epoch, steps done, data position, a resume point), the
  step hooks (`add_step_hook`), the trained-step count and the stop flag;
- the ledger of host <-> device transfers (`transfers`, see `transfers.py`).

Example:
  >>> engine = model.engine                 # after model.compile(...)
  >>> engine.state["params"]                # the trained parameters, on the devices
  >>> engine.reset_metrics(); engine.fetch_logs()
  {'loss': 0.0, 'accuracy': 0.0}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from phalanx._src.strategy.strategy import Strategy
from phalanx._src.train.adapters.protocol import ModelAdapter
from phalanx._src.train.api.precision import Policy
from phalanx._src.train.engine.packing import Packing
from phalanx._src.train.engine.step import Steps, log_values
from phalanx._src.train.engine.transfers import Transfers


@dataclasses.dataclass
class FitPosition:
    """Where `fit` is, for the checkpoint callbacks and a resumed run.

    Attributes:
      epoch: the epoch running (or about to run).
      steps_done: the steps of `epoch` done before this call resumed it.
      data_state: the data iterator's position at the last epoch's end (None when the
        source cannot report one).
      resume: a restored position for fit to start from (`resume_at`), taken once.
    """

    epoch: int = 0
    steps_done: int = 0
    data_state: Any = None
    resume: dict | None = None

    def start(self, initial_epoch: int) -> None:
        """A new fit call begins at `initial_epoch`, with nothing to resume."""
        self.epoch, self.steps_done, self.resume = initial_epoch, 0, None

    def resume_at(self, epoch: int, steps_done: int, epoch_done: bool, data: Any) -> None:
        """Makes fit continue after a restored checkpoint: `steps_done` steps into `epoch`,
        or at the next epoch when `epoch_done`, with the data iterator at `data`."""
        self.epoch = epoch + (1 if epoch_done else 0)
        self.resume = {
            "data": data,
            "epoch_done": epoch_done,
            "steps_done": 0 if epoch_done else steps_done,
        }

    def take_resume(self) -> dict | None:
        """The resume point, once (None when there is none)."""
        resume, self.resume = self.resume, None
        return resume


class Engine:
    """Owns one model's training state, compiled calls and fit position; see the module
    docstring.

    Args:
      strategy: the strategy the state is laid out on.
      adapter: the model as pure functions of `(params, rest)`.
    """

    def __init__(self, strategy: Strategy, adapter: ModelAdapter) -> None:
        self.strategy = strategy
        self.adapter = adapter
        self.steps: Steps | None = None  # the pure steps, set by `build`
        self.policy: Policy | None = None  # the precision policy, set by `build`
        self.log_names: list[str] = []  # Keras's order: loss first
        self.steps_per_execution: int | str = 1
        self.cache: dict[Any, Any] = {}  # compiled calls and facts about them, per build
        self.input_spec: Any = None  # the last input's shapes the boundary check saw
        self.position = FitPosition()
        self.train_step_count = 0  # batches trained on by fit, over all calls
        self.stop_training = False
        self.last_logs: Any = None  # the log values of the current metric sums, on device
        self.transfers = Transfers()  # what crossed between host and devices (the ledger)
        self._step_hooks: list[Callable[[int, Any], None]] = []
        self._tree: dict | None = None
        self._leaves: list | None = None
        self._packing: Packing | None = None

    # ---- building ------------------------------------------------------------------------
    def build(
        self,
        steps: Steps,
        log_names: list[str],
        steps_per_execution: int | str,
        policy: Policy,
        state: dict,
    ) -> None:
        """Takes the compiled configuration and a new host state, placed on the strategy's
        devices; forgets every compiled call (they were for the last configuration)."""
        self.steps = steps
        self.policy = policy
        self.log_names = list(log_names)
        self.steps_per_execution = steps_per_execution
        self.state = self.strategy.place_train_state(state)
        self.cache.clear()
        self.input_spec = None

    @property
    def built(self) -> bool:
        """Whether a state exists (after `build`)."""
        return self._tree is not None or self._leaves is not None

    # ---- the state -----------------------------------------------------------------------
    @property
    def state(self) -> dict | None:
        """The training state `{params, rest, opt, metrics}` (see `step.py`), on the devices.

        The compiled calls take and return the state's leaves (`leaves`): a flat list
        crosses jit's C++ dispatch without a Python callback per variable, which the NNX
        `State` tree needs (~14 per step for a small MLP, issue 9), and its scalars
        travel packed into one vector per bit width (`packing`). The tree is rebuilt from
        the leaves only when something reads it.
        """
        if self._tree is None and self._leaves is not None:
            packing = self._packing
            with self.transfers.door() as door:  # the scalars, split on the host and placed
                leaves = packing.leaves(self._leaves)
                kept = {id(a) for a in self._leaves}
                door([a for a in leaves if id(a) not in kept])
            self._tree = jax.tree.unflatten(packing.treedef, leaves)
        return self._tree

    @state.setter
    def state(self, value: dict | None) -> None:
        self._tree = value
        self._leaves = None
        self.last_logs = None  # logs belong to the metric sums they were computed from

    def update_state(self, **parts: Any) -> None:
        """Replaces some of the state's parts (e.g. `opt=...`), placed as the state is (what
        comes from the host through the ledger's door)."""
        state = self.state
        with self.transfers.door() as door:
            placed = self.strategy.place_train_state(parts)
            host = [not isinstance(a, jax.Array) for a in jax.tree.leaves(parts)]
            door([a for a, h in zip(jax.tree.leaves(placed), host, strict=True) if h])
        self.state = {**state, **placed}

    def leaves(self) -> tuple[list, Packing]:
        """`(packed leaves, packing)` of the training state, as the compiled calls take it."""
        if self._leaves is None:
            leaves, treedef = jax.tree.flatten(self._tree)
            metrics = treedef.children()[0].num_leaves  # "metrics" sorts first
            packing = Packing.of(treedef, leaves, metrics)
            if packing != self._packing:  # else keep the one the compiled calls know
                self._packing = packing
            self._leaves = self._packing.pack_placed(leaves)
        return self._leaves, self._packing

    def abstract_state(self) -> dict:
        """The state's structure as `jax.ShapeDtypeStruct`s with their shardings, for a
        trace; unlike `state`, it never splits the packed vectors (a compiled call of its
        own the first time)."""
        if self._tree is not None:
            return jax.tree.map(
                lambda a: jax.ShapeDtypeStruct(
                    a.shape, a.dtype, sharding=getattr(a, "sharding", None)
                ),
                self._tree,
            )
        leaves, packing = self.leaves()
        return jax.tree.unflatten(packing.treedef, packing.abstract(leaves))

    def set_leaves(self, leaves: list, last_logs: Any = None) -> None:
        """The state (packed leaves) after a compiled call, with the logs of its metric sums."""
        self._leaves = leaves
        self._tree = None
        self.last_logs = last_logs

    # ---- compiled calls ------------------------------------------------------------------
    def memo(self, key: Any, make: Callable[[], Any]) -> Any:
        """`cache[key]`, made by `make()` the first time (until the next `build`)."""
        value = self.cache.get(key)
        if value is None:
            value = self.cache[key] = make()
        return value

    def steps_per_call(self, steps_hint: int | None = None) -> int:
        """Steps per compiled call, for a phase of about `steps_hint` steps when known."""
        k = self.steps_per_execution
        if k == "auto":
            # One call per ~50 steps amortises dispatch (1.4-1.8x for a small MLP, measured);
            # fewer when the phase is shorter, so no call is mostly filler steps. On XLA:CPU
            # a convnet falls back to single-step calls (see execution.py).
            return max(1, min(50, steps_hint or 50))
        return k

    # ---- metrics and logs ----------------------------------------------------------------
    def reset_metrics(self) -> None:
        """Zeroes the metric sums: puts in zero sums made once. No compiled call donates the
        metric sums, so one set serves every reset, and an epoch's boundary, where the
        devices wait for the host, makes none (a call: ~0.1 ms on one CPU device, ~0.5 ms
        on 8)."""
        leaves, packing = self.leaves()
        n = packing.metric_count
        made = self.cache.get("zero_metrics")
        if made is None or made[0] is not packing:
            repl = self.strategy.replicated_sharding
            # Placed from the host: nothing to compile before the first step (a weakly
            # typed sum keeps its type, so the calls see the signature they compiled for).
            with self.transfers.door() as door:
                zeros = [
                    door(jnp.zeros_like(m))
                    if getattr(m, "weak_type", False)
                    else door(_replicate(np.zeros(m.shape, m.dtype), repl))
                    for m in leaves[:n]
                ]
            made = self.cache["zero_metrics"] = (packing, zeros)
        self.set_leaves([*made[1], *leaves[n:]])

    def fetch_logs(self, values: list[jax.Array] | None = None) -> dict[str, float]:
        """The loss and metric values as Python floats (one device fetch): `values`, a
        compiled call's logs, or by default the current ones.

        The last compiled call already returned them for the sums it left in the state
        (`step.log_values`); only other sums (e.g. just reset) need a call of their own.
        """
        values = self.last_logs if values is None else values
        if values is None:
            graphdef = self.steps.metrics_graphdef
            fn = self.memo("logs", lambda: jax.jit(lambda m: log_values(graphdef, m)))
            values = fn(self.state["metrics"])
        self.transfers.read(values)
        for value in values[1:]:
            value.copy_to_host_async()  # the copies overlap; float() waits for each
        return {name: float(v) for name, v in zip(self.log_names, values, strict=True)}

    # ---- step hooks ----------------------------------------------------------------------
    def add_step_hook(self, hook: Callable[[int, Any], None]) -> None:
        """Calls `hook(steps, feeder)` after each training execution, with the epoch's step
        count and the feeder (for its data position); checkpoint callbacks that save every
        N steps and the preemption watch hook in here."""
        self._step_hooks.append(hook)

    def remove_step_hook(self, hook: Callable[[int, Any], None]) -> None:
        """Removes `hook` if it was added."""
        if hook in self._step_hooks:
            self._step_hooks.remove(hook)

    def on_train_steps(self, steps: int, feeder: Any) -> None:
        """Runs the step hooks (the loop calls it after each training execution)."""
        for hook in self._step_hooks:
            hook(steps, feeder)


def _replicate(host: np.ndarray, sharding: Any) -> jax.Array:
    """`host` on every device of the replicated `sharding` (any process count)."""
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
