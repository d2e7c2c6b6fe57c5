"""TF device strings as JAX devices: `Strategy(devices=["/gpu:0", "/gpu:1"])`.

TF names a device by a string: `/gpu:0`, `/CPU:0`, `GPU:1`, `/device:GPU:0`, or fully
`/job:localhost/replica:0/task:0/device:CPU:0`. The type is the JAX platform (CPU, GPU,
TPU); the index counts that platform's devices of one process, as TF counts a machine's
GPUs; `task:<k>` names the process (`jax.process_index() == k`), and without it the string
means this process's device, as in TF. The job name is not checked (JAX has no jobs). A
string for a platform or index that is not there raises a ValueError listing what is.

Example:
  >>> resolve(["/cpu:0", "/device:CPU:1"])
  [CpuDevice(id=0), CpuDevice(id=1)]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import jax

_SPEC = re.compile(
    r"(?:/job:(?P<job>[^/]+))?"
    r"(?:/replica:(?P<replica>\d+))?"
    r"(?:/task:(?P<task>\d+))?"
    r"(?:/?device:|/)?"
    r"(?P<type>cpu|gpu|tpu)(?::(?P<index>\d+))?",
    re.IGNORECASE,
)
_EXAMPLE = "'/gpu:0', '/cpu:1', '/device:GPU:0' or '/job:localhost/replica:0/task:0/device:CPU:0'"


def parse(spec: str) -> tuple[str, int, int | None]:
    """A TF device string as (platform, index, process or None for this one).

    Raises:
      ValueError: for a string that is not a TF device name, or a replica other than 0.
    """
    match = _SPEC.fullmatch(spec.strip())
    if match is None:
        raise ValueError(
            f"Strategy got the device string {spec!r}, which is not a TF device name; use "
            f"{_EXAMPLE}, or pass jax.Device objects (jax.devices())"
        )
    if match["replica"] not in (None, "0"):
        raise ValueError(
            f"Strategy got {spec!r}: replica:{match['replica']} names another TF replica "
            "group, which JAX does not have; name the process with task:<k> (its "
            "jax.process_index()), e.g. '/job:worker/replica:0/task:1/device:GPU:0'"
        )
    task = None if match["task"] is None else int(match["task"])
    return match["type"].lower(), int(match["index"] or 0), task


def _platform_devices(platform: str) -> list[Any]:
    try:
        return list(jax.devices(platform))
    except RuntimeError:  # JAX: "Unknown backend" or "Backend 'gpu' failed to initialize"
        return []


def _platforms() -> str:
    found = []
    for platform in ("cpu", "gpu", "tpu"):
        devices = _platform_devices(platform)
        if devices:
            found.append(f"{platform} ({len(devices)} devices)")
    return ", ".join(found) or "none"


def resolve_one(
    spec: str,
    lookup: Callable[[str], list[Any]] = _platform_devices,
    process: int | None = None,
) -> Any:
    """The JAX device a TF device string names.

    Args:
      spec: the TF device string.
      lookup: platform -> that platform's devices (global, every process's).
      process: this process's index (default `jax.process_index()`).

    Raises:
      ValueError: naming the string and the devices there are, when it names none.
    """
    platform, index, task = parse(spec)
    me = jax.process_index() if process is None else process
    owner = me if task is None else task
    devices = sorted((d for d in lookup(platform) if d.process_index == owner), key=lambda d: d.id)
    if index < len(devices):
        return devices[index]
    if not lookup(platform):
        raise ValueError(
            f"Strategy got the device {spec!r}, but JAX sees no {platform.upper()} on this "
            f"machine (platforms: {_platforms()}); name a device of a platform that is there, "
            f"e.g. '/cpu:0', or install JAX for that platform (jax[cuda12] for GPUs)"
        )
    where = "this process" if task is None else f"process {task}"
    raise ValueError(
        f"Strategy got the device {spec!r}, but {where} has {len(devices)} "
        f"{platform.upper()} device(s) (indices 0..{len(devices) - 1}); use an index below "
        f"{len(devices)}, e.g. '/{platform}:0'"
    )


def resolve(devices: Sequence[Any] | None) -> list[Any]:
    """The strategy's devices: all of them for None, TF strings resolved, Devices as given.

    Raises:
      ValueError: for a string that names no device, or devices of several platforms.
      TypeError: for an entry that is neither a string nor a `jax.Device`.
    """
    if devices is None:
        return list(jax.devices())
    if isinstance(devices, str | jax.Device):
        devices = [devices]
    out = []
    for device in devices:
        if isinstance(device, str):
            out.append(resolve_one(device))
        elif isinstance(device, jax.Device):
            out.append(device)
        else:
            raise TypeError(
                f"Strategy(devices=...) takes jax.Device objects or TF device strings "
                f"({_EXAMPLE}); got {device!r} of type {type(device).__name__}"
            )
    platforms = sorted({d.platform for d in out})
    if len(platforms) > 1:
        raise ValueError(
            f"Strategy got devices of several platforms ({', '.join(platforms)}): "
            f"{[str(d) for d in out]}; a strategy's replicas run one program, so use devices "
            "of one platform, e.g. devices=['/gpu:0', '/gpu:1']"
        )
    return out
