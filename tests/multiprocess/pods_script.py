"""A tiny `fit` for the failure tests, run as its own process (by hand or per PHALANX_* env).

Usage: python pods_script.py OUT_DIR MODE [SIGNAL_PROCESS]

MODE:
  reference   fit uninterrupted; write OUT_DIR/reference-<process>.npz
  preempt     reference first, then fit with BackupAndRestore and SIGTERM itself (process
              SIGNAL_PROCESS only) at global step 20; never returns normally (exit 143)
  resume      fit again with BackupAndRestore; write OUT_DIR/resumed-<process>.npz
  no-backup   fit without BackupAndRestore and SIGTERM at step 20
  twice       like no-backup, with two SIGTERMs in a row
  die         join, train a few steps, then process SIGNAL_PROCESS SIGKILLs itself
  die-native  as die, and at that step every other process throws an uncaught C++
              exception on a thread of its own, as Gloo does when it sees the dead peer
              first (std::terminate, which would abort the process)
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

import phalanx.cluster

TOPOLOGY = phalanx.cluster.resolve()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

import phalanx  # noqa: E402

SIGNAL_AT = 20  # global step: epoch 1, batch 4 of 16


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(6, 16, rngs=rngs)
        self.l2 = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


class Signal(phalanx.callbacks.Callback):
    """Sends this process SIGTERM (or SIGKILL) after global step `at`, as a scheduler would."""

    def __init__(self, at: int, sig: int, times: int = 1, pause: float = 0.0):
        super().__init__()
        self.at, self.sig, self.times, self.pause = at, sig, times, pause

    def on_train_batch_end(self, batch, logs=None):
        if self.model.train_step_count == self.at:
            now, group = time.time(), os.getpgrp()  # the group: to check what outlives us
            print(f"SIGNAL {self.sig} at step {self.at} t={now:.3f} group={group}", flush=True)
            for _ in range(self.times):
                os.kill(os.getpid(), self.sig)
            time.sleep(self.pause)  # a multi-process sync point needs its peers' counters


class NativeThrow(phalanx.callbacks.Callback):
    """Throws a C++ exception that nothing catches, on a native call of its own thread, after
    global step `at`: what Gloo's threads do when a peer's connection breaks."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at

    def on_train_batch_end(self, batch, logs=None):
        if self.model.train_step_count == self.at:
            throw = ctypes.CDLL("libstdc++.so.6")._ZSt21__throw_runtime_errorPKc
            print(f"NATIVE THROW at step {self.at}", flush=True)
            threading.Thread(target=throw, args=(b"Connection reset by peer",)).start()


def fit(callbacks, epochs=3):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 6)).astype(np.float32)
    y = np.abs(x[:, :3]).argmax(1).astype(np.int32)
    ds = phalanx.data.Dataset.from_tensor_slices((x, y)).shuffle(256, seed=3).batch(16)
    with phalanx.Strategy().scope():
        model = phalanx.Model(MLP(nnx.Rngs(0)))
        model.compile(
            optimizer=optax.adam(1e-2),
            loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    model.fit(ds, epochs=epochs, verbose=0, callbacks=callbacks)
    return model


def save(model, path: Path) -> None:
    weights = {f"w{i}": np.asarray(w) for i, w in enumerate(model.get_weights())}
    np.savez(path, step=model.train_step_count, **weights)


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    target = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    me = jax.process_index()
    mine = me == target
    backup = phalanx.callbacks.BackupAndRestore(out / "backup")
    pause = 3.0 if jax.process_count() > 1 else 0.0
    if mode in ("reference", "preempt"):
        save(fit([]), out / f"reference-{me}.npz")
    if mode == "preempt":
        fit([backup, Signal(SIGNAL_AT, signal.SIGTERM, pause=pause)] if mine else [backup])
    elif mode == "resume":
        save(fit([backup]), out / f"resumed-{me}.npz")
    elif mode in ("no-backup", "twice"):
        times = 2 if mode == "twice" else 1
        fit([Signal(SIGNAL_AT, signal.SIGTERM, times=times, pause=pause)] if mine else [])
    elif mode in ("die", "die-native"):
        other = [NativeThrow(SIGNAL_AT)] if mode == "die-native" else []
        fit([Signal(SIGNAL_AT, signal.SIGKILL)] if mine else other, epochs=1000)
    print(f"pods_script {mode} returned normally", flush=True)


if __name__ == "__main__":
    main()
