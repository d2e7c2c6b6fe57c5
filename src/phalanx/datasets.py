"""Small datasets, offline first: `phalanx.datasets.mnist.load_data()`, and the digits
shipped inside the package, `phalanx.datasets.digits.load_data()`."""

from __future__ import annotations

from phalanx._src.datasets import digits as digits
from phalanx._src.datasets import mnist as mnist

__all__ = [
    "digits",
    "mnist",
]
