"""Fixtures of the bad-input suite: a folder of real checkpoints, and the guard that proves a
mistake left every checkpoint folder it touched byte-identical.

A mistake must never cost a checkpoint. So a case that involves checkpoints gets a private
copy of a folder that `ModelCheckpoint` really wrote (one epoch of the tiny model, made once
per session); `untouched` hashes every file under it before the case and fails the test if
any file changed, appeared or disappeared after it, whatever the case asserted.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from mistakes import Scene, Untouched, data, tiny_model

import phalanx


@pytest.fixture
def untouched() -> Iterator[Untouched]:
    """Watches the checkpoint folders a case registers; fails the test if one changed."""
    guard = Untouched()
    yield guard
    guard.check()


@pytest.fixture(scope="session")
def saved_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding one real checkpoint: ModelCheckpoint after one epoch of the tiny model."""
    folder = tmp_path_factory.mktemp("saved") / "checkpoints"
    model = tiny_model()
    x, y = data()
    callback = phalanx.callbacks.ModelCheckpoint(folder, monitor="loss")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    assert any(folder.iterdir()), "ModelCheckpoint wrote nothing"
    return folder


@pytest.fixture(scope="module")
def tiny() -> phalanx.Model:
    """The module's compiled tiny model (the cases raise before any step is compiled)."""
    return tiny_model()


@pytest.fixture
def make_scene(
    request: pytest.FixtureRequest, tiny: phalanx.Model, tmp_path: Path, untouched: Untouched
) -> Callable[[bool], Scene]:
    """`make_scene(checkpoint)`: the scene of one case; with `checkpoint`, it holds a watched
    copy of the saved checkpoint folder."""

    def make(checkpoint: bool = False) -> Scene:
        x, y = data()
        scene = Scene(model=tiny, x=x, y=y, tmp=tmp_path)
        if checkpoint:
            copy = tmp_path / "checkpoints"
            shutil.copytree(request.getfixturevalue("saved_checkpoint"), copy)
            scene.checkpoint = untouched.watch(copy)
        return scene

    return make
