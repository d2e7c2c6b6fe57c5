"""The bad-input suite's table machinery: a mistake, the error it must get, and the docs.

Each test module of this folder holds one table of `Case`s (or `CliCase`s for the `phalanx`
command) and runs every row with `expect` (or `run_cli`): the error's exact class, and words
of its message that name the received value. Every row is also a row of
`docs/mistakes.md`, the table of common mistakes (`assert_documented` checks it), so the
page and the suite cannot drift apart. `Untouched` is the guard (the `untouched` fixture of
conftest.py) that fails a case which changed a checkpoint folder it was given.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx

import phalanx
from phalanx._src.cli.main import main

DOCS = Path(__file__).resolve().parents[2] / "docs" / "mistakes.md"
FEATURES, CLASSES, ROWS = 4, 3, 16


@dataclasses.dataclass(frozen=True)
class Case:
    """One mistake made through the Python API.

    Attributes:
      mistake: what the user wrote, as the docs table's first column shows it.
      error: the exact exception class phalanx raises.
      words: fragments of the message that name the received value (and the fix).
      call: makes the mistake, given the test module's `Scene`.
      checkpoint: whether the mistake involves a folder of real checkpoints (the scene
        then has one, and it must be byte-identical afterwards).
    """

    mistake: str
    error: type[BaseException]
    words: tuple[str, ...]
    call: Callable[[Any], Any]
    checkpoint: bool = False


@dataclasses.dataclass(frozen=True)
class CliCase:
    """One mistake on the `phalanx` command line: its exit status and words on stderr."""

    mistake: str
    argv: tuple[str, ...]
    status: int
    words: tuple[str, ...]


def ids(cases: Sequence[Case | CliCase]) -> list[str]:
    names = [re.sub(r"\s+", " ", case.mistake.replace("`", "")) for case in cases]
    assert len(set(names)) == len(names), "two cases make the same mistake"
    return names


def expect(case: Case, scene: Any) -> str:
    """Makes the mistake; asserts the exact error class and the words; returns the message."""
    with pytest.raises(BaseException) as caught:  # the exact class is checked below
        case.call(scene)
    error = caught.value
    message = str(error)
    assert type(error) is case.error, f"{case.mistake}: {type(error).__name__}: {message}"
    missing = [word for word in case.words if word not in message]
    assert not missing, f"{case.mistake}: {missing} not in the message {message!r}"
    return message


def run_cli(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`phalanx ARGV` in this process: the exit status it would give, and what it said
    (stderr, or the message of a `SystemExit`)."""
    try:
        status, said = main(list(argv)), ""
    except SystemExit as exit_:
        code = exit_.code
        status = code if isinstance(code, int) else 1  # a message exits 1, as Python does
        said = "" if isinstance(code, int) or code is None else str(code)
    return status, said + capsys.readouterr().err


def expect_cli(case: CliCase, capsys: pytest.CaptureFixture[str], tmp: Path | None = None) -> str:
    """Runs the case's command line (`{tmp}` in an argument: the test's folder); asserts the
    exit status and the words; returns what it said."""
    argv = [arg.replace("{tmp}", str(tmp)) for arg in case.argv]
    status, said = run_cli(argv, capsys)
    assert status == case.status, f"{case.mistake}: exit {status}: {said}"
    missing = [word for word in case.words if word not in said]
    assert not missing, f"{case.mistake}: {missing} not in {said!r}"
    return said


def assert_documented(cases: Sequence[Case | CliCase]) -> None:
    """Every case is a row of docs/mistakes.md: its mistake, then its error class."""
    rows = [line for line in DOCS.read_text().splitlines() if line.startswith("| ")]
    absent = []
    for case in cases:
        error = case.error.__name__ if isinstance(case, Case) else f"exit {case.status}"
        if not any(row.startswith(f"| {case.mistake} | {error} |") for row in rows):
            absent.append(f"| {case.mistake} | {error} |")
    assert not absent, "rows missing from docs/mistakes.md:\n" + "\n".join(absent)


# ---- the guard of checkpoint folders ---------------------------------------------------


def _snapshot(folder: Path) -> dict[str, str]:
    """`{relative path: sha256}` of every file, and `{relative path/: 'dir'}` of every
    folder, under `folder`."""
    found = {}
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.is_dir():
            found[name + "/"] = "dir"
        else:
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


class Untouched:
    """Folders watched during one test; `check` fails unless each is as it was."""

    def __init__(self) -> None:
        self.before: dict[Path, dict[str, str]] = {}

    def watch(self, folder: Path) -> Path:
        self.before[folder] = _snapshot(folder)
        assert self.before[folder], f"{folder} is empty: nothing to protect"
        return folder

    def check(self) -> None:
        for folder, before in self.before.items():
            after = _snapshot(folder) if folder.is_dir() else {}
            changed = sorted(
                k for k in before.keys() | after.keys() if before.get(k) != after.get(k)
            )
            assert not changed, f"the mistake changed checkpoint files in {folder}: {changed}"


# ---- the tiny model every module builds once -------------------------------------------


class Tiny(nnx.Module):
    """4 features -> 8 -> 3 logits."""

    def __init__(self, rngs: nnx.Rngs, features: int = FEATURES, hidden: int = 8) -> None:
        self.hidden = nnx.Linear(features, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, CLASSES, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(jax.nn.relu(self.hidden(x)))


def tiny_model(compiled: bool = True, hidden: int = 8) -> phalanx.Model:
    """The tiny classifier on every device, compiled (no step is compiled until it runs)."""
    strategy = phalanx.Strategy()
    with strategy.scope():
        model = phalanx.Model(Tiny(nnx.Rngs(0), hidden=hidden))
        if compiled:
            model.compile(
                optimizer=phalanx.optimizers.get("adam", learning_rate=1e-2),
                loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
    return model


def data(rows: int = ROWS, features: int = FEATURES) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, features)).astype(np.float32)
    return x, (np.arange(rows) % CLASSES).astype(np.int32)


@dataclasses.dataclass
class Scene:
    """What a case works on: the module's compiled model, good data, a private folder, and
    (for a checkpoint case) a folder that holds a real checkpoint."""

    model: phalanx.Model
    x: np.ndarray
    y: np.ndarray
    tmp: Path
    checkpoint: Path | None = None
