"""What `Checkpoint.restore` returns: TF's load status, with its assertions.

A phalanx checkpoint restores all or nothing (`restore` raises on any mismatch), so its
assertions fail only when nothing was restored (`restore(None)`). A TF checkpoint is
matched by its object graph, as TF matches it: a variable of the objects that gets no
value, or a value whose shape differs, raises in `restore` before anything changes; values
the checkpoint holds for objects not given (an optimizer when only the model is, a
compiled model's metrics) are left unused, as in TF. `assert_consumed()` then raises
naming each unused checkpoint key and where it was looked for; `expect_partial()` says
they are expected. Without either, dropping the status warns, as TF logs at exit.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence


class UnusedValuesWarning(UserWarning):
    """A TF checkpoint's values went unused and nothing said they may (`expect_partial`)."""


class RestoreStatus:
    """What `Checkpoint.restore` returns, with the assertion names of TF's status object.

    Example:
      >>> checkpoint.restore(manager.latest_checkpoint).assert_consumed()
      >>> phalanx.Checkpoint(model=model).restore(tf_prefix).expect_partial()
    """

    def __init__(
        self, path: str | None, unused: Sequence[tuple[str, str]] = (), restored: int = 1
    ) -> None:
        self.path = path
        self.unused = list(unused)  # (checkpoint key, where it was looked for)
        self.restored = restored
        self._settled = not self.unused

    def _nothing(self) -> None:
        if self.path is None:
            raise AssertionError(
                "nothing was restored: restore(None) was called (no checkpoint saved yet, "
                "e.g. latest_checkpoint found none), so every object keeps its initial values"
            )

    def assert_consumed(self) -> RestoreStatus:
        """Raises AssertionError when nothing was restored or when values of the
        checkpoint went unused (naming their keys); else returns self."""
        self._nothing()
        self._settled = True
        if self.unused:
            listed = "; ".join(f"{key} (looked for at {where})" for key, where in self.unused[:8])
            more = f" and {len(self.unused) - 8} more" if len(self.unused) > 8 else ""
            raise AssertionError(
                f"{len(self.unused)} values of {self.path} were not restored: {listed}{more}. "
                "Pass the objects they belong to (e.g. optimizer=...), or call "
                "expect_partial() when restoring part of a checkpoint on purpose"
            )
        return self

    def assert_existing_objects_matched(self) -> RestoreStatus:
        """Raises AssertionError when nothing was restored; every variable of the objects
        given got its value, or `restore` raised."""
        self._nothing()
        self._settled = True
        return self

    def assert_nontrivial_match(self) -> RestoreStatus:
        """Raises AssertionError when no value was restored."""
        self._nothing()
        self._settled = True
        if not self.restored:
            raise AssertionError(f"no object matched a value of {self.path}")
        return self

    def expect_partial(self) -> RestoreStatus:
        """Says that values may go unused (no warning); returns self."""
        self._settled = True
        return self

    def __del__(self) -> None:
        if not getattr(self, "_settled", True):
            keys = ", ".join(key for key, _ in self.unused[:4])
            warnings.warn(
                f"{len(self.unused)} values of {self.path} were not restored ({keys}...): the "
                "objects they belong to were not given. Call .expect_partial() on what "
                "restore() returned when that is meant, or .assert_consumed() to raise",
                UnusedValuesWarning,
                stacklevel=2,
            )
