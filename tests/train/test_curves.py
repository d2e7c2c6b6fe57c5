"""Training curves: History.plot(), `phalanx report` from a CSV or TensorBoard logs."""

import subprocess
import sys

import pytest

from phalanx._src.cli.main import main
from phalanx._src.report import curves, run_logs
from phalanx.callbacks import CSVLogger, History, TensorBoard

EPOCHS = [
    {"loss": 0.9, "accuracy": 0.6, "val_loss": 1.0, "val_accuracy": 0.55, "mfu": 0.1},
    {"loss": 0.5, "accuracy": 0.8, "val_loss": 0.7, "val_accuracy": 0.7, "mfu": 0.1},
    {"loss": 0.3, "accuracy": 0.9, "val_loss": 0.6, "val_accuracy": 0.75, "mfu": 0.1},
]


def _drive(callback):
    callback.set_params({"epochs": len(EPOCHS), "steps": 2})
    callback.on_train_begin()
    for epoch, logs in enumerate(EPOCHS):
        callback.on_epoch_begin(epoch)
        callback.on_epoch_end(epoch, dict(logs))
    callback.on_train_end()
    return callback


def _panels(figure):
    return {
        ax.get_title(): {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
        for ax in figure.axes
        if ax.get_visible()
    }


def test_history_plot_draws_every_metric_train_and_validation():
    figure = _drive(History()).plot(title="run")
    assert _panels(figure) == {
        "loss": {"train": [0.9, 0.5, 0.3], "validation": [1.0, 0.7, 0.6]},
        "accuracy": {"train": [0.6, 0.8, 0.9], "validation": [0.55, 0.7, 0.75]},
    }
    assert list(figure.axes[0].get_lines()[0].get_xdata()) == [1, 2, 3]  # epochs from 1
    assert _panels(_drive(History()).plot(keys=["mfu"])) == {"mfu": {"train": [0.1] * 3}}
    with pytest.raises(ValueError, match="nothing to plot"):
        History().plot()


@pytest.mark.parametrize("logger", ["csv", "tensorboard"])
def test_report_renders_a_runs_logs(tmp_path, logger, capsys):
    if logger == "csv":
        _drive(CSVLogger(tmp_path / "history.csv"))
    else:
        _drive(TensorBoard(tmp_path / "tensorboard"))
    history = run_logs.read_history(tmp_path)
    assert history["val_accuracy"] == pytest.approx([0.55, 0.7, 0.75])
    assert history["loss"] == pytest.approx([0.9, 0.5, 0.3])
    assert main(["report", str(tmp_path)]) == 0
    assert f"training curves: {tmp_path / 'curves.png'}" in capsys.readouterr().out
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_report_without_logs_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no training logs in" in capsys.readouterr().err


def test_curve_names_put_loss_first_and_leave_out_speed():
    names = curves.curve_names({"val_auc": [], "loss": [], "examples_per_second": [], "auc": []})
    assert names == ["loss", "auc"]


def test_importing_and_training_never_import_matplotlib():
    code = (
        "import sys, numpy as np, phalanx\n"
        "from flax import nnx\n"
        "m = phalanx.Model(nnx.Linear(2, 1, rngs=nnx.Rngs(0)))\n"
        "m.compile('sgd', 'mse')\n"
        "m.fit(np.zeros((8, 2), np.float32), np.zeros((8, 1), np.float32), verbose=2)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'mkdocs'))\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
