"""A dict batch without a key the model or step reads: the error lists the keys it has.

A TF program whose features are a dict (`{"a": ..., "b": ...}`) and whose model reads
`x["b"]` fails, when the dataset has no `"b"`, with a bare `KeyError: 'b'` from deep inside
the model. `strategy.run` and the model adapters behind `fit` re-raise it as a
`MissingKeyError` (still a `KeyError`) that also names the keys the batch does have.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_DEPTH = 3  # batch -> (features, labels) -> {name: array}


class MissingKeyError(KeyError):
    """A `KeyError` for a key a dict batch lacks, whose message lists the keys it has."""

    def __str__(self) -> str:  # KeyError's own quotes the whole message
        return str(self.args[0])


def _dicts(tree: Any, depth: int = 0) -> Iterator[dict]:
    if depth > _DEPTH:
        return
    if isinstance(tree, dict):
        yield tree
        values: Any = tree.values()
    elif isinstance(tree, (tuple, list)):
        values = tree
    else:
        return
    for value in values:
        yield from _dicts(value, depth + 1)


def explained(error: KeyError, inputs: Any, what: str) -> MissingKeyError | None:
    """The clearer error for `error` raised while reading `inputs`, or None when the
    missing key is in the batch's dicts (or the batch holds no dict): another cause."""
    if isinstance(error, MissingKeyError) or len(error.args) != 1:
        return None
    key = error.args[0]
    dicts = list(_dicts(inputs))
    try:
        if not dicts or any(key in d for d in dicts):
            return None
    except TypeError:  # an unhashable key: not a dict lookup of the batch
        return None
    keys = sorted({k for d in dicts for k in d}, key=str)
    return MissingKeyError(
        f"{what} reads the key {key!r}, which the batch does not have; the batch's dict "
        f"keys are {keys}. Name the feature as the dataset does, or add it to the dataset "
        "(e.g. dataset.map(lambda x, y: ({**x, 'name': ...}, y)))"
    )


@contextlib.contextmanager
def naming_keys(inputs: Any, what: str) -> Iterator[None]:
    """Re-raises a `KeyError` for a key the dicts of `inputs` lack as a `MissingKeyError`.

    Example:
      >>> with naming_keys(batch, "strategy.run(step)"):
      ...     step(batch)   # batch["b"] on {"a": ...} -> keys ['a'] named
    """
    try:
        yield
    except KeyError as error:
        clear = explained(error, inputs, what)
        if clear is None:
            raise
        raise clear from error
