"""Training curves as a matplotlib figure: loss and every metric, train and validation.

matplotlib (the `plot` extra) is imported only inside `plot_history`, when a picture is
asked for, so training never pays for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# Speed, utilisation and transfer logs describe the machine, not the model's learning; they
# are not drawn unless asked for by name.
SPEED_KEYS = frozenset(
    {
        "examples_per_second",
        "input_wait_fraction",
        "model_tflops_per_second",
        "mfu",
        "lr",
        "host_to_device_mib",
        "host_to_device_arrays",
        "device_to_host_mib",
        "device_to_host_arrays",
    }
)


def curve_names(history: Mapping[str, Sequence[Any]]) -> list[str]:
    """The panels to draw: each metric once (its 'val_' twin shares the panel), loss first.

    Example:
      >>> curve_names({"accuracy": [.9], "loss": [.3], "val_loss": [.4], "mfu": [.5]})
      ['loss', 'accuracy']
    """
    names = {k.removeprefix("val_") for k in history if k.removeprefix("val_") not in SPEED_KEYS}
    return sorted(names, key=lambda k: (k != "loss", k))


def plot_history(
    history: Mapping[str, Sequence[Any]],
    epochs: Sequence[int] | None = None,
    *,
    keys: Sequence[str] | None = None,
    title: str | None = None,
) -> Any:
    """Draws per-epoch logs, one panel per metric with its training and validation curves.

    Args:
      history: metric name -> per-epoch values (`History.history`, or a run's CSV).
      epochs: the epoch index of each value (0-based); default 0, 1, 2, ...
      keys: the metrics to draw (without 'val_'); default: `curve_names(history)`.
      title: the figure's title.

    Returns:
      A `matplotlib.figure.Figure` (save it with `figure.savefig("curves.png")`).

    Raises:
      ImportError: matplotlib is not installed (`pip install "phalanx[plot]"`).
      ValueError: nothing to draw.

    Example:
      >>> figure = plot_history({"loss": [0.5, 0.3], "val_loss": [0.6, 0.4]})
      >>> figure.savefig("curves.png")
    """
    names = list(keys) if keys is not None else curve_names(history)
    names = [n for n in names if n in history or f"val_{n}" in history]
    if not names:
        raise ValueError(
            f"nothing to plot: the history has {sorted(history)}; train for at least one "
            "epoch, or pass keys= with names it holds"
        )
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise ImportError(
            'plotting needs matplotlib; install it with pip install "phalanx[plot]"'
        ) from None
    columns = min(3, len(names))
    rows = math.ceil(len(names) / columns)
    # A Figure made directly (not through pyplot) needs no GUI backend and is not kept alive
    # by pyplot's registry of open figures.
    figure = Figure(figsize=(4.5 * columns, 3.2 * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, name in zip(axes, names, strict=False):
        for key, label, style in ((name, "train", "-o"), (f"val_{name}", "validation", "--s")):
            values = [float(v) for v in history.get(key, [])]
            if not values:
                continue
            xs = [e + 1 for e in epochs[-len(values) :]] if epochs else range(1, len(values) + 1)
            ax.plot(list(xs), values, style, markersize=3, label=label)
        ax.set_title(name)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend()
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    if title:
        figure.suptitle(title)
    return figure
