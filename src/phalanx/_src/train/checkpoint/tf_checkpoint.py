"""`phalanx.Checkpoint` and `latest_checkpoint`: `tf.train.Checkpoint` for custom loops.

TF's tutorials save a custom loop's state with

    checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)
    checkpoint.save(checkpoint_prefix)
    checkpoint.restore(tf.train.latest_checkpoint(checkpoint_dir))

and the same lines work here with `phalanx.Checkpoint` and `phalanx.latest_checkpoint`. The
objects are NNX modules, `nnx.Optimizer`s, metrics, Keras 3 objects, a compiled
`phalanx.Model` or plain values (`tracked`). Their state is written by fit's checkpoint code
(`TrainCheckpointer`): one process writes plain files with checksums into a temporary
directory renamed when complete, several processes write with Orbax (`save` and `restore`
are then collective: every process calls them). A kill during a save leaves the previous
checkpoint as the newest. `restore` places every array as the object receiving it is placed
now, so a checkpoint saved on 8 replicas restores on 1, 3, or another process count.

Where the files go differs from TF: `save("dir/ckpt")` writes the folder `dir/ckpt/1` (the
next save `dir/ckpt/2`) and returns that path; TF writes the files `dir/ckpt-1.index` and
`dir/ckpt-1.data-...`. `latest_checkpoint("dir")` finds the newest checkpoint saved by a
`phalanx.Checkpoint` (or a `CheckpointManager`) in `dir` or one folder below, by the time it
was written, and the one TF's `checkpoint` state file names.

Checkpoints TensorFlow wrote (`tf.train.Checkpoint.save` / `write`, a
`tf.train.CheckpointManager`) restore too, without TensorFlow: `restore("dir/ckpt-3")`
matches their object graph onto Keras 3 objects as TF does (`tf_format.restore`), and a
run trained in TF continues here.

Example:
  >>> checkpoint = phalanx.Checkpoint(model=model, optimizer=optimizer, step=0)
  >>> path = checkpoint.save("runs/ckpt")             # 'runs/ckpt/1'
  >>> checkpoint.restore(phalanx.latest_checkpoint("runs"))
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from phalanx._src.strategy.strategy import get_strategy
from phalanx._src.train.checkpoint.checkpointer import TrainCheckpointer
from phalanx._src.train.checkpoint.files import ORBAX_STEP, RECORD, Files
from phalanx._src.train.checkpoint.record import CheckpointError
from phalanx._src.train.checkpoint.status import RestoreStatus
from phalanx._src.train.checkpoint.tf_format.restore import (
    Slot,
    expected,
    keras_root,
    restore_entries,
)
from phalanx._src.train.checkpoint.tf_format.state_file import is_tf_checkpoint, tf_latest
from phalanx._src.train.checkpoint.tracked import Tracked, track

KIND = "phalanx.Checkpoint"  # the record's mark: a checkpoint of this class, not of fit


class _Holder:
    """The `state` attribute `TrainCheckpointer` saves and restores."""

    def __init__(self, state: Any) -> None:
        self.state = state


class Checkpoint:
    """Saves and restores the state of the objects given by keyword, as `tf.train.Checkpoint`.

    Entries are read and set as attributes (`checkpoint.model`, `checkpoint.step = 5`);
    objects with state of their own (NNX, Keras, `phalanx.Model`) are restored in place,
    values are restored by rebinding the attribute, so read `checkpoint.step` after a restore.

    Args:
      **objects: the objects to save, by name (see `tracked` for the kinds).

    Raises:
      TypeError: naming the entry, for an object that holds no savable state.

    Example:
      >>> with strategy.scope():
      ...     model = MLP(rngs=nnx.Rngs(0))
      ...     optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
      >>> checkpoint = phalanx.Checkpoint(model=model, optimizer=optimizer, step=0)
      >>> checkpoint.step += 1
      >>> path = checkpoint.save("runs/ckpt")        # 'runs/ckpt/1'
      >>> status = checkpoint.restore(path)
    """

    def __init__(self, **objects: Any) -> None:
        entries: dict[str, Tracked] = {}
        object.__setattr__(self, "_entries", entries)
        object.__setattr__(self, "save_counter", 0)
        for name, obj in objects.items():
            self._check_name(name)
            entries[name] = track(name, obj)

    @staticmethod
    def _check_name(name: str) -> None:
        if name.startswith("_") or name in dir(Checkpoint) or name == "save_counter":
            raise ValueError(
                f"phalanx.Checkpoint cannot hold an entry named {name!r}: names starting with "
                "'_' and the checkpoint's own attributes (save, restore, save_counter...) are "
                "reserved; pick another keyword, e.g. my_step=..."
            )

    def __getattr__(self, name: str) -> Any:
        entries = self.__dict__.get("_entries", {})
        if name in entries:
            return entries[name].obj
        raise AttributeError(
            f"this phalanx.Checkpoint has no entry {name!r}; its entries: {sorted(entries)}"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "save_counter":
            object.__setattr__(self, name, value)
            return
        self._check_name(name)
        self._entries[name] = track(name, value)

    def _state(self) -> dict[str, Any]:
        """Every entry's state, on one device set (`_on_one_mesh`)."""
        if not self._entries:
            raise ValueError(
                "this phalanx.Checkpoint holds no objects; pass them by keyword, e.g. "
                "phalanx.Checkpoint(model=model, optimizer=optimizer)"
            )
        return _on_one_mesh({name: entry.state() for name, entry in self._entries.items()})

    def save(self, file_prefix: str | os.PathLike) -> str:
        """Saves every object as the next numbered checkpoint under `file_prefix`.

        Increments `save_counter` and writes the folder `<file_prefix>/<save_counter>`
        atomically (one of that number is replaced). All processes must call it.

        Args:
          file_prefix: where checkpoints of this run go, e.g. `os.path.join(dir, "ckpt")`.

        Returns:
          The checkpoint's path, for `restore`.

        Raises:
          OSError: naming the folder, when it cannot be written (nothing of the new
            checkpoint is kept, the previous ones are unchanged).
          CheckpointError: when another job saves into the folder.
        """
        return self.save_numbered(file_prefix, self.save_counter + 1, {})

    def save_numbered(self, prefix: str | os.PathLike, number: int, mark: dict[str, Any]) -> str:
        """Saves as checkpoint `number` under `prefix`, with `mark` in its record, and
        increments `save_counter` (what `save` and `CheckpointManager.save` do)."""
        folder = _folder(prefix, "save")
        holder = _Holder(self._state())
        record = {
            "kind": KIND,
            "entries": {name: entry.kind for name, entry in self._entries.items()},
            "save_counter": self.save_counter + 1,
            **mark,
        }
        checkpointer = TrainCheckpointer(folder, asynchronous=False)
        try:
            checkpointer.save(number, holder, record, wait=True)
        finally:
            checkpointer.close()
        barrier("phalanx-checkpoint-saved")  # process 0 commits: the folder is there for all
        self.save_counter += 1
        return os.path.join(folder, str(number))

    def restore(self, save_path: str | os.PathLike | None) -> RestoreStatus:
        """Restores every object from the checkpoint at `save_path`.

        Everything is checked first (every byte against its checksum, the entries, every
        array's shape and dtype); on any error nothing is changed. Arrays are placed as the
        receiving objects are placed now, whatever the replica or process count at save
        time. `save_counter` is restored too. All processes must call it.

        A checkpoint TensorFlow wrote (a prefix such as `dir/ckpt-3`) is matched by its
        object graph onto Keras 3 objects and values, as TF matches it: every variable of
        the objects must get a value of its shape, and values for objects not given are
        left unused (`assert_consumed()` names them, `expect_partial()` accepts them).

        Args:
          save_path: a path `save`, `CheckpointManager.save` or `latest_checkpoint`
            returned, or a TF checkpoint's prefix; None (no checkpoint yet) restores
            nothing, as in TF.

        Returns:
          A `RestoreStatus`.

        Raises:
          FileNotFoundError: when there is no checkpoint at `save_path`.
          CheckpointError: naming the entry and the array, when the checkpoint does not fit
            these objects (for a TF checkpoint: naming the key and the variable), or naming
            the file when it is damaged.
          TypeError: a TF checkpoint into an NNX entry (map it by name with
            `phalanx.train.init_from_checkpoint`).
        """
        if save_path is None:
            return RestoreStatus(None)
        if is_tf_checkpoint(save_path):
            return self._restore_tf(os.fspath(save_path))
        folder, number = _split(save_path)
        checkpointer = TrainCheckpointer(folder)
        try:
            steps = checkpointer.steps()
            if number not in steps:
                raise FileNotFoundError(
                    f"no checkpoint at {os.fspath(save_path)!r}: {folder} holds checkpoints "
                    f"{steps}; pass a path save() or latest_checkpoint() returned"
                )
            meta = checkpointer.record(number, whole=True)
            where_now = {name: entry.state() for name, entry in self._entries.items()}
            holder = _Holder(self._state())
            self._check_fits(meta, holder.state, os.path.join(folder, str(number)))
            record = checkpointer.restore(holder, number, expect=("kind", "save_counter"))
        finally:
            checkpointer.close()
        for name, entry in self._entries.items():
            entry.assign(jax.tree.map(_placed_as, holder.state[name], where_now[name]))
        self.save_counter = int(record["save_counter"])
        return RestoreStatus(os.path.join(folder, str(number)))

    def _restore_tf(self, prefix: str) -> RestoreStatus:
        """Restores a checkpoint TensorFlow wrote; see `tf_format.restore`."""
        roots = {name: keras_root(name, e.obj, e.kind) for name, e in self._entries.items()}
        must = {name: expected(root) for name, root in roots.items()}
        roots["save_counter"] = Slot("save_counter", np.int64(self.save_counter))
        status, values = restore_entries(prefix, roots, must)
        for name, value in values.items():
            if name == "save_counter":
                self.save_counter = int(value)
            else:
                self._entries[name].assign(_placed_as(value, self._entries[name].obj))
        for entry in self._entries.values():
            if entry.kind == "phalanx.Model":  # its Keras model took the values: to the state
                entry.obj.set_weights(entry.obj.adapter.model.get_weights())
        return status

    def _check_fits(self, meta: dict[str, Any], state: dict[str, Any], where: str) -> None:
        """Raises CheckpointError naming the entry and array where the checkpoint and these
        objects differ (before `Layout.verify`'s own, more general checks)."""
        record = meta.get("record") if isinstance(meta, dict) else None
        if not isinstance(record, dict) or record.get("kind") != KIND:
            raise CheckpointError(
                f"{where} was not written by phalanx.Checkpoint (it is a fit checkpoint, from "
                "ModelCheckpoint or BackupAndRestore); restore it with "
                "model.load_checkpoint(folder), or pass a path Checkpoint.save returned"
            )
        stored = record.get("entries")
        if not isinstance(stored, dict) or sorted(stored) != sorted(self._entries):
            names = sorted(stored) if isinstance(stored, dict) else stored
            raise CheckpointError(
                f"{where} holds the entries {names}, this Checkpoint has "
                f"{sorted(self._entries)}; restore into a Checkpoint made with the same "
                "keywords as the one saved"
            )
        layout = meta.get("layout")
        try:
            saved = dict(zip(layout["paths"], layout["shapes"], strict=True))
            dtypes = dict(zip(layout["paths"], layout["dtypes"], strict=True))
        except (TypeError, KeyError, ValueError):
            return  # a damaged layout: Layout.from_description says so, naming the file

        for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
            key = jax.tree_util.keystr(path)
            entry = key.split("]")[0].strip("['\"")
            if key not in saved:
                continue  # a different structure: reported as a whole below, by Layout
            if list(saved[key]) != list(leaf.shape) or dtypes[key] != str(leaf.dtype):
                raise CheckpointError(
                    f"{where} does not fit the checkpoint entry {entry!r}: its array "
                    f"{key[len(entry) + 4 :] or key} is stored as {dtypes[key]}"
                    f"{list(saved[key])}, but the object holds {leaf.dtype}{list(leaf.shape)}; "
                    f"restore into a {entry} built with the same shapes as the one saved"
                )
        mine = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]}
        missing, extra = sorted(set(saved) - mine), sorted(mine - set(saved))
        if missing or extra:
            raise CheckpointError(
                f"{where} does not fit these objects: arrays only in the checkpoint: "
                f"{missing[:4]}, only in the objects: {extra[:4]}; restore into objects built "
                "as the ones saved (same layers, optimizer and metrics)"
            )


def _on_one_mesh(state: dict[str, Any]) -> dict[str, Any]:
    """`state` with every leaf a `jax.Array` on the devices of its first mesh-placed leaf.

    One compiled call packs a checkpoint, so all its arrays must share one device set: a
    counter (a host value, or an array on one device) joins the model's replicas. Without
    any mesh-placed leaf, the home is the current strategy's devices, or every device of
    the job when there are several processes (each process then holds its part).
    """
    leaves = jax.tree.leaves(state)
    home = next(
        (
            x.sharding
            for x in leaves
            if isinstance(x, jax.Array) and isinstance(x.sharding, NamedSharding)
        ),
        None,
    )
    if home is None and jax.process_count() > 1:
        home = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec())
    if home is None:
        home = get_strategy().replicated_sharding
    replicated = NamedSharding(home.mesh, PartitionSpec())
    devices = home.device_set

    def move(leaf: Any) -> jax.Array:
        if not isinstance(leaf, jax.Array):
            host = np.asarray(leaf)
            return jax.make_array_from_callback(host.shape, replicated, lambda i: host[i])
        if leaf.sharding.device_set == devices or not leaf.is_fully_addressable:
            return leaf
        return jax.device_put(leaf, replicated)

    return jax.tree.map(move, state)


def barrier(name: str) -> None:
    """Waits for every process (a collective), when there are several."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _placed_as(restored: Any, before: Any) -> Any:
    """`restored` where the leaf it replaces lived (packing moved it beside the others)."""
    if isinstance(before, jax.Array) and not isinstance(restored, jax.Array):
        return jax.device_put(restored, before.sharding)
    if isinstance(before, jax.Array) and restored.sharding != before.sharding:
        return jax.device_put(restored, before.sharding)
    return restored


def _folder(prefix: str | os.PathLike, what: str) -> str:
    if not isinstance(prefix, str | os.PathLike) or not os.fspath(prefix):
        raise TypeError(
            f"Checkpoint.{what} needs a path prefix (str or os.PathLike), got {prefix!r}; "
            "e.g. checkpoint.save(os.path.join(checkpoint_dir, 'ckpt'))"
        )
    return os.path.abspath(os.fspath(prefix))


def _split(save_path: str | os.PathLike) -> tuple[str, int]:
    """`<folder>/<number>` as (folder, number)."""
    path = _folder(save_path, "restore")
    folder, name = os.path.split(path)
    if not name.isdigit():
        hint = ""
        if os.path.isdir(path) and checkpoints_in(path):
            hint = f" (it is a folder of checkpoints: pass latest_checkpoint({path!r}))"
        raise FileNotFoundError(
            f"{os.fspath(save_path)!r} is not a phalanx checkpoint path{hint}; pass what "
            "Checkpoint.save, CheckpointManager.save or latest_checkpoint returned, e.g. "
            "'runs/ckpt/3'"
        )
    return folder, int(name)


def checkpoints_in(folder: str | os.PathLike) -> list[tuple[int, int, str]]:
    """The Checkpoint checkpoints directly in `folder`: (written at, number, path) each,
    oldest first. Fit's checkpoints and anything phalanx did not write are left out."""
    files = Files(folder)
    found = []
    for number in files.steps():
        where = os.path.join(os.fspath(folder), str(number))
        if os.path.isfile(os.path.join(where, RECORD)):
            try:
                _, meta = files.read_meta(number)
            except CheckpointError:
                meta = {"record": {"kind": KIND}}  # damaged: listed, so restore says so
            record = meta.get("record")
            if not isinstance(record, dict) or record.get("kind") != KIND:
                continue
        elif not os.path.isfile(os.path.join(where, ORBAX_STEP)):
            continue
        found.append((os.stat(where).st_mtime_ns, number, where))
    return sorted(found)


def latest_checkpoint(checkpoint_dir: str | os.PathLike) -> str | None:
    """The newest checkpoint in `checkpoint_dir`, phalanx's or TensorFlow's, or None.

    Looks at the numbered checkpoints a `phalanx.Checkpoint` saved in `checkpoint_dir` and
    in each folder directly in it (a `save` prefix such as `checkpoint_dir/ckpt`), as
    `tf.train.latest_checkpoint` finds the newest of
    `checkpoint.save(os.path.join(checkpoint_dir, "ckpt"))`, and at the checkpoint TF's
    `checkpoint` state file names (TF's `save` and `CheckpointManager` write it). The newest
    by the time written wins: a TF run continued in phalanx resumes from phalanx's.

    Args:
      checkpoint_dir: the folder given to `CheckpointManager`, or holding `save` prefixes.

    Returns:
      A path for `Checkpoint.restore`, or None when there is none (`restore(None)` then
      restores nothing, as in TF).

    Example:
      >>> checkpoint.restore(phalanx.latest_checkpoint(checkpoint_dir))
    """
    folder = _folder(checkpoint_dir, "latest_checkpoint")
    if not os.path.isdir(folder):
        return None
    found = checkpoints_in(folder)
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.is_dir() and not entry.name.isdigit():
            found.extend(checkpoints_in(entry.path))
    tf = tf_latest(folder)
    if tf is not None:  # TF's newest, by its state file, against phalanx's by time
        found.append((os.stat(tf + ".index").st_mtime_ns, -1, tf))
    return max(found)[2] if found else None
