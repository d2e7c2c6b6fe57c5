"""The seed a shuffle uses when the user gives none.

Keras draws it from NumPy's global generator, so `keras.utils.set_random_seed(s)` (or
`np.random.seed(s)`) makes a run's order reproducible; phalanx does the same, and with
several processes every process takes process 0's draw, so that they shuffle alike and each
reads its share of the same batches.
"""

from __future__ import annotations

import jax
import numpy as np


def default_seed() -> int:
    """A shuffle seed from NumPy's global generator; process 0's with several processes.

    Example:
      >>> np.random.seed(0); a = default_seed()
      >>> np.random.seed(0); a == default_seed()
      True
    """
    seed = np.int32(np.random.randint(2**31 - 1))
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        seed = multihost_utils.broadcast_one_to_all(seed)
    return int(seed)
