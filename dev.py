#!/usr/bin/env python3
"""Set up and run phalanx from a fresh checkout with nothing but Python 3.11+.

    python3 dev.py train [ARGS...]   # the main job: `phalanx train` (MNIST, else the digits)
    python3 dev.py test  [PYTEST...] # ruff, the docs (strict), the tests at 8 and 3 CPU devices
    python3 dev.py docs  [ARGS...]   # build the documentation site into build/site
    python3 dev.py run CMD [ARGS...] # any command inside the project's environment

Each command creates `.venv` beside this file on first use and installs the project into it
(again whenever pyproject.toml changes), so nothing has to be installed by hand. `test` also
needs Chromium for the docs test: it uses one on PATH (or PHALANX_BROWSER), else installs one
with apt-get when run as root, as CI is.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("PHALANX_VENV", ROOT / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".phalanx-installed"
# pytest exits 5 when it collected nothing; a filtered run that selects nothing is not a failure.
PYTEST_NO_TESTS = 5
# The project's offline data (mnist.npz), shared by the checkouts beside this one.
SHARED_DATA = ROOT.parent / "shared" / "data"
# The headless browser tests/docs checks the built site in (tests/docs/conftest.py looks for
# the same names); Playwright drives it and downloads none.
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
APT_BROWSER = ("chromium", "fonts-liberation")


def _call(*cmd: str | os.PathLike, env: dict | None = None) -> int:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.call([str(c) for c in cmd], cwd=ROOT, env=env)


def _stamp(extras: str) -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + extras.encode()).hexdigest()


def ensure_env(extras: str, satisfied_by: tuple[str, ...] = ()) -> None:
    """Create the virtual environment and install the project with `extras` when needed
    (an environment installed with one of `satisfied_by`, a superset, also does)."""
    wanted = _stamp(extras)
    if STAMP.exists() and STAMP.read_text() in {wanted, *map(_stamp, satisfied_by)}:
        return
    if not PY.exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True, upgrade_deps=False).create(VENV)
    if _call(PY, "-m", "pip", "install", "-q", "--upgrade", "pip") != 0:
        sys.exit("could not upgrade pip in the virtual environment")
    if _call(PY, "-m", "pip", "install", "-q", "-e", f".[{extras}]" if extras else ".") != 0:
        sys.exit("installing phalanx failed; see pip's output above")
    STAMP.write_text(wanted)


def build_docs(mkdocs_args: list[str], strict: bool = False) -> int:
    """Builds the documentation site (mkdocs.yml) into build/site; strict: warnings fail."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2
    strict_args = ["--strict"] if strict else []
    return _call(PY, "-m", "mkdocs", "build", *strict_args, *mkdocs_args, env=env)


def find_browser() -> str | None:
    if named := os.environ.get("PHALANX_BROWSER"):
        return shutil.which(named) or named
    return next(filter(None, map(shutil.which, BROWSERS)), None)


def ensure_browser() -> str | None:
    """The browser for the docs test: on PATH, else installed once with apt-get when running
    as root (CI's machines); None (the test then skips, outside CI) when neither works."""
    if found := find_browser():
        return found
    if os.name != "posix" or os.geteuid() != 0 or not shutil.which("apt-get"):
        print("no Chromium for the docs test: install one (e.g. apt-get install chromium)")
        return None
    print(f"installing {' '.join(APT_BROWSER)} with apt-get, for the docs test", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["install", "-y", "-qq", "--no-install-recommends", *APT_BROWSER]
    for args in (["update", "-qq"], install):
        done = subprocess.run(["apt-get", *args], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"apt-get {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return find_browser()


def run_tests(pytest_args: list[str]) -> int:
    ensure_env("test")
    for check in (("check", "."), ("format", "--check", ".")):
        if _call(PY, "-m", "ruff", *check) != 0:
            return 1
    # A broken reference or docstring in the API reference fails the build, and so CI.
    if build_docs(["--quiet"], strict=True) != 0:
        return 1
    env = dict(os.environ)
    env.pop("PHALANX_TEST_DEVICES", None)
    env["PHALANX_SITE_DIR"] = str(ROOT / "build" / "site")  # the docs test serves this build
    if browser := ensure_browser():
        env["PHALANX_BROWSER"] = browser  # so the docs test fails, not skips, without it
    rc = _call(PY, "-m", "pytest", "-q", "--durations=30", *pytest_args, env=env)
    if rc not in (0, PYTEST_NO_TESTS):
        return rc
    # Once more at another device count, to catch code that assumes 8 replicas.
    env["PHALANX_TEST_DEVICES"] = "3"
    rc3 = _call(
        PY, "-m", "pytest", "-q", "--durations=30", "-m", "multidevice", *pytest_args, env=env
    )
    if rc3 not in (0, PYTEST_NO_TESTS):
        return rc3
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "test":
        return run_tests(rest)
    if command == "train":
        ensure_env("plot", satisfied_by=("test",))  # matplotlib, for the run's curves.png
        env = dict(os.environ)
        if "PHALANX_DATA_DIR" not in env and SHARED_DATA.is_dir():
            env["PHALANX_DATA_DIR"] = str(SHARED_DATA)  # as the tests do
        return _call(BIN / "phalanx", "train", *rest, env=env)
    if command == "docs":
        ensure_env("test")  # the test extra includes the docs extra: one environment
        return build_docs(rest)
    if command == "run":
        ensure_env("test")
        return _call(BIN / rest[0], *rest[1:]) if rest else 0
    print(f"unknown command {command!r}; use one of: train, test, docs, run", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
