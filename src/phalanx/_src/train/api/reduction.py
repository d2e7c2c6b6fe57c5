"""`Reduction`: TF's `tf.keras.losses.Reduction` names, for the losses' `reduction=`."""

from __future__ import annotations

import enum


class Reduction(enum.StrEnum):
    """How a loss reduces its per-example values: TF's `tf.keras.losses.Reduction`.

    Each member is the string Keras 3 uses (`Reduction.NONE == "none"`), so either form
    works in `reduction=`, except `AUTO`: TF's "decided by the context" means, as in TF
    outside a strategy, `SUM_OVER_BATCH_SIZE`; inside `strategy.run` that is the replica's
    share of the global-batch mean (TF refuses AUTO there; phalanx gives the number TF's
    docs recommend instead). Keras 3 dropped the string 'auto', and so do phalanx's losses:
    only the member is accepted.

    Example:
      >>> loss_object = phalanx.losses.SparseCategoricalCrossentropy(
      ...     from_logits=True, reduction=phalanx.losses.Reduction.NONE)
    """

    AUTO = "auto"
    NONE = "none"
    SUM = "sum"
    SUM_OVER_BATCH_SIZE = "sum_over_batch_size"
