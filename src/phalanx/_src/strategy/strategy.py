"""`Strategy`: synchronous data parallelism over a mesh of devices, tf.distribute's names."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from phalanx._src.strategy import annotations, communication, device_strings, state
from phalanx._src.strategy import mesh as mesh_lib
from phalanx._src.strategy import reduce as reduce_lib
from phalanx._src.strategy import run as run_lib
from phalanx._src.strategy import sharding as sharding_lib
from phalanx._src.strategy.distribute import InputContext, ValueContext, check_dataset
from phalanx._src.strategy.distributed_input import DistributedDataset, PerReplicaBatches
from phalanx._src.strategy.reduce_op import ReduceOp
from phalanx._src.strategy.values import PerReplica, local_results


class Strategy:
    """Synchronous data-parallel training over every device (or the ones given).

    The strategy owns a `jax.sharding.Mesh` whose data axis spans all replicas: 1-D, or
    `data x model` with `model_parallel=M`, where each replica is a group of `M` devices
    that split the layers the model annotates (`nnx.with_partitioning(init, (None,
    "model"))`; see `annotations.py`). State is replicated over the data axis (a `Model`'s
    may be sharded: `state_sharding`); batches are sharded along it. Build models and
    optimizers inside `scope()` and they are created replicated (or as annotated);
    `run` executes a function once per replica; `reduce` combines per-replica results. In a
    multi-process job, every process must build the same strategy and call every method that
    communicates (`run`, `reduce`, distributing data).

    Args:
      devices: the devices to use, in replica order: `jax.Device`s or TF device strings
        ('/gpu:0', '/device:GPU:1', '/job:localhost/replica:0/task:0/device:CPU:0'; see
        `device_strings`). Default: all global devices (`jax.devices()`), across processes.
      axis_name: the name of the data axis.
      model_parallel: devices per replica (the `model` axis's size). It must divide the
        device count and each process's devices; a replica's devices are consecutive
        devices of one process (`mesh.py`). `num_replicas_in_sync` is N / M.
      axis_rules: `(logical name, mesh axis or None)` pairs, as Flax's
        `logical_axis_rules`, for models annotated with logical names (MaxText's
        `("embed", "mlp")`): `[("mlp", "model"), ("embed", None)]`. An axis the mesh lacks
        (`model` without `model_parallel`) means replicated.
      state_sharding: where `Model`'s train state lives. 'replicated' (default): a full
        copy on every replica. 'zero1': optimizer state sharded over the replicas (ZeRO-1).
        'fsdp': parameters sharded too, gathered where used (FSDP / ZeRO-3). Same numbers
        in every mode. Both shard over the data axis, on top of `model_parallel`.
      cross_device_ops: `phalanx.NcclAllReduce()`, `HierarchicalCopyAllReduce()`,
        `ReductionToOneDevice()` (or TF's), kept as `cross_device_ops`.
      communication_options: `phalanx.experimental.CommunicationOptions(...)`, kept as
        `communication_options`. Neither changes anything: XLA picks the collective on
        every platform (NCCL on GPUs, ICI on TPUs, Gloo across CPU processes).

    Raises:
      ValueError: for no devices, a repeated device, a device string naming no device,
        devices of several platforms, an unknown `state_sharding`, malformed `axis_rules`,
        or a `model_parallel` that does not divide the devices.
      TypeError: a `cross_device_ops` or `communication_options` of another kind.

    Example:
      >>> strategy = phalanx.Strategy()
      >>> print(strategy.num_replicas_in_sync)
      8
      >>> with strategy.scope():
      ...     model = MLP(rngs=nnx.Rngs(0))        # parameters replicated on 8 devices
      >>> wide = phalanx.Strategy(model_parallel=2)   # 4 replicas of 2 devices
      >>> with wide.scope():
      ...     model = Transformer(rngs=nnx.Rngs(0))  # kernels annotated "model": halves
    """

    def __init__(
        self,
        devices: Sequence[jax.Device | str] | None = None,
        axis_name: str = "data",
        *,
        model_parallel: int = 1,
        axis_rules: Sequence[tuple[str, Any]] | None = None,
        state_sharding: str = "replicated",
        cross_device_ops: Any = None,
        communication_options: Any = None,
    ):
        self._state_sharding = sharding_lib.check_mode(state_sharding)
        self.cross_device_ops = communication.check_cross_device_ops(cross_device_ops)
        self.communication_options = communication.check_communication_options(
            communication_options
        )
        devices = device_strings.resolve(devices)
        if not devices:
            raise ValueError("Strategy needs at least one device; got an empty list")
        if len({d.id for d in devices}) != len(devices):
            raise ValueError(f"Strategy got the same device twice: {devices}")
        self._devices = tuple(devices)
        self._axis_name = axis_name
        self._model_parallel = mesh_lib.check_model_parallel(model_parallel, devices)
        self._axis_rules = annotations.check_rules(axis_rules)
        self._mesh = mesh_lib.build_mesh(devices, axis_name, self._model_parallel)
        self._rules = annotations.AxisRules(self._axis_rules, dict(self._mesh.shape), axis_name)
        self._run_cache: dict[Any, Any] = {}
        self._scope_stack: list[contextlib.ExitStack] = []

    # ---- topology -------------------------------------------------------------------------
    @property
    def num_replicas_in_sync(self) -> int:
        """Number of replicas that step in lockstep (the data axis size: the devices over
        `model_parallel`)."""
        return len(self._devices) // self._model_parallel

    @property
    def num_local_replicas(self) -> int:
        """Replicas on this process's devices."""
        me = jax.process_index()
        return sum(d.process_index == me for d in self._devices) // self._model_parallel

    @property
    def model_parallel(self) -> int:
        """Devices per replica: the `model` axis's size (1: data parallelism only)."""
        return self._model_parallel

    @property
    def axis_rules(self) -> tuple[tuple[str, Any], ...]:
        """The logical-name rules annotations are resolved with (`axis_rules=`)."""
        return self._axis_rules

    @property
    def devices(self) -> tuple[jax.Device, ...]:
        return self._devices

    @property
    def mesh(self) -> Mesh:
        return self._mesh

    @property
    def axis_name(self) -> str:
        return self._axis_name

    @property
    def state_sharding(self) -> str:
        """'replicated', 'zero1' or 'fsdp': how `Model`'s train state is laid out."""
        return self._state_sharding

    @property
    def replicated_sharding(self) -> NamedSharding:
        """Sharding of state: a full copy on every replica."""
        # Made once: a fresh NamedSharding per batch costs ~50 us in JAX's per-object caches.
        if getattr(self, "_replicated_sharding", None) is None:
            self._replicated_sharding = NamedSharding(self._mesh, P())
        return self._replicated_sharding

    @property
    def data_sharding(self) -> NamedSharding:
        """Sharding of batches: rows split along the data axis."""
        if getattr(self, "_data_sharding", None) is None:
            self._data_sharding = NamedSharding(self._mesh, P(self._axis_name))
        return self._data_sharding

    def __repr__(self) -> str:
        kind = self._devices[0].platform
        model = f", model_parallel={self._model_parallel}" if self._model_parallel > 1 else ""
        return (
            f"Strategy(num_replicas_in_sync={self.num_replicas_in_sync}{model}, platform={kind!r})"
        )

    # ---- scope and state ------------------------------------------------------------------
    @contextlib.contextmanager
    def scope(self) -> Iterator[Strategy]:
        """Makes this the current strategy; arrays and NNX variables created inside are
        replicated over its devices, or laid out as their sharding annotations say
        (through `axis_rules`; an axis the mesh lacks means replicated). Nesting works; the
        outer scope is restored on exit.

        Raises:
          ValueError: a variable built inside is annotated with a name that is neither a
            mesh axis nor mapped by `axis_rules` (the message says how to map it).

        Example:
          >>> with strategy.scope():
          ...     model = MLP(rngs=nnx.Rngs(0))
          ...     optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
        """
        state.STACK.push(self)
        try:
            with jax.set_mesh(self._mesh), nnx.logical_axis_rules(self._rules.flax_rules()):
                yield self
        except ValueError as error:
            clear = annotations.translated(error, self._rules)
            if clear is None:
                raise
            raise clear from error
        finally:
            state.STACK.pop(self)

    def replicate(self, tree: Any) -> Any:
        """Places `tree` (a pytree of arrays, or NNX modules/optimizers/metrics) replicated.

        NNX objects are updated in place and returned; pytrees are returned as new arrays.
        Objects built inside `scope()` are already replicated; this is for ones built outside.

        Example:
          >>> model = strategy.replicate(MLP(rngs=nnx.Rngs(0)))
        """
        sharding = self.replicated_sharding
        nodes = [leaf for leaf in jax.tree.leaves(tree, is_leaf=nnx.graph.is_graph_node)]
        if any(nnx.graph.is_graph_node(leaf) for leaf in nodes):
            graph_nodes = [n for n in nodes if nnx.graph.is_graph_node(n)]
            values = nnx.state(graph_nodes)
            # As a model's non-trainable part: laid out by its annotations alone (no
            # state_sharding mode shards "rest").
            placed = jax.device_put(values, self.train_state_shardings({"rest": values})["rest"])
            nnx.update(graph_nodes, placed)
            return jax.tree.map(
                lambda x: x if nnx.graph.is_graph_node(x) else jax.device_put(x, sharding),
                tree,
                is_leaf=nnx.graph.is_graph_node,
            )
        return jax.device_put(tree, sharding)

    def train_state_shardings(self, state: dict) -> Any:
        """The sharding of each leaf of a train-state dict (`params`, `rest`, `opt`,
        `metrics`, or a subset) under `state_sharding`; leaves may be abstract."""
        return sharding_lib.train_state_shardings(
            state, self._state_sharding, self._mesh, self._axis_name, self._axis_rules
        )

    def place_train_state(self, state: dict) -> dict:
        """Puts a train-state dict (or a subset of its parts) on the devices, replicated or
        sharded as `state_sharding` says.

        Example:
          >>> strategy = phalanx.Strategy(state_sharding="zero1")
          >>> state = strategy.place_train_state({"params": params, "opt": tx.init(params)})
        """
        return jax.device_put(state, self.train_state_shardings(state))

    # ---- data -----------------------------------------------------------------------------
    def experimental_distribute_dataset(self, dataset: Iterable[Any]) -> DistributedDataset:
        """Turns an iterable of global batches into global arrays sharded over the replicas.

        Each batch keeps its structure (tuple, dict, namedtuple...); each leaf becomes a global
        `jax.Array` whose rows are spread over replicas as tf.distribute spreads them (ceil(B/N)
        per replica, in order). A partial last batch is padded to the first batch's shape, so
        nothing recompiles, and carries a mask (`phalanx.get_batch_mask`) that
        `compute_average_loss`, `reduce` and metrics honour by themselves.

        In a multi-process job, a phalanx dataset yields every process only its share of each
        global batch; any other iterable must already yield process-local batches (as with
        `distribute_datasets_from_function`).

        Raises:
          ValueError: when the dataset was batched with `drop_remainder=True` and its batch
            does not split over the replicas, or for arrays instead of batches (a tuple
            `(x, y)`, a dict, an array), as tf.distribute refuses them.

        Example:
          >>> ds = phalanx.data.Dataset.from_tensor_slices((x, y)).batch(1024)
          >>> for batch in strategy.experimental_distribute_dataset(ds):
          ...     strategy.run(train_step, args=(batch,))
        """
        check_dataset(dataset, "experimental_distribute_dataset")
        batch_size = getattr(dataset, "batch_size", None)
        drop_remainder = bool(getattr(dataset, "drop_remainder", False))
        source = dataset
        if jax.process_count() > 1 and hasattr(dataset, "process_split"):
            source = dataset.process_split(jax.process_index(), jax.process_count())
        return DistributedDataset(
            self,
            lambda: source,
            global_batch_size=batch_size if isinstance(batch_size, int) else None,
            drop_remainder=drop_remainder,
            source=dataset,
        )

    distribute = experimental_distribute_dataset

    def distribute_datasets_from_function(
        self,
        dataset_fn: Callable[[InputContext], Iterable[Any]],
        *,
        process_batches: bool = False,
    ) -> DistributedDataset:
        """Builds each process's pipeline with `dataset_fn(input_context)` and distributes it.

        As in tf.distribute, `dataset_fn` returns a dataset of per-replica batches (batch it
        with `ctx.get_per_replica_batch_size(GLOBAL_BATCH)`); each step takes one batch per
        local replica, in replica order, so the global batch is per-replica x replicas. The
        context numbers are TF's: one input pipeline per process (`num_input_pipelines`,
        `input_pipeline_id`) and `num_replicas_in_sync` over all processes. At the end of the
        data, a step with fewer or shorter batches is padded and masked as
        `experimental_distribute_dataset` pads a partial batch.

        Args:
          dataset_fn: `dataset_fn(ctx) -> iterable of batches`, called once, now.
          process_batches: phalanx's older form, off by default: each element of
            `dataset_fn`'s dataset is this process's whole share of the global batch
            (global batch = element rows x `num_input_pipelines`).

        Returns:
          A `DistributedDataset`, iterated like `experimental_distribute_dataset`'s.

        Example:
          >>> def dataset_fn(ctx):
          ...     batch_size = ctx.get_per_replica_batch_size(64)
          ...     d = phalanx.data.Dataset.from_tensors([[1.0]]).repeat().batch(batch_size)
          ...     return d.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
          >>> dist = strategy.distribute_datasets_from_function(dataset_fn)
        """
        context = InputContext(
            num_input_pipelines=jax.process_count(),
            input_pipeline_id=jax.process_index(),
            num_replicas_in_sync=self.num_replicas_in_sync,
        )
        dataset = dataset_fn(context)
        check_dataset(dataset, "distribute_datasets_from_function (what dataset_fn returns)")
        batch_size = getattr(dataset, "batch_size", None)
        drop_remainder = bool(getattr(dataset, "drop_remainder", False))
        if process_batches:
            per_step = context.num_input_pipelines
            source: Iterable[Any] = dataset
        else:
            per_step = self.num_replicas_in_sync
            source = PerReplicaBatches(dataset, self.num_local_replicas)
        global_batch = batch_size * per_step if isinstance(batch_size, int) else None
        return DistributedDataset(
            self,
            lambda: source,
            global_batch_size=global_batch,
            drop_remainder=drop_remainder,
        )

    def experimental_distribute_values_from_function(self, value_fn: Callable[[Any], Any]) -> Any:
        """Builds one value per replica with `value_fn(context)`; returns `PerReplica` leaves.

        `context` has `replica_id_in_sync_group` and `num_replicas_in_sync` (Python ints).

        Example:
          >>> v = strategy.experimental_distribute_values_from_function(
          ...     lambda ctx: jnp.arange(4) + 4 * ctx.replica_id_in_sync_group)
          >>> strategy.reduce("sum", v, axis=None)   # [4, 6, 8, 10] on 2 replicas
        """
        values = [
            value_fn(ValueContext(r, self.num_replicas_in_sync))
            for r in range(self.num_replicas_in_sync)
        ]
        sharding = self.data_sharding

        def stack(*leaves: Any) -> PerReplica:
            return PerReplica(jax.device_put(np.stack([np.asarray(x) for x in leaves]), sharding))

        return jax.tree.map(stack, *values)

    # ---- computation ----------------------------------------------------------------------
    def run(self, fn: Callable, args: Sequence[Any] = (), kwargs: dict | None = None) -> Any:
        """Runs `fn(*args, **kwargs)` once per replica, compiled (`jax.shard_map` + `jax.jit`).

        Inside `fn`: distributed batches and `PerReplica` values are this replica's share;
        everything else, including NNX modules and parameters, is this replica's own copy,
        so `jax.grad` gives the replica's local gradient, and `optimizer.update(model, grads)`
        sums the replicas' gradients first, as TF's `apply_gradients` does (gradients already
        reduced with `all_reduce` are not summed again). NNX modules passed in, or read by
        `fn` from its closure or globals as TF steps read them, are updated in place
        afterwards (replica 0's values, as mirrored variables are; metric state summed).

        Returns:
          `fn`'s output structure: leaves that are identical on every replica (results of
          `all_reduce`) as replicated arrays, all others as `PerReplica`, whatever the number
          of replicas.

        Raises:
          TypeError: `fn` returned something other than arrays and numbers (a string, a
            module...); the message names the output.

        Example:
          >>> def step(batch):                  # reads model and optimizer, as in TF
          ...     x, y = batch
          ...     def loss_fn(model):
          ...         per_example = optax.softmax_cross_entropy_with_integer_labels(model(x), y)
          ...         return phalanx.compute_average_loss(per_example)
          ...     loss, grads = nnx.value_and_grad(loss_fn)(model)
          ...     optimizer.update(model, grads)    # summed over replicas
          ...     return loss
          >>> per_replica_loss = strategy.run(step, args=(batch,))
          >>> loss = strategy.reduce("sum", per_replica_loss, axis=None)
        """
        return run_lib.run(self, fn, tuple(args), kwargs)

    def reduce(self, reduce_op: ReduceOp | str, value: Any, axis: int | None = None) -> Any:
        """Combines per-replica values into one, as tf.distribute.Strategy.reduce does.

        With `axis=None`, replica values are combined elementwise (MEAN divides by the number
        of replicas). With an `axis`, each replica's value is first reduced along it and MEAN
        divides by the total number of elements along that axis over all replicas. Padded
        rows of a partial batch never count. A mirrored result of `run` (a plain array, the
        same on every replica) is summed once per replica by SUM and returned by MEAN, as in
        tf.distribute; any other plain array has no per-replica parts: MEAN returns it and
        SUM raises. (`run` marks its mirrored results by identity, so compute on them only
        after reducing.)

        Args:
          reduce_op: `ReduceOp` or "sum" / "mean" / "max" / "min".
          value: a pytree of `PerReplica` values (from `run`) or distributed batch arrays.
          axis: None, or the per-replica axis to reduce along as well.

        Example:
          >>> strategy.reduce("mean", per_replica_batch, axis=0)
        """
        return reduce_lib.reduce(self, reduce_op, value, axis)

    def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
        """The per-replica parts of `value` on this process, as a tuple (one item per replica).

        A distributed batch gives each replica's share. A per-example value of a partial
        batch keeps its real rows only, as in TF: a replica past the end of the data gives an
        empty (0-row) value."""
        groups = self._mesh.devices.reshape(self.num_replicas_in_sync, -1)
        first = [g[0].process_index for g in groups].index(jax.process_index())
        return local_results(value, self.num_replicas_in_sync, first, self.num_local_replicas)


_DEFAULT: dict[str, Strategy] = {}


def get_strategy() -> Strategy:
    """The strategy of the innermost open `scope()`, else a default one-device strategy.

    Example:
      >>> phalanx.get_strategy().num_replicas_in_sync    # outside any scope
      1
    """
    current = state.STACK.current()
    if current is not None:
        return current
    if "default" not in _DEFAULT:
        _DEFAULT["default"] = Strategy(devices=jax.local_devices()[:1])
    return _DEFAULT["default"]


state.provide_default(get_strategy)  # for the replica context outside any scope


def has_strategy() -> bool:
    """True inside some strategy's `scope()`."""
    return state.STACK.current() is not None
