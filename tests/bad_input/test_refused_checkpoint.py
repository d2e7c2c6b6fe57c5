"""Mistakes with checkpoints and the other callbacks: their arguments, their folders, and
bad data given to a `fit` that has checkpoint callbacks.

Every case marked `checkpoint` runs against a copy of a folder that holds a real checkpoint,
and the `untouched` guard (conftest.py) fails the test unless every file in it is
byte-identical afterwards: a mistake never costs a checkpoint.
"""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx
from mistakes import CLASSES, Case, Tiny, Untouched, assert_documented, expect, ids

import phalanx

callbacks = phalanx.callbacks


def fit(s, *cbs, x=None, y=None, **kwargs):
    x = s.x if x is None else x
    y = s.y if y is None else y
    return s.model.fit(x, y, verbose=0, callbacks=list(cbs), **kwargs)


def bad_labels(s):
    y = s.y.copy()
    y[3] = CLASSES + 4
    return y


CASES = [
    Case(
        "`ModelCheckpoint(folder, save_freq=0)`",
        ValueError,
        ("save_freq must be 'epoch' or a positive int, got 0",),
        lambda s: callbacks.ModelCheckpoint(s.checkpoint, save_freq=0),
        checkpoint=True,
    ),
    Case(
        "`ModelCheckpoint(folder, save_freq='batch')`",
        ValueError,
        ("got 'batch'",),
        lambda s: callbacks.ModelCheckpoint(s.checkpoint, save_freq="batch"),
        checkpoint=True,
    ),
    Case(
        "`ModelCheckpoint(folder, mode='best')`",
        ValueError,
        ("ModelCheckpoint: mode must be one of", "got 'best'"),
        lambda s: fit(s, callbacks.ModelCheckpoint(s.checkpoint, mode="best")),
        checkpoint=True,
    ),
    Case(
        "`ModelCheckpoint(monitor='val_f1', save_best_only=True)` without a mode",
        ValueError,
        ("ModelCheckpoint(monitor='val_f1')", "mode='min' or mode='max'"),
        lambda s: fit(
            s, callbacks.ModelCheckpoint(s.checkpoint, monitor="val_f1", save_best_only=True)
        ),
        checkpoint=True,
    ),
    Case(
        "`BackupAndRestore('')`",
        ValueError,
        ("BackupAndRestore needs a backup_dir",),
        lambda s: callbacks.BackupAndRestore(""),
    ),
    Case(
        "`BackupAndRestore(folder, save_freq=-1)`",
        ValueError,
        ("got -1",),
        lambda s: callbacks.BackupAndRestore(s.checkpoint, save_freq=-1),
        checkpoint=True,
    ),
    Case(
        "labels outside `[0, classes)` in a `fit` with `ModelCheckpoint`",
        ValueError,
        (f"must be in [0, {CLASSES})", f"e.g. [{CLASSES + 4}]"),
        lambda s: fit(s, callbacks.ModelCheckpoint(s.checkpoint), y=bad_labels(s)),
        checkpoint=True,
    ),
    Case(
        "the wrong number of features in a `fit` with `BackupAndRestore`",
        ValueError,
        ("cannot take inputs of shape", "takes 4 features"),
        lambda s: fit(s, callbacks.BackupAndRestore(s.checkpoint), x=np.zeros((16, 7), np.float32)),
        checkpoint=True,
    ),
    Case(
        "`epochs=-1` in a `fit` with `ModelCheckpoint`",
        ValueError,
        ("got -1",),
        lambda s: fit(s, callbacks.ModelCheckpoint(s.checkpoint), epochs=-1),
        checkpoint=True,
    ),
    Case(
        "`callbacks=[ModelCheckpoint(folder), folder]`: the folder as a callback",
        TypeError,
        ("callbacks must be phalanx.callbacks.Callback instances", "PosixPath"),
        lambda s: fit(s, callbacks.ModelCheckpoint(s.checkpoint), s.checkpoint),
        checkpoint=True,
    ),
    Case(
        "`load_checkpoint` of a folder without checkpoints",
        FileNotFoundError,
        ("no checkpoint in",),
        lambda s: s.model.load_checkpoint(s.tmp),
    ),
    Case(
        "`load_checkpoint` before `compile`",
        RuntimeError,
        ("call model.compile(", "before model.load_checkpoint()"),
        lambda s: phalanx.Model(Tiny(nnx.Rngs(0))).load_checkpoint(s.checkpoint),
        checkpoint=True,
    ),
    Case(
        "`EarlyStopping(mode='best')`",
        ValueError,
        ("mode must be one of", "got 'best'"),
        lambda s: callbacks.EarlyStopping(mode="best"),
    ),
    Case(
        "`ReduceLROnPlateau(factor=2.0)`",
        ValueError,
        ("factor >= 1.0", "factor=2.0"),
        lambda s: callbacks.ReduceLROnPlateau(factor=2.0),
    ),
    Case(
        "`ReduceLROnPlateau(mode='best')`",
        ValueError,
        ("mode must be one of", "got 'best'"),
        lambda s: callbacks.ReduceLROnPlateau(mode="best"),
    ),
    Case(
        "`LearningRateScheduler(0.01)`: a rate, not a schedule",
        TypeError,
        ("schedule must be a function (epoch, lr) -> lr, got 0.01",),
        lambda s: callbacks.LearningRateScheduler(0.01),
    ),
    Case(
        "`LambdaCallback(on_epoch_finish=f)`: a misspelt hook",
        TypeError,
        ("unknown hooks ['on_epoch_finish']",),
        lambda s: callbacks.LambdaCallback(on_epoch_finish=print),
    ),
    Case(
        "`LambdaCallback(on_epoch_end='print')`",
        TypeError,
        ("needs a function, got 'print'",),
        lambda s: callbacks.LambdaCallback(on_epoch_end="print"),
    ),
    Case(
        "`TensorBoard(update_freq=0)`",
        ValueError,
        ("update_freq must be 'epoch' or a positive int, got 0",),
        lambda s: callbacks.TensorBoard(s.tmp, update_freq=0),
    ),
    Case(
        "`TensorBoard(profile_batch=(6, 3))`",
        ValueError,
        ("got (6, 3)", "1 <= start <= stop"),
        lambda s: callbacks.TensorBoard(s.tmp, profile_batch=(6, 3)),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_the_mistake_gets_a_clear_error(case, make_scene):
    scene = make_scene(case.checkpoint)
    expect(case, scene)
    assert scene.model.train_step_count == 0


def test_most_cases_guard_a_real_checkpoint():
    assert sum(case.checkpoint for case in CASES) >= 10


def test_every_case_is_in_the_docs():
    assert_documented(CASES)


@pytest.mark.parametrize("change", ["edit", "add", "remove"])
def test_the_guard_sees_any_change(tmp_path, change):
    folder = tmp_path / "checkpoints"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "state.bin").write_bytes(b"weights")
    guard = Untouched()
    guard.watch(folder)
    guard.check()  # nothing changed yet
    if change == "edit":
        (folder / "1" / "state.bin").write_bytes(b"weightz")
    elif change == "add":
        (folder / "1" / "lock").write_text("")
    else:
        (folder / "1" / "state.bin").unlink()
    with pytest.raises(AssertionError, match="changed checkpoint files"):
        guard.check()
