"""`Model.save_weights` / `load_weights` / `save`: Keras's files for Keras models,
phalanx's checkpoints for Flax NNX modules.

- **A Keras model** writes Keras's own formats, by Keras's own code, so plain Keras loads
  them: `save_weights('x.weights.h5')` (its weights), `save('x.keras')` (architecture and
  weights; `.h5` for Keras's legacy format). The file is written beside its destination
  under a hidden temporary name and renamed when complete, so an interrupted save never
  leaves a half-written file (the previous file stays). The optimizer's state is
  phalanx's: it is in phalanx checkpoints (`ModelCheckpoint('dir')`, `BackupAndRestore`),
  not in the `.keras` file. `load_weights` reads `.weights.h5`, `.keras` and `.h5`.
- **An NNX module** keeps phalanx's checkpoint format: `save_weights(directory)` and
  `save(directory)` write the training state as a checkpoint numbered by the steps
  trained (the same as `ModelCheckpoint(directory)` writes); `load_weights(directory)`
  reads the newest one's weights (parameters and other variables) and leaves the
  optimizer's state as it is, as Keras's `load_weights` does. A Keras file name is
  refused with an error saying so.
- **TF-format weights** (a prefix with a `.index` file): Keras 2's `save_weights`
  (`layer_with_weights-N` onto the Keras 3 model's layers with weights, in order), or a
  `tf.train.Checkpoint(model=...)`'s model; see `tf_format.keras2`. An NNX module maps
  such names itself (`phalanx.train.init_from_checkpoint`).

Multi-host: every process calls these; a Keras file is written by process 0 only.
"""

from __future__ import annotations

import os
from typing import Any

import jax

from phalanx._src.train.api.keras_bridge import is_keras_object
from phalanx._src.train.checkpoint.checkpointer import TrainCheckpointer
from phalanx._src.train.checkpoint.tf_format import keras2
from phalanx._src.train.checkpoint.tf_format.state_file import is_tf_checkpoint

WEIGHTS_SUFFIX = ".weights.h5"
MODEL_SUFFIXES = (".keras", ".h5")


def is_keras_filename(path: str) -> bool:
    """Whether `path` names a Keras file (`.weights.h5`, `.keras`, `.h5`)."""
    return path.endswith((WEIGHTS_SUFFIX, *MODEL_SUFFIXES))


def _is_keras(model: Any) -> bool:
    return is_keras_object(model.adapter.model, "Model")


def check_keras_model(model: Any, path: str, what: str) -> None:
    """ValueError unless `model` (a `phalanx.Model`) can write the Keras file `path`."""
    if not _is_keras(model):
        raise ValueError(
            f"{what}({path!r}): Keras's file formats hold Keras models, and this model is a "
            "Flax NNX module, which keeps phalanx's checkpoint format: pass a directory, e.g. "
            f"{what}('checkpoints') (restore with model.load_checkpoint)"
        )


def _refuse_keras_name(path: str, what: str) -> None:
    if is_keras_filename(path):
        raise ValueError(
            f"model.{what}({path!r}): Keras's file formats hold Keras models, and this model "
            "is a Flax NNX module, which keeps phalanx's checkpoint format: pass a directory, "
            f"e.g. model.{what}('checkpoints/final') (load it with model.load_weights or "
            "model.load_checkpoint)"
        )


def _atomic_keras_write(path: str, write: Any, overwrite: bool) -> None:
    """`write(tmp)` to a hidden temporary file beside `path`, then renamed to `path`."""
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
    if jax.process_index() != 0:
        return
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    suffix = WEIGHTS_SUFFIX if name.endswith(WEIGHTS_SUFFIX) else os.path.splitext(name)[1]
    tmp = os.path.join(folder, f".{name[: -len(suffix)]}.phalanx-tmp-{os.getpid()}{suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):  # the write failed half-way: only our own temporary file
            os.remove(tmp)


def _checkpointer_save(model: Any, directory: str, what: str) -> None:
    if not model.compiled:
        raise RuntimeError(
            f"call model.compile(...) before model.{what}(): an NNX module's checkpoint holds "
            "the compiled training state"
        )
    checkpointer = TrainCheckpointer(directory, asynchronous=False)
    try:
        record = {"epoch": model.engine.position.epoch, "saved_by": what}
        checkpointer.save(model.train_step_count, model.engine, record)
    finally:
        checkpointer.close()


def save_weights(model: Any, filepath: str | os.PathLike, overwrite: bool = True) -> None:
    """See the module docstring; `model` is a `phalanx.Model`."""
    path = os.fspath(filepath)
    if not _is_keras(model):
        _refuse_keras_name(path, "save_weights")
        _checkpointer_save(model, path, "save_weights")
        return
    if not path.endswith(WEIGHTS_SUFFIX):
        raise ValueError(
            f"model.save_weights({path!r}): a Keras model's weights file must end in "
            f"'{WEIGHTS_SUFFIX}' (Keras's format), e.g. 'ckpt{WEIGHTS_SUFFIX}'; for phalanx's "
            "checkpoint of the whole training state use ModelCheckpoint('dir') or "
            "BackupAndRestore"
        )
    net = model.module  # holds the trained values
    _atomic_keras_write(path, lambda tmp: net.save_weights(tmp), overwrite)


def save(model: Any, filepath: str | os.PathLike, overwrite: bool = True) -> None:
    """See the module docstring; `model` is a `phalanx.Model`."""
    path = os.fspath(filepath)
    if not _is_keras(model):
        _refuse_keras_name(path, "save")
        _checkpointer_save(model, path, "save")
        return
    if not path.endswith(MODEL_SUFFIXES):
        raise ValueError(
            f"model.save({path!r}): a Keras model is saved as a '.keras' file (Keras's "
            "format; '.h5' for the legacy one), e.g. model.save('model.keras'); weights "
            f"alone: model.save_weights('ckpt{WEIGHTS_SUFFIX}')"
        )
    net = model.module
    _atomic_keras_write(path, lambda tmp: net.save(tmp), overwrite)


def load_weights(model: Any, filepath: str | os.PathLike) -> None:
    """See the module docstring; `model` is a `phalanx.Model`."""
    path = os.fspath(filepath)
    if _is_keras(model):
        tf_format = is_tf_checkpoint(path)
        if not is_keras_filename(path) and not tf_format:
            raise ValueError(
                f"model.load_weights({path!r}): a Keras model loads Keras's files "
                f"('{WEIGHTS_SUFFIX}', '.keras', '.h5') and TF-format weights (a prefix "
                f"with a '.index' file, none at {path}.index); a phalanx checkpoint "
                "directory loads with model.load_checkpoint(directory)"
            )
        net = model.module  # the current values first: load_weights may set only some
        if tf_format:
            keras2.load_weights(net, path)
        else:
            net.load_weights(path)
        model.set_weights(net.get_weights())
        return
    if is_tf_checkpoint(path):
        raise ValueError(
            f"model.load_weights({path!r}) is a TF checkpoint, whose names are Keras's, and "
            "this model is a Flax NNX module: map the names onto its variables with "
            "phalanx.train.init_from_checkpoint(prefix, {checkpoint_name: variable}) (see "
            "phalanx.train.list_variables(prefix) for the names)"
        )
    _refuse_keras_name(path, "load_weights")
    if not model.compiled:
        raise RuntimeError(
            "call model.compile(...) before model.load_weights(directory): the checkpoint "
            "is read into the compiled training state"
        )
    engine = model.engine
    keep = {"opt": engine.state["opt"], "metrics": engine.state["metrics"]}
    checkpointer = TrainCheckpointer(path, asynchronous=False)
    try:
        checkpointer.restore(engine)
    finally:
        checkpointer.close()
    engine.update_state(**keep)
    model.module  # noqa: B018 -- the user's module sees the loaded values
