"""`phalanx doctor`: what hardware this machine offers and what phalanx would do with it."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform as _platform
import sys
from typing import Any

HELP = "show the resolved platform, devices, processes and library versions"
# Distributions reported; optional ones appear only when installed.
REQUIRED_PACKAGES = ("phalanx", "jax", "jaxlib", "flax", "optax", "numpy")
OPTIONAL_PACKAGES = ("grain", "orbax-checkpoint")


def configure(parser: argparse.ArgumentParser) -> None:
    """Add doctor's arguments to its subparser."""
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--platform",
        default=None,
        help="force a platform (tpu, gpu, cpu, auto) as PHALANX_PLATFORM would",
    )


def versions() -> dict[str, str | None]:
    """Return installed versions: python, required packages (None if missing), optional ones."""
    found: dict[str, str | None] = {"python": _platform.python_version()}
    for name in REQUIRED_PACKAGES + OPTIONAL_PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            if name in REQUIRED_PACKAGES:
                found[name] = None
    return found


def collect(platform: str | None = None) -> dict[str, Any]:
    """Resolve the topology and return the doctor's report as JSON-ready values.

    Resolution is the same as `phalanx.cluster.resolve(platform)`: inside a multi-process job
    (PHALANX_* variables, SLURM, ...) this joins the job, so run it on every process.

    Args:
      platform: a platform to force, or None for PHALANX_PLATFORM / automatic.

    Returns:
      A dict with "topology", "platform", "fallback", "mode", "cluster_env",
      "default_strategy_replicas" and "versions".

    Example:
      >>> collect()["default_strategy_replicas"]
      8
    """
    from phalanx._src.cluster.resolve import resolve

    topology = resolve(platform)
    choice = topology.platform_choice
    return {
        "topology": topology.to_dict(),
        "summary": topology.summary(),
        "platform": choice.to_dict() if choice else None,
        "fallback": choice.fallback if choice else None,
        "mode": "multi-process" if topology.multi_process else "single-process",
        "cluster_env": topology.cluster_env,
        # A default Strategy is data parallel with one replica per device of every process.
        "default_strategy_replicas": topology.global_device_count,
        "versions": versions(),
    }


def format_text(report: dict[str, Any]) -> str:
    """Return the report as the aligned text `phalanx doctor` prints."""
    topo, choice = report["topology"], report["platform"] or {}
    memory = topo["memory_per_device_bytes"]
    replicas = report["default_strategy_replicas"]
    if topo["multi_process"]:
        processes = (
            f"multi-process: process {topo['process_index']} of {topo['process_count']} "
            f"(started by {report['cluster_env']})"
        )
    else:
        processes = "single process (no multi-process settings or cluster environment found)"
    rows = [
        ("platform", f"{topo['platform']}: {choice.get('reason', '')}"),
        ("available", ", ".join(choice.get("available", [])) or "?"),
        ("fallback", report["fallback"] or "none"),
        (
            "devices",
            f"{topo['local_device_count']} local / {topo['global_device_count']} global x "
            f"{topo['device_kind']}",
        ),
        ("memory/device", "unknown" if memory is None else f"{memory / 2**30:.1f} GiB"),
        ("processes", processes),
        (
            "strategy",
            f"a default Strategy would have {replicas} replica{'s' * (replicas != 1)} "
            f"(data parallel, one per {topo['platform']} device)",
        ),
        (
            "versions",
            ", ".join(f"{k} {v or 'not installed'}" for k, v in report["versions"].items()),
        ),
    ]
    width = max(len(key) for key, _ in rows)
    return "\n".join(["phalanx doctor"] + [f"  {key:<{width}}  {value}" for key, value in rows])


def run(args: argparse.Namespace) -> int:
    """Print the report; exit 2 when the settings are invalid."""
    try:
        report = collect(args.platform)
    except (ValueError, RuntimeError) as error:
        print(f"phalanx doctor: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else format_text(report))
    return 0
