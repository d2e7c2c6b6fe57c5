"""More of tf.data's surface on `Dataset`: `range`, `list_files`, `as_numpy_iterator`,
`element_spec`, options.

Mixed into `Dataset` beside `DatasetOps`; see `options` for what each option does here.
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from phalanx._src.data import autotune, plan, stream
from phalanx._src.data.options import Options, spec_of

_tuner_lock = threading.Lock()


class DatasetTF:
    """Mixed into `Dataset`; see the module docstring."""

    _node: plan.Node
    _options: Options | None
    _tuner: autotune.Tuner | None

    @classmethod
    def range(cls, *args: int, dtype: Any = np.int64) -> Any:
        """`range(stop)`, `range(start, stop[, step])` as scalars, as tf.data's `range`.

        Example:
          >>> list(Dataset.range(2, 8, 3))   # [2, 5] (int64 scalars)
        """
        if not 1 <= len(args) <= 3 or not all(isinstance(a, int | np.integer) for a in args):
            raise TypeError(
                f"range() takes 1 to 3 integers (stop, or start, stop[, step]), got {args!r}"
            )
        values = np.arange(*[int(a) for a in args], dtype=dtype)
        return cls(plan.Source([values], plan.Source.single_leaf()))  # type: ignore[call-arg]

    @classmethod
    def list_files(
        cls, file_pattern: str | Sequence[str], shuffle: bool | None = None, seed: int | None = None
    ) -> Any:
        """The paths matching a glob pattern (or any of several), as tf.data's `list_files`.

        The paths are sorted, then shuffled every epoch unless `shuffle=False` (pass a
        `seed` so that every process, and a resumed run, sees the same order). Elements are
        Python strings (a batch of them an object array): `map` them to arrays
        (`phalanx.data.read_file`, `decode_image`) before the data goes to a model.

        Args:
          file_pattern: a glob pattern (`"data/*/*.png"`) or a list of them.
          shuffle: reshuffle the file names each epoch (default True, as tf.data).
          seed: the shuffle seed.

        Raises:
          ValueError: no file matches.

        Example:
          >>> files = Dataset.list_files("images/*/*.png", shuffle=True, seed=0)
          >>> images = files.map(lambda path: decode_png(read_file(path)))
        """
        patterns = [file_pattern] if isinstance(file_pattern, str | os.PathLike) else file_pattern
        found = sorted({p for pattern in patterns for p in glob.glob(os.fspath(pattern))})
        files = [p for p in found if os.path.isfile(p)]
        if not files:
            raise ValueError(
                f"list_files found no file matching {file_pattern!r} (relative to "
                f"{os.getcwd()!r}); check the pattern, e.g. 'images/*/*.png'"
            )
        dataset = cls(plan.Source([np.array(files, dtype=object)], plan.Source.single_leaf()))  # type: ignore[call-arg]
        if shuffle is None or shuffle:
            dataset = dataset.shuffle(len(files), seed=seed)
        return dataset

    def as_numpy_iterator(self) -> Any:
        """An iterator over the elements, as tf.data's: they are NumPy already.

        Example:
          >>> [int(x) for x in Dataset.range(3).as_numpy_iterator()]   # [0, 1, 2]
        """
        return iter(self)  # type: ignore[call-overload]

    @property
    def element_spec(self) -> Any:
        """The structure of `TensorSpec`s of an element, as tf.data's `element_spec`.

        Computed from the first element (a map runs once for it); a batch's first dimension
        is None unless `drop_remainder=True`, and a generator with `output_signature` gives
        that signature.

        Example:
          >>> Dataset.range(10).batch(4).element_spec   # TensorSpec(shape=(None,), int64)
        """
        node = self._node
        signature = getattr(node, "output_signature", None)
        if signature is not None:
            return signature
        if isinstance(node, stream.Stream):
            element = next(stream.open_node(node, (0,), None))
        else:
            if node.length == 0:
                raise ValueError("element_spec of an empty dataset is unknown")
            element = plan.element(node, (0,), 0)
        # A batch's first dimension is None unless it drops the remainder (as tf.data's).
        batched = self.batch_size is not None and not self.drop_remainder  # type: ignore[attr-defined]
        return jax.tree.map(lambda a: spec_of(a, batched), element)

    def options(self) -> Options:
        """The options set by `with_options` (defaults when none were)."""
        return self._options if self._options is not None else Options()

    def with_options(self, options: Options) -> Any:
        """This dataset with `options` merged over its own, as tf.data's `with_options`.

        Example:
          >>> options = Options()
          >>> options.threading.private_threadpool_size = 4   # AUTOTUNE tries up to 4
          >>> ds = ds.with_options(options)
        """
        if not isinstance(options, Options):
            raise TypeError(
                f"with_options() takes a phalanx.data.Options, got {type(options).__name__}"
            )
        dataset = self._then(self._node)  # type: ignore[attr-defined]
        dataset._options = self.options().merge(options)
        limit = int(dataset._options.experimental_max_open_files)
        dataset._node = plan.with_max_open(dataset._node, limit)
        return dataset

    def _tuner_for(self, top: int, kind: str) -> autotune.Tuner:
        """This pipeline's AUTOTUNE decision, kept across its iterators (epochs)."""
        with _tuner_lock:  # two iterators may start at once, in two threads
            tuner = self._tuner
            if tuner is None or (tuner.max_level, tuner.kind) != (top, kind):
                tuner = self._tuner = autotune.Tuner(max_level=top, kind=kind)
            return tuner
