"""Peak memory of this process: host (resident set) and devices (where the backend tells).

`phalanx train` and the benchmarks print both. The host figure is the operating system's
high-water mark of the process's resident memory (`getrusage`), so it covers everything
the process ever held, from start. The device figure is the sum over this process's
devices of `peak_bytes_in_use` from `device.memory_stats()`; XLA:CPU reports no memory
statistics (its "devices" live in host memory, which the host figure then includes), so
there it is None, printed as "n/a".

Example:
  >>> peak_host_mib() > 0
  True
  >>> describe(peak_host_mib(), peak_device_mib())
  'peak host memory 812 MiB, peak device memory n/a'
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Iterable
from typing import Any

MIB = 2**20


def peak_host_mib() -> float:
    """The process's peak resident memory so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / MIB if sys.platform == "darwin" else peak / 1024


def peak_device_mib(devices: Iterable[Any] | None = None) -> float | None:
    """The sum of the devices' peak allocated memory in MiB (default: this process's
    devices), or None when a device reports no statistics (XLA:CPU)."""
    if devices is None:
        import jax

        devices = jax.local_devices()
    total = 0
    for device in devices:
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        if not stats or "peak_bytes_in_use" not in stats:
            return None
        total += stats["peak_bytes_in_use"]
    return total / MIB


def describe(host_mib: float, device_mib: float | None) -> str:
    """'peak host memory 812 MiB, peak device memory 1,024 MiB' (or 'n/a')."""
    device = "n/a" if device_mib is None else f"{device_mib:,.0f} MiB"
    return f"peak host memory {host_mib:,.0f} MiB, peak device memory {device}"
