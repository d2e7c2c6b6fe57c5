"""Which process may touch the file system: process 0 only (multi-host runs share disks)."""

from __future__ import annotations

import jax


def is_chief() -> bool:
    """True on the one process that writes logs and files (`jax.process_index() == 0`)."""
    return jax.process_index() == 0
