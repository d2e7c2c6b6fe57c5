"""Callbacks driven by a small fake loop and a fake model (the model contract, nothing more)."""

from __future__ import annotations

import csv
import io
import math
import os
import re
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phalanx import callbacks
from phalanx._src.train.api.callbacks import live_bar
from phalanx._src.train.api.callbacks.tensorboard import import_tensorboardx


class FakeModel:
    """What the callbacks may use: stop_training, learning_rate, get/set_weights, history."""

    def __init__(self, learning_rate=0.1):
        self.stop_training = False
        self.weights = [np.zeros(2)]
        self._learning_rate = learning_rate
        self.history = None

    def get_weights(self):
        return [w.copy() for w in self.weights]

    def set_weights(self, weights):
        self.weights = [np.array(w) for w in weights]

    @property
    def learning_rate(self):
        return self._learning_rate

    @learning_rate.setter
    def learning_rate(self, value):
        self._learning_rate = value


def fake_fit(cbs, model, epoch_logs, steps=4, batch_logs=None):
    """The loop's side of the contract, as the lead's fit will run it."""
    cbl = callbacks.CallbackList(
        cbs, add_history=True, model=model, epochs=len(epoch_logs), steps=steps, verbose=0
    )
    cbl.on_train_begin()
    for epoch, logs in enumerate(epoch_logs):
        cbl.on_epoch_begin(epoch)
        if cbl.needs_batch_hooks("train"):
            every = cbl.batch_logs_interval("train")
            for batch in range(steps):
                cbl.on_train_batch_begin(batch)
                fresh = every is not None and (batch + 1) % every == 0
                cbl.on_train_batch_end(batch, (batch_logs or {"loss": 1.0}) if fresh else {})
        model.weights = [np.full(2, float(epoch))]  # "training" changes the weights
        cbl.on_epoch_end(epoch, dict(logs))
        if model.stop_training:
            break
    cbl.on_train_end()
    return cbl


class EpochOnly(callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        pass


class Recorder(callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.calls = []

    def on_batch_end(self, batch, logs=None):  # Keras's older name still counts
        self.calls.append((batch, logs))


def test_callback_list_detects_overridden_hooks():
    assert not callbacks.CallbackList([EpochOnly(), callbacks.History()]).needs_batch_hooks("train")
    assert callbacks.CallbackList([EpochOnly()]).batch_logs_interval("train") is None
    recorder = Recorder()
    cbl = callbacks.CallbackList([EpochOnly(), recorder])
    assert cbl.needs_batch_hooks("train") and cbl.batch_logs_interval("train") == 1
    assert not cbl.needs_batch_hooks("test") and not cbl.needs_batch_hooks("predict")
    assert recorder.implements("on_train_batch_end") and not recorder.implements("on_epoch_end")
    with pytest.raises(ValueError, match="mode must be one of"):
        cbl.needs_batch_hooks("eval")


class Exploding:
    """A log value that fails if anyone converts it: proves unused hooks cost nothing."""

    shape = ()

    def __float__(self):
        raise AssertionError("a hook nobody overrides converted (synced) the logs")


def test_hooks_nobody_overrides_never_touch_the_logs():
    cbl = callbacks.CallbackList([EpochOnly(), callbacks.History()])
    cbl.on_train_batch_end(0, {"loss": Exploding()})
    cbl.on_test_batch_end(0, {"loss": Exploding()})
    cbl.on_predict_batch_end(0, {"loss": Exploding()})
    recorder = Recorder()
    cbl.append(recorder)
    cbl.on_train_batch_end(3, {"loss": jnp.float32(0.5), "step": np.int32(7)})
    assert recorder.calls == [(3, {"loss": 0.5, "step": 7.0})]
    assert all(type(v) is float for v in recorder.calls[0][1].values())


def test_history_records_epochs_and_sets_model_history():
    model = FakeModel()
    cbl = fake_fit([], model, [{"loss": 0.5, "val_loss": 0.7}, {"loss": 0.25, "val_loss": 0.6}])
    history = cbl.history
    assert history.history == {"loss": [0.5, 0.25], "val_loss": [0.7, 0.6]}
    assert history.epoch == [0, 1]
    assert model.history is history


def test_csv_logger_writes_rows_and_appends_without_repeating_the_header(tmp_path):
    path = tmp_path / "logs" / "train.csv"
    fake_fit([callbacks.CSVLogger(path)], FakeModel(), [{"loss": 0.5, "acc": 0.75}])
    fake_fit([callbacks.CSVLogger(path, append=True)], FakeModel(), [{"loss": 0.25, "acc": 1.0}])
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["epoch", "acc", "loss", "val_acc", "val_loss"]
    assert rows[1:] == [["0", "0.75", "0.5", "NA", "NA"], ["0", "1.0", "0.25", "NA", "NA"]]


def test_early_stopping_patience_and_restore_best_weights():
    model = FakeModel()
    stopper = callbacks.EarlyStopping(patience=2, restore_best_weights=True)
    losses = [1.0, 0.9, 0.95, 0.97, 0.5]
    cbl = fake_fit([stopper], model, [{"val_loss": v} for v in losses])
    assert cbl.history.epoch == [0, 1, 2, 3]  # epoch 1 was best; two epochs without progress
    assert stopper.stopped_epoch == 3 and model.stop_training
    assert stopper.best == 0.9 and stopper.best_epoch == 1
    np.testing.assert_array_equal(model.weights[0], [1.0, 1.0])  # epoch 1's weights restored


def epochs_run(stopper, values, key):
    return fake_fit([stopper], FakeModel(), [{key: v} for v in values]).history.epoch


def test_early_stopping_mode_min_delta_baseline_and_warm_up():
    # mode='auto' knows accuracy goes up; the +0.005 step is below min_delta=0.01.
    accuracy = (0.5, 0.6, 0.605, 0.61, 0.62)
    stopper = callbacks.EarlyStopping("accuracy", min_delta=0.01, patience=1)
    assert epochs_run(stopper, accuracy, "accuracy") == [0, 1, 2]
    assert epochs_run(callbacks.EarlyStopping("accuracy", patience=1), accuracy, "accuracy") == [
        0,
        1,
        2,
        3,
        4,
    ]
    # A baseline that is never beaten keeps the wait from resetting.
    flat = (0.5, 0.6, 0.6, 0.6, 0.6)
    assert epochs_run(callbacks.EarlyStopping("acc", patience=2, mode="max"), flat, "acc") == [
        0,
        1,
        2,
        3,
    ]
    with_baseline = callbacks.EarlyStopping("acc", patience=2, mode="max", baseline=0.9)
    assert epochs_run(with_baseline, flat, "acc") == [0, 1, 2]
    # Warm-up epochs are not monitored at all.
    rising = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    assert epochs_run(callbacks.EarlyStopping("loss"), rising, "loss") == [0, 1]
    warm = callbacks.EarlyStopping("loss", start_from_epoch=3)
    assert epochs_run(warm, rising, "loss") == [0, 1, 2, 3, 4]


def test_early_stopping_errors_and_missing_monitor():
    with pytest.raises(ValueError, match="mode must be one of"):
        callbacks.EarlyStopping(mode="down")
    with pytest.raises(ValueError, match="pass mode='min' or mode='max'"):
        fake_fit([callbacks.EarlyStopping("f1_custom")], FakeModel(), [{"f1_custom": 1.0}])
    with pytest.warns(UserWarning, match="'val_loss', which is not in the logs"):
        fake_fit([callbacks.EarlyStopping()], FakeModel(), [{"loss": 1.0}])


def test_terminate_on_nan_stops_on_batch_or_epoch_logs(capsys):
    model = FakeModel()
    cbl = fake_fit([callbacks.TerminateOnNaN()], model, [{"loss": 1.0}] * 3, batch_logs={})
    assert not model.stop_training and cbl.history.epoch == [0, 1, 2]
    assert cbl.batch_logs_interval("train") is None  # it never forces a per-batch fetch
    model = FakeModel()
    cbl = callbacks.CallbackList([callbacks.TerminateOnNaN()], model=model)
    cbl.on_train_batch_end(5, {"loss": jnp.float32(jnp.nan)})
    assert model.stop_training
    model = FakeModel()
    fake_fit([callbacks.TerminateOnNaN()], model, [{"loss": math.inf}])
    assert model.stop_training
    assert "invalid loss" in capsys.readouterr().out


def test_learning_rate_scheduler_sets_and_logs_the_rate():
    model = FakeModel(learning_rate=0.1)
    seen = []

    def schedule(epoch, lr):
        seen.append(lr)
        return lr if epoch == 0 else lr * 0.5

    cbl = fake_fit([callbacks.LearningRateScheduler(schedule)], model, [{"loss": 1.0}] * 3)
    assert seen == [0.1, 0.1, 0.05]
    assert model.learning_rate == pytest.approx(0.025)
    assert cbl.history.history["learning_rate"] == pytest.approx([0.1, 0.05, 0.025])
    model = FakeModel()
    fake_fit([callbacks.LearningRateScheduler(lambda epoch: 0.01 * (epoch + 1))], model, [{}] * 2)
    assert model.learning_rate == pytest.approx(0.02)
    with pytest.raises(ValueError, match=r"must return a float learning rate, got '0\.1'"):
        fake_fit([callbacks.LearningRateScheduler(lambda e, lr: "0.1")], FakeModel(), [{}])


def read_scalars(folder):
    """(tag, step, value) triples from the TFRecord event files in `folder`."""
    import_tensorboardx()  # tensorboardX's import sets an environment variable; this does not
    from tensorboardX.proto import event_pb2

    out = []
    for name in sorted(os.listdir(folder)):
        data = (folder / name).read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            out += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    return out


def test_tensorboard_writes_readable_epoch_and_batch_scalars(tmp_path):
    board = callbacks.TensorBoard(tmp_path, update_freq=2)
    epochs = [{"loss": 0.5, "val_loss": 0.75}, {"loss": 0.25, "val_loss": 0.5}]
    cbl = fake_fit([board], FakeModel(), epochs, steps=4, batch_logs={"loss": 2.0})
    assert cbl.batch_logs_interval("train") == 2
    train = read_scalars(tmp_path / "train")
    assert [s for s in train if s[0] == "epoch_loss"] == [
        ("epoch_loss", 0, 0.5),
        ("epoch_loss", 1, 0.25),
    ]
    assert [s[1] for s in train if s[0] == "batch_loss"] == [2, 4, 6, 8]
    validation = read_scalars(tmp_path / "validation")
    assert validation == [("epoch_loss", 0, 0.75), ("epoch_loss", 1, 0.5)]
    by_epoch = callbacks.TensorBoard(tmp_path / "quiet")
    assert not callbacks.CallbackList([by_epoch]).needs_batch_hooks("train")
    with pytest.raises(ValueError, match="update_freq must be 'epoch' or a positive int"):
        callbacks.TensorBoard(tmp_path, update_freq=0)


def test_only_process_zero_writes_files(tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    fake_fit(
        [callbacks.TensorBoard(tmp_path / "tb"), callbacks.CSVLogger(tmp_path / "log.csv")],
        FakeModel(),
        [{"loss": 1.0}],
    )
    assert list(tmp_path.iterdir()) == []


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progbar_plain_line_per_epoch_when_not_a_terminal(capsys):
    logs = {
        "loss": 0.25,
        "accuracy": 0.5,
        "examples_per_second": 51234.0,
        "input_wait_fraction": 0.04,
    }
    cbl = callbacks.CallbackList([callbacks.ProgbarLogger()], epochs=2, steps=3, verbose=1)
    assert not cbl.needs_batch_hooks("train")  # captured stdout is not a terminal
    cbl.on_train_begin()
    for epoch in range(2):
        cbl.on_epoch_begin(epoch)
        cbl.on_epoch_end(epoch, logs)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2
    assert out[1].startswith("Epoch 2/2 - 3 steps - ")
    assert out[1].endswith("accuracy: 0.5000 - loss: 0.2500 - 51.2k examples/s - input wait 4%")
    silent = callbacks.CallbackList([callbacks.ProgbarLogger()], epochs=1, steps=3, verbose=0)
    silent.on_epoch_begin(0)
    silent.on_epoch_end(0, logs)
    assert capsys.readouterr().out == ""


def test_progbar_live_bar_on_a_terminal(monkeypatch):
    monkeypatch.setattr(live_bar, "REDRAW_SECONDS", 0.0)  # every update draws
    terminal = FakeTerminal()
    bar = callbacks.ProgbarLogger(stream=terminal)
    cbl = callbacks.CallbackList([bar], epochs=1, steps=4, verbose=1)
    # Fresh values about 50 times an epoch (here every batch); plain lines never ask.
    assert cbl.needs_batch_hooks("train") and cbl.batch_logs_interval("train") == 1
    cbl.on_epoch_begin(0)
    cbl.on_train_batch_end(0, {"loss": 1.5})
    cbl.on_train_batch_end(1, {})  # no fresh logs: the bar keeps the last ones
    cbl.on_epoch_end(0, {"loss": 1.0, "val_loss": 2.0})
    text = terminal.getvalue()
    # The live bar is rich's: redrawn in place (\r and ANSI codes), steps as "n/4".
    frames = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", f) for f in text.split("\r")]
    assert any(f.startswith("Epoch 1/1 ") and " 1/4 " in f for f in frames)
    assert any(" 2/4 " in f and f.rstrip().endswith("loss: 1.5000") for f in frames)
    assert sum("loss: 1.5000" in f for f in frames) == 2
    # When the epoch ends, the bar gives way to one plain summary line.
    assert frames[-1].startswith("Epoch 1/1 4/4 - ")
    assert text.endswith("loss: 1.0000 - val_loss: 2.0000\n")


def test_the_live_bar_redraws_at_most_every_redraw_interval(monkeypatch):
    monkeypatch.setattr(live_bar, "REDRAW_SECONDS", 3600.0)
    terminal = FakeTerminal()
    bar = live_bar.LiveBar(terminal, "Epoch 1/1", total=100, width=10)
    made = []
    for seen in range(1, 60):  # quick steps: only the first is drawn (and its text made)
        bar.update(seen, lambda seen=seen: made.append(seen) or f"loss {seen}")
    bar.update(100, "done")  # the last step always is
    frames = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", f) for f in terminal.getvalue().split("\r")]
    assert made == [1]
    assert any(" 1/100 " in f for f in frames) and any(" 100/100 " in f for f in frames)
    assert not any(" 59/100 " in f for f in frames)


def test_progbar_plain_lines_have_no_control_characters():
    for verbose, stream in ((2, FakeTerminal()), (1, io.StringIO())):
        cbl = callbacks.CallbackList(
            [callbacks.ProgbarLogger(stream=stream)], epochs=1, steps=2, verbose=verbose
        )
        cbl.on_train_begin()
        cbl.on_epoch_begin(0)
        cbl.on_train_batch_end(0, {"loss": 1.5})
        cbl.on_epoch_end(0, {"loss": 1.0, "model_tflops_per_second": 0.0123, "mfu": 0.41})
        cbl.on_train_end()
        line = stream.getvalue()
        assert line.count("\n") == 1 and not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", line)
        assert line.endswith("loss: 1.0000 - 0.0123 TFLOP/s - MFU 41.0%\n")
