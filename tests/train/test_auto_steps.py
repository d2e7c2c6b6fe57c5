"""steps_per_execution='auto' (issue 43): the first training calls measure K single calls
against K steps in one scan, and the faster mode is kept (`feeding/trial.py`)."""

import jax
import numpy as np
import pytest
from flax import nnx

import phalanx
from phalanx._src.train.engine.execution import LOOP, SCAN
from phalanx._src.train.feeding import dispatch
from phalanx._src.train.feeding.trial import SAMPLES, Trial


def test_the_trial_keeps_the_mode_with_the_faster_step():
    trial = Trial()
    assert trial.mode() == LOOP  # single calls first
    # A first call may compile: an item of one call is not timed, nor is the first scan.
    assert trial.watch(LOOP, calls=1, steps=1) is None
    assert trial.watch(SCAN, calls=1, steps=5) is None
    for seconds in (3e-3, 2e-3):
        trial.measured(LOOP, seconds)
    assert trial.mode() == SCAN  # the single calls are timed: scans next
    for seconds in (9e-3, 2.5e-3):
        trial.measured(SCAN, seconds)
    assert trial.decided is None  # one more scan to time
    trial.measured(SCAN, 2.1e-3)  # each mode's fastest item counts: 2.0 < 2.1 ms
    assert trial.decided == LOOP and trial.mode() == LOOP
    assert trial.watch(LOOP, calls=5, steps=1) is None  # nothing more is timed


def test_the_trial_goes_on_to_scans_when_single_calls_cannot_be_timed():
    trial = Trial()
    trial.note_made(LOOP, 2 * SAMPLES[LOOP])  # items of one call each: none timed
    assert trial.mode() == SCAN


class _MLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(8, 16, rngs=rngs)
        self.l2 = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def _fit(k, epochs, monkeypatch=None, slower=None):
    modes = []
    if monkeypatch is not None:
        real_bind = dispatch.Runner.bind

        def bind(self, item, queued=None):
            if self.phase == "train":
                modes.append(item[0])
            return real_bind(self, item, queued)

        monkeypatch.setattr(dispatch.Runner, "bind", bind)
    if slower is not None:  # what the trial measures, as if `slower`'s steps took longer
        real = Trial.measured
        monkeypatch.setattr(
            Trial, "measured", lambda self, m, s: real(self, m, s * (100 if m == slower else 1))
        )
    with phalanx.Strategy().scope():
        model = phalanx.Model(_MLP(nnx.Rngs(0)))
        loss = phalanx.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile("adam", loss, steps_per_execution=k)
    rng = np.random.default_rng(0)
    n = 4 * jax.device_count()
    x = rng.normal(size=(n * 10, 8)).astype(np.float32)
    y = x[:, :3].argmax(1).astype(np.int32)
    ds = phalanx.data.Dataset.from_tensor_slices((x, y)).repeat().batch(n)
    history = model.fit(ds, epochs=epochs, steps_per_epoch=10, verbose=0)
    return history.history, model, modes


@pytest.mark.multidevice
@pytest.mark.parametrize("slower", [SCAN, LOOP])
def test_auto_keeps_the_faster_mode_with_the_numbers_of_single_steps(monkeypatch, slower):
    want, single, _ = _fit(1, epochs=8)
    got, model, modes = _fit("auto", epochs=8, monkeypatch=monkeypatch, slower=slower)
    trial = model.engine.cache["trial"]
    kept = LOOP if slower == SCAN else SCAN
    assert trial.decided == kept
    # Two items of single calls, scans until every mode was timed, then the kept mode only.
    assert modes[:2] == [LOOP, LOOP] and SCAN in modes
    decided_at = 2 + SAMPLES[SCAN] + 1  # (the first scan compiles: not timed)
    assert set(modes[decided_at:]) == {kept}
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    for a, b in zip(model.get_weights(), single.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # Whatever the mode, the data crossed once (the layouts change on the devices): later,
    # at most the scans' first position.
    assert max(got["host_to_device_mib"][1:]) <= 4 * jax.device_count() / 2**20


def test_a_set_k_runs_no_trial():
    _, model, _ = _fit(5, epochs=2)
    assert "trial" not in model.engine.cache
