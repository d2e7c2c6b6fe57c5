"""Small datasets, offline first: `phalanx.datasets.mnist.load_data()`."""

from __future__ import annotations

from phalanx._src.datasets import mnist as mnist

__all__ = [
    "mnist",
]
