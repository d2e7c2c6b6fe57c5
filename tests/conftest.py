"""Test configuration: fake CPU devices, fail-fast collectives, hermetic tests.

The device count is set here, once, before JAX initializes its backend. `dev.py test` runs the
suite at 8 devices and then the `multidevice` tests again with PHALANX_TEST_DEVICES=3.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

NUM_DEVICES = int(os.environ.get("PHALANX_TEST_DEVICES", "8"))
# The tests' programs are tiny: compiling them dominates. Without LLVM's optimization passes
# the suite compiles in about half the time (tests/model/test_families.py from an empty cache:
# 110 s against 192 s), and XLA:CPU's older elemental emitters compile a small fusion in about
# half the time its MLIR fusion emitters take (a truncated normal: 150 against 270 ms; the
# families' `test_trains` and `test_n_replicas_equal_one_replica`: 29 s against 45 s). One-
# device references and N-replica runs are compiled with the same flags, so equality tests
# still compare like with like. Child processes that choose their own devices keep these
# flags (see `child_env`). A flag this XLA does not know would abort every process, so the
# flags are tried once in a child first.
WANTED_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def _known(flags: str) -> str:
    probe = "import jax; jax.numpy.zeros(1).block_until_ready()"
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True)
    return flags if done.returncode == 0 else ""


FAST_COMPILE_FLAGS = _known(WANTED_FLAGS)
os.environ["XLA_FLAGS"] = " ".join(
    [
        os.environ.get("XLA_FLAGS", ""),
        FAST_COMPILE_FLAGS,
        f"--xla_force_host_platform_device_count={NUM_DEVICES}",
        # A stuck collective fails the test in seconds instead of stalling CI.
        "--xla_cpu_collective_call_warn_stuck_timeout_seconds=10",
        "--xla_cpu_collective_call_terminate_timeout_seconds=30",
    ]
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# TensorFlow (a test-only extra, compared side by side) logs its CPU features at import.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Keras's backend is fixed by its first import, whichever test makes it; with TensorFlow
# installed its default would be TensorFlow. phalanx takes Keras on JAX.
os.environ.setdefault("KERAS_BACKEND", "jax")
# The tests compile into a cache of their own in the temp folder, kept from run to run, and
# never into the user's (~/.cache/phalanx/jax); the processes they start share it.
COMPILATION_CACHE = Path(tempfile.gettempdir()) / f"phalanx-tests-{os.getuid()}" / "jax"
os.environ["PHALANX_COMPILATION_CACHE"] = str(COMPILATION_CACHE)
# Record-file indexes (records/index_cache.py) likewise go to a folder of the run's own,
# removed at its end, never into the user's cache.
RECORD_INDEX_CACHE = tempfile.mkdtemp(prefix="phalanx-test-record-index-")
os.environ["PHALANX_RECORD_INDEX_CACHE"] = RECORD_INDEX_CACHE
atexit.register(shutil.rmtree, RECORD_INDEX_CACHE, ignore_errors=True)

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", NUM_DEVICES)

import phalanx  # noqa: E402

# The tests compile the same small steps every run: with the cache warm, tests/strategy takes
# a third of its time without one (24 s against 70 s). Set here too, not only through the
# variable: pytest imports phalanx before this file, for the warning class that pyproject's
# filterwarnings names.
phalanx.set_compilation_cache(COMPILATION_CACHE)

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("PHALANX_DATA_DIR", REPO.parent / "shared" / "data"))
# Why the MNIST tests skipped, and how to run them: one line at the end of the run.
MNIST_SKIP = (
    "no mnist.npz in $PHALANX_DATA_DIR (default ../shared/data) or phalanx's cache; to run "
    "them, set PHALANX_DATA_DIR to a folder holding mnist.npz, or run `python3 dev.py train` "
    "once (it downloads MNIST into the cache)"
)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def mnist_path() -> Path:
    """The offline MNIST file: `$PHALANX_DATA_DIR` (CI sets it; default `../shared/data`),
    else phalanx's cache. The tests never download it: without it, tests that need it skip
    (one summary line says how to enable them), except in CI (CI=true), where they fail."""
    from phalanx._src.datasets import mnist

    places = [DATA_DIR / mnist.FILENAME, mnist.cache_dir() / mnist.FILENAME]
    found = next((path for path in places if path.is_file()), None)
    if found is not None:
        return found
    if _in_ci():
        pytest.fail(
            f"offline MNIST not found at {' or '.join(map(str, places))}; set "
            "PHALANX_DATA_DIR to its folder"
        )
    pytest.skip(MNIST_SKIP)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line for all the tests that skipped for want of MNIST."""

    def reason(report: pytest.TestReport) -> str:
        longrepr = report.longrepr
        return str(longrepr[-1] if isinstance(longrepr, tuple) else longrepr)

    skipped = terminalreporter.stats.get("skipped", [])
    count = sum(MNIST_SKIP in reason(report) for report in skipped)
    if count:
        terminalreporter.write_line(f"{count} MNIST tests skipped: {MNIST_SKIP}")


@pytest.fixture
def child_env() -> dict[str, str]:
    """The environment for a child process that picks its own devices (`phalanx train`, the
    examples, workers): this one's, on CPU, without the fake-device count and
    PHALANX_CPU_DEVICES, but with the tests' fast-compile flags."""
    env = {k: v for k, v in os.environ.items() if k != "PHALANX_CPU_DEVICES"}
    env.update(XLA_FLAGS=FAST_COMPILE_FLAGS, JAX_PLATFORMS="cpu")
    return env


@pytest.fixture
def no_compilation_cache():
    """The tests' compilation cache off during one test and back on after it, for the tests
    that turn the cache on and off themselves."""
    phalanx.set_compilation_cache(None)
    yield
    phalanx.set_compilation_cache(COMPILATION_CACHE)


@pytest.fixture(autouse=True)
def _no_leaked_threads():
    """Fail a test that leaves threads behind (prefetchers, loggers)."""
    before = set(threading.enumerate())
    yield
    for _ in range(50):
        leaked = [
            t
            for t in threading.enumerate()
            if t not in before and t.is_alive() and t.name.startswith("phalanx")
        ]
        if not leaked:
            return
        threading.Event().wait(0.02)
    pytest.fail(f"test leaked threads: {[t.name for t in leaked]}")


# What TensorFlow (the test-only extra) writes into os.environ when a test first imports it
# or runs its first op: set once by TensorFlow, not leaked by the test.
TF_IMPORT_ENV = frozenset(
    {
        "ENABLE_RUNTIME_UPTIME_TELEMETRY",
        "HDF5_PLUGIN_PATH",
        "TF2_BEHAVIOR",
        "TF_FORCE_GPU_ALLOW_GROWTH",  # set by TF's first op, through the Keras loader
        "TPU_ML_PLATFORM",
        "TPU_ML_PLATFORM_VERSION",
    }
)
IGNORED_ENV = TF_IMPORT_ENV | {"PYTEST_CURRENT_TEST"}


@pytest.fixture(autouse=True)
def _no_leaked_env():
    """Fail a test that changes os.environ without restoring it."""

    def snapshot():
        return {k: v for k, v in os.environ.items() if k not in IGNORED_ENV}

    before = snapshot()
    yield
    if snapshot() != before:
        changed = sorted(set(before.items()) ^ set(snapshot().items()))
        for key in set(snapshot()) - set(before):
            del os.environ[key]
        os.environ.update(before)
        pytest.fail(f"test leaked environment changes: {changed}")


@pytest.fixture(autouse=True)
def _fresh_strategy_stack():
    """Every test starts outside any strategy scope."""
    from phalanx._src.strategy import state

    saved = state.STACK.snapshot()
    yield
    state.STACK.restore(saved)
