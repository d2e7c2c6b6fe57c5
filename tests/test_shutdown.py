"""Nothing phalanx starts outlives the interpreter's exit (see `phalanx._src.shutdown`)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import numpy as np

from phalanx._src import shutdown
from phalanx._src.data.prefetch import DevicePrefetcher
from phalanx._src.train.checkpoint.writer import _Writer


class Closeable:
    def __init__(self, name, log, fail=False):
        self.name, self.log, self.fail = name, log, fail

    def close(self):
        self.log.append(self.name)
        if self.fail:
            raise RuntimeError(f"{self.name} could not close")


def test_close_all_closes_the_live_ones_newest_first_and_reports_failures(capsys):
    log = []
    a, b, c = Closeable("a", log), Closeable("b", log, fail=True), Closeable("c", log)
    for obj in (a, b, c):
        shutdown.track(obj)
    gone = shutdown.track(Closeable("gone", log))
    del gone  # collected: never closed, never kept alive by the registry
    shutdown.forget(a)
    shutdown.close_all()
    assert log == ["c", "b"]
    assert "closing Closeable at exit failed: RuntimeError: b could not close" in (
        capsys.readouterr().err
    )
    assert shutdown.tracked() == []


def test_the_writer_drops_a_saves_arrays_as_soon_as_it_has_run():
    # The abort's cause: the thread kept its last task (the save's arrays) while it lingered,
    # and released it while the interpreter finalized.
    writer = _Writer()
    payload = np.zeros(4)
    alive = weakref.ref(payload)
    writer.submit(lambda payload=payload: payload.sum()).result(timeout=10)
    del payload
    deadline = time.monotonic() + 5
    while alive() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert alive() is None
    writer.close()


def test_closing_the_writer_runs_what_was_submitted_and_joins_without_lingering():
    writer = _Writer()
    writer.LINGER = 60.0
    done = []
    futures = [writer.submit(lambda i=i: (time.sleep(0.05), done.append(i))) for i in range(3)]
    assert writer in shutdown.tracked()
    start = time.monotonic()
    writer.close()
    assert time.monotonic() - start < 5  # not the 60 s linger
    assert done == [0, 1, 2] and all(f.done() for f in futures)
    assert not [t for t in threading.enumerate() if t.name == "phalanx-checkpoint-writer"]
    assert writer not in shutdown.tracked()


def test_a_prefetcher_dropped_midway_stops_its_thread():
    prefetcher = DevicePrefetcher(iter(range(1000)), host_depth=2)
    assert next(prefetcher) == 0
    thread = prefetcher._producer.thread
    del prefetcher
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()


LEFT_OPEN = textwrap.dedent(
    """
    import atexit, threading
    import numpy as np
    import jax

    # Registered before phalanx's hook, so it runs after it: what is still running then
    # would still be running when the interpreter finalizes.
    def report():
        alive = sorted(t.name for t in threading.enumerate() if t.name.startswith("phalanx"))
        print("ALIVE AT EXIT:", alive, flush=True)

    atexit.register(report)
    from phalanx._src.data.prefetch import DevicePrefetcher
    from phalanx._src.train.checkpoint.writer import WRITER

    WRITER.LINGER = 60.0
    arrays = {"w": jax.numpy.ones(8)}
    WRITER.submit(lambda arrays=arrays: np.asarray(arrays["w"]).sum()).result()
    batches = DevicePrefetcher((np.full(4, i) for i in range(100)), put_fn=jax.device_put)
    next(batches)  # left open, its thread reading ahead
    print("DONE", flush=True)
    """
)


def test_at_exit_the_writer_and_an_open_prefetcher_are_closed(child_env):
    done = subprocess.run(
        [sys.executable, "-c", LEFT_OPEN],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "DONE" in done.stdout
    assert "ALIVE AT EXIT: []" in done.stdout, done.stdout


def test_fit_with_checkpoints_and_logs_leaves_nothing_running(tmp_path):
    import optax
    from flax import nnx

    import phalanx

    x = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    data = phalanx.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(16)
    with phalanx.Strategy(devices=phalanx.Strategy().devices[:1]).scope():
        model = phalanx.Model(nnx.Linear(3, 1, rngs=nnx.Rngs(0)))
        model.compile(optax.sgd(0.1), loss="mse")
    callbacks = [
        phalanx.callbacks.ModelCheckpoint(tmp_path / "ckpt"),
        phalanx.callbacks.TensorBoard(str(tmp_path / "logs")),
    ]
    model.fit(data, epochs=2, verbose=0, callbacks=callbacks)
    # At once, not after the writer's linger: the fit closed what it started.
    assert shutdown.tracked() == []
    assert [t.name for t in threading.enumerate() if t.name.startswith("phalanx")] == []
