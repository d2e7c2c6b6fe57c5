"""Mistakes on `phalanx train`'s command line, run in this process through `main(argv)`.

Each case stops before any device work (a usage error, a bad reference, missing data), with
its exit status and one line on stderr that names the value received.
"""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest
from mistakes import CliCase, assert_documented, expect_cli, ids

LOADERS = textwrap.dedent(
    """
    import numpy as np

    def scalar():
        return 3

    def three_splits():
        x, y = np.zeros((8, 4), np.float32), np.zeros(8, np.int32)
        return (x, y), (x, y), (x, y)

    def bare_arrays():
        x = np.zeros((8, 4), np.float32)
        return (x, x, x), (x, x)

    def tabular():
        x, y = np.zeros((8, 4), np.float32), np.zeros(8, np.int32)
        return (x, y), (x, y)

    NOT_A_FUNCTION = 3
    """
)
MODULE = "phalanx_bad_loaders"


def train(*args: str) -> tuple[str, ...]:
    return ("train", *args)


CASES = [
    CliCase(
        "`phalanx train --steps-per-execution 0`",
        train("--steps-per-execution", "0"),
        1,
        ("--steps-per-execution must be a positive int or 'auto', got '0'",),
    ),
    CliCase(
        "`phalanx train --steps-per-execution many`",
        train("--steps-per-execution", "many"),
        1,
        ("got 'many'",),
    ),
    CliCase(
        "`phalanx train --precision float16`",
        train("--precision", "float16"),
        2,
        ("invalid choice: 'float16'", "mixed_float16"),
    ),
    CliCase("`phalanx train --verbose 3`", train("--verbose", "3"), 2, ("invalid choice: 3",)),
    CliCase(
        "`phalanx train --epochs five`",
        train("--epochs", "five"),
        2,
        ("--epochs: invalid int value: 'five'",),
    ),
    CliCase(
        "`phalanx train --cpu-devices all`",
        train("--cpu-devices", "all"),
        2,
        ("--cpu-devices: invalid int value: 'all'",),
    ),
    CliCase(
        "`phalanx train --jsn`: a misspelt flag",
        train("--jsn"),
        2,
        ("unrecognized arguments: --jsn",),
    ),
    CliCase("`phalanx trian`: a misspelt command", ("trian",), 2, ("invalid choice: 'trian'",)),
    CliCase(
        "`phalanx train --data mydata`: not a reference",
        train("--data", "mydata"),
        2,
        ("--data 'mydata' is not a reference", "package.module:function"),
    ),
    CliCase(
        "`phalanx train --data nosuchmodule:load`",
        train("--data", "nosuchmodule:load"),
        2,
        ("cannot import module 'nosuchmodule'",),
    ),
    CliCase(
        f"`phalanx train --data {MODULE}:lod`: a misspelt function",
        train("--data", f"{MODULE}:lod"),
        2,
        ("has no attribute 'lod'", "three_splits"),
    ),
    CliCase(
        f"`phalanx train --data {MODULE}:NOT_A_FUNCTION`",
        train("--data", f"{MODULE}:NOT_A_FUNCTION"),
        2,
        ("is not a function (got int)",),
    ),
    CliCase(
        "a `--data` loader that returns a number",
        train("--data", f"{MODULE}:scalar"),
        2,
        ("returned int", "((x_train, y_train), (x_test, y_test))"),
    ),
    CliCase(
        "a `--data` loader that returns three splits",
        train("--data", f"{MODULE}:three_splits"),
        2,
        ("returned tuple of length 3",),
    ),
    CliCase(
        "a `--data` loader whose train split has three arrays",
        train("--data", f"{MODULE}:bare_arrays"),
        2,
        ("the train split is a tuple of 3 item(s)",),
    ),
    CliCase(
        "`--data` of your own with the built-in `--model mlp`",
        train("--data", f"{MODULE}:tabular"),
        2,
        ("--model mlp is built for the built-in images", "--model package.module:factory"),
    ),
    CliCase(
        "`phalanx train --data mnist` offline, without mnist.npz",
        ("train", "--data", "mnist"),
        2,
        ("mnist.npz", "PHALANX_DATA_DIR"),
    ),
]


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """No MNIST anywhere and a download that fails at once; the loaders module importable."""
    (tmp_path / f"{MODULE}.py").write_text(LOADERS)
    # A copy of sys.path: the CLI may add the working folder to it.
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    importlib.invalidate_caches()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PHALANX_DATA_DIR", str(tmp_path / "no-data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PHALANX_MNIST_URL", (tmp_path / "absent.npz").as_uri())
    monkeypatch.setenv("KERAS_BACKEND", "jax")  # what `phalanx train` would set
    yield tmp_path
    sys.modules.pop(MODULE, None)


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_the_mistake_gets_a_clear_error(case, offline, capsys):
    said = expect_cli(case, capsys)
    assert "Traceback" not in said
    assert not (offline / "runs").exists()  # stopped before any run folder


def test_every_case_is_in_the_docs():
    assert_documented(CASES)
