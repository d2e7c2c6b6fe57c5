"""InputWaitMeter with injected timings: exact fractions and one warning, never two."""

from __future__ import annotations

import warnings

import pytest

from phalanx.data import InputBoundWarning, InputWaitMeter


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run_epoch(meter: InputWaitMeter, clock: FakeClock, wait: float, step: float, steps: int):
    for _ in range(steps):
        with meter.waiting():
            clock.now += wait
        clock.now += step
        meter.step_done()


def test_fraction_and_summary_golden():
    clock = FakeClock()
    meter = InputWaitMeter(clock=clock)
    run_epoch(meter, clock, wait=0.25, step=0.75, steps=4)  # no warning: filterwarnings=error
    assert meter.wait_fraction == pytest.approx(0.25)
    with pytest.warns(InputBoundWarning):
        summary = meter.epoch_summary()
    assert summary == pytest.approx(
        {
            "input_wait_s": 1.0,
            "wall_s": 4.0,
            "input_wait_fraction": 0.25,
            "steps": 4,
            "input_wait_per_step_s": 0.25,
        }
    )


def test_below_the_threshold_no_warning():
    clock = FakeClock()
    meter = InputWaitMeter(clock=clock)
    run_epoch(meter, clock, wait=0.09, step=0.91, steps=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = meter.epoch_summary()
    assert summary["input_wait_fraction"] == pytest.approx(0.09)


def test_one_warning_naming_the_fixes_over_many_input_bound_epochs():
    clock = FakeClock()
    meter = InputWaitMeter(clock=clock)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            run_epoch(meter, clock, wait=0.5, step=0.5, steps=3)
            assert meter.epoch_summary()["input_wait_fraction"] == pytest.approx(0.5)
    bound = [w for w in caught if issubclass(w.category, InputBoundWarning)]
    assert len(bound) == 1
    message = str(bound[0].message)
    assert "50%" in message and "3.0 s" in message
    for fix in ("num_parallel_calls", "cache()", "prefetch", "vectorised source"):
        assert fix in message


def test_an_input_bound_epoch_after_a_healthy_one_warns():
    clock = FakeClock()
    meter = InputWaitMeter(threshold=0.2, clock=clock)
    run_epoch(meter, clock, wait=0.1, step=0.9, steps=5)
    meter.epoch_summary()
    run_epoch(meter, clock, wait=0.3, step=0.7, steps=5)
    with pytest.warns(InputBoundWarning, match="30%"):
        assert meter.epoch_summary()["input_wait_fraction"] == pytest.approx(0.3)


def test_epochs_are_measured_separately_and_start_epoch_counts_setup_time():
    clock = FakeClock()
    meter = InputWaitMeter(clock=clock)
    meter.start_epoch()
    clock.now += 9.0  # e.g. compiling before the first batch is requested
    run_epoch(meter, clock, wait=0.5, step=0.5, steps=1)
    assert meter.epoch_summary()["wall_s"] == pytest.approx(10.0)
    clock.now += 50.0  # time between epochs (evaluation) is not part of the next one
    run_epoch(meter, clock, wait=0.0, step=1.0, steps=2)
    summary = meter.epoch_summary()
    assert summary["wall_s"] == pytest.approx(2.0) and summary["input_wait_s"] == 0.0


def test_an_epoch_with_no_steps():
    meter = InputWaitMeter(clock=FakeClock())
    assert meter.wait_fraction == 0.0
    assert meter.epoch_summary()["input_wait_fraction"] == 0.0


def test_wait_is_counted_even_when_next_raises():
    clock = FakeClock()
    meter = InputWaitMeter(clock=clock)
    with pytest.raises(StopIteration), meter.waiting():
        clock.now += 2.0
        raise StopIteration
    clock.now += 2.0
    assert meter.wait_fraction == pytest.approx(0.5)


@pytest.mark.parametrize("threshold", [0.0, 1.0, -0.1])
def test_bad_threshold(threshold):
    with pytest.raises(ValueError, match="threshold must be in"):
        InputWaitMeter(threshold=threshold)


def test_short_epochs_report_but_never_warn():
    clock = FakeClock()
    meter = InputWaitMeter(clock=clock, min_epoch_seconds=1.0)
    run_epoch(meter, clock, wait=0.05, step=0.05, steps=5)  # 0.5 s, half of it waiting
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = meter.epoch_summary()
    assert summary["input_wait_fraction"] == pytest.approx(0.5)
    run_epoch(meter, clock, wait=0.12, step=0.12, steps=5)  # 1.2 s: now it counts
    with pytest.warns(InputBoundWarning, match="steps_per_execution"):
        meter.epoch_summary()
