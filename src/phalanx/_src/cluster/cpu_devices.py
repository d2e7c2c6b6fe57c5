"""How many CPU devices each process gets (fake devices for tests and CPU data parallelism).

XLA:CPU can split one host into N devices so that data-parallel code, meshes and collectives
run without accelerators. The count must be set before JAX starts its backend; `resolve()`
applies it through `jax.config.update("jax_num_cpu_devices", n)`, which beats
`XLA_FLAGS=--xla_force_host_platform_device_count`.
"""

from __future__ import annotations

from collections.abc import Mapping

from phalanx._src.cluster.env_values import check_int, read_int

CPU_DEVICES_ENV = "PHALANX_CPU_DEVICES"


def cpu_device_count(cpu_devices: int | None, environ: Mapping[str, str]) -> int | None:
    """Return the requested CPU devices per process: the argument, else PHALANX_CPU_DEVICES.

    Args:
      cpu_devices: the `cpu_devices` argument of `resolve()`, or None.
      environ: the environment holding PHALANX_CPU_DEVICES.

    Returns:
      The count (>= 1), or None to keep JAX's default.

    Raises:
      ValueError, TypeError: the value is not a whole number >= 1.

    Example:
      >>> cpu_device_count(None, {"PHALANX_CPU_DEVICES": "4"})
      4
    """
    if cpu_devices is not None:
        return check_int(cpu_devices, "cpu_devices", minimum=1)
    return read_int(environ, CPU_DEVICES_ENV, minimum=1)
