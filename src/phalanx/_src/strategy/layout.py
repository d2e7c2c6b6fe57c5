"""How a batch of rows is spread over consumers (replicas, or processes), as tf.distribute does.

tf.distribute gives each of N replicas ceil(B / N) rows of a batch of B, in replica order, so
trailing replicas are short or empty: `range(6).batch(4)` on 2 replicas gives `[0,1]|[2,3]`
then `[4]|[5]`, and `range(4).batch(4)` on 5 replicas gives `[0]|[1]|[2]|[3]|[]`. phalanx
keeps that spread and pads every replica's share to one compiled size.
"""

from __future__ import annotations

import numpy as np


def ceil_split(n: int, parts: int) -> list[tuple[int, int]]:
    """Splits rows `[0, n)` into `parts` contiguous ranges of ceil(n / parts) rows, in order.

    Args:
      n: number of rows, >= 0.
      parts: number of consumers, >= 1.

    Returns:
      `parts` half-open `(start, stop)` ranges; trailing ranges are short or empty.

    Raises:
      ValueError: for a negative `n` or `parts` < 1.

    Example:
      >>> ceil_split(7, 2)
      [(0, 4), (4, 7)]
      >>> ceil_split(4, 5)
      [(0, 1), (1, 2), (2, 3), (3, 4), (4, 4)]
    """
    if parts < 1:
        raise ValueError(f"cannot split rows over {parts} parts; use at least 1")
    if n < 0:
        raise ValueError(f"cannot split a negative number of rows ({n})")
    per = -(-n // parts)
    return [(min(i * per, n), min((i + 1) * per, n)) for i in range(parts)]


def rows_per_replica(batch_rows: int, num_replicas: int) -> int:
    """The per-replica size a batch of `batch_rows` compiles to: ceil(rows / replicas)."""
    return max(1, -(-batch_rows // num_replicas))


def padded_index(n: int, num_replicas: int, per_replica: int) -> tuple[np.ndarray, np.ndarray]:
    """Where each of `num_replicas * per_replica` padded slots takes its row from.

    Args:
      n: real rows in the batch.
      num_replicas: replicas the batch is spread over.
      per_replica: the compiled number of rows per replica.

    Returns:
      `(index, mask)`: `index[s]` is the source row of slot `s` (0 for a padded slot, so a
      pad repeats a real row and never injects NaN), `mask[s]` is True for real rows.

    Raises:
      ValueError: when `n` rows do not fit in `num_replicas * per_replica` slots.

    Example:
      >>> index, mask = padded_index(3, 2, 2)
      >>> index.tolist(), mask.tolist()
      ([0, 1, 2, 0], [True, True, True, False])
    """
    if -(-n // num_replicas) > per_replica:
        raise ValueError(
            f"a batch of {n} rows needs {-(-n // num_replicas)} rows per replica over "
            f"{num_replicas} replicas, but the step was compiled for {per_replica}; batches "
            "after the first may be smaller than the first, never larger"
        )
    index = np.zeros(num_replicas * per_replica, dtype=np.int64)
    mask = np.zeros(num_replicas * per_replica, dtype=bool)
    for r, (start, stop) in enumerate(ceil_split(n, num_replicas)):
        slot = r * per_replica
        index[slot : slot + stop - start] = np.arange(start, stop)
        mask[slot : slot + stop - start] = True
    return index, mask
