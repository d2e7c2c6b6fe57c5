"""`phalanx report RUN_DIR`: a run's training curves as a PNG, from its CSV or TensorBoard logs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "draw a run's training curves (from its CSV or TensorBoard logs) into a PNG"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add report's arguments to its subparser."""
    parser.add_argument(
        "run_dir", help="a run directory (as `phalanx train` prints), a CSV, or a log folder"
    )
    parser.add_argument(
        "--output",
        default=None,
        help="the PNG to write (default: RUN_DIR/curves.png, or beside a CSV file)",
    )
    parser.add_argument(
        "--metrics", default=None, help="comma-separated metrics to draw (default: all)"
    )


def run(args: argparse.Namespace) -> int:
    """Read the logs, draw, save; print the PNG's path. 2 when there is nothing to draw."""
    from phalanx._src.report.curves import plot_history
    from phalanx._src.report.run_logs import read_history

    source = Path(args.run_dir)
    try:
        history = read_history(source)
        keys = args.metrics.split(",") if args.metrics else None
        folder = source.resolve()
        title = folder.parent.name if folder.name == "tensorboard" else folder.name
        figure = plot_history(history, keys=keys, title=title)
    except (FileNotFoundError, ValueError, ImportError) as error:
        print(f"phalanx report: error: {error}", file=sys.stderr)
        return 2
    if args.output:
        output = Path(args.output)
    else:
        output = source.with_suffix(".png") if source.is_file() else source / "curves.png"
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=100)
    epochs = max(len(v) for v in history.values())
    print(f"{epochs} epoch(s) of {', '.join(sorted(history))}")
    print(f"training curves: {output}")
    return 0
