"""Where phalanx.image's random ops draw from: reproducible inside `Dataset.map`.

TF's stateful random ops (`tf.image.random_flip_left_right(image)`) draw from a global
stream, so a tf.data map with them is only reproducible with a global seed and
`deterministic=True`, and never across a different number of parallel calls. Here,
`Dataset.map` opens an *element stream* around each call of its function, keyed by the
shuffle seeds below the map (recorded in the iterator's state), the iteration key and the
element's position (the data room's `element_ops.map_words` computes the key). An op
without `seed` then draws the next numbers of that stream; an op with `seed=s` draws from
a stream of its own keyed by the same words and `s`. Either way the numbers depend only on
where the element sits in the dataset, so every run, a resumed
iterator, and any number of thread or process workers give the same batches.

Outside a map, an op without a seed draws from NumPy's global generator (so
`np.random.seed` or `keras.utils.set_random_seed` makes a script reproducible, as phalanx's
shuffles), and an op with `seed=s` from a generator kept per seed: successive calls give
successive numbers, the same on every run (as TF's op-level seeds under a global seed).
The `stateless_*` ops take `seed`, two integers, and give a pure function of it.
"""

from __future__ import annotations

import functools
import hashlib
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.random.bit_generator import ISeedSequence

_local = threading.local()
_op_generators: dict[int, np.random.Generator] = {}
_op_lock = threading.Lock()


class ElementStream:
    """The random numbers of one dataset element: a default stream and one per op seed.

    A generator is built when an op first asks for it: a map without random ops pays
    only for this object.
    """

    __slots__ = ("_default", "_seeded", "_words")

    def __init__(self, words: Sequence[int]) -> None:
        self._words = words
        self._default: np.random.Generator | None = None
        self._seeded: dict[int, np.random.Generator] = {}

    @property
    def words(self) -> tuple[int, ...]:
        """The stream's key as uint64s."""
        return tuple([int(w) % 2**64 for w in self._words])

    def generator(self, seed: int | None) -> np.random.Generator:
        if seed is None:
            if self._default is None:
                self._default = _generator(self.words)
            return self._default
        key = int(seed)
        if key not in self._seeded:
            self._seeded[key] = _generator((*self.words, 1, key % 2**64))
        return self._seeded[key]


class _HashedWords(ISeedSequence):
    """A bit generator's seed state: BLAKE2b of the words packed as little-endian uint64s.

    A cryptographic hash mixes the words at least as well as NumPy's SeedSequence (distinct
    words, of any lengths, give unrelated states) for a fifth of its cost, which an element
    stream pays once per map call.
    """

    __slots__ = ("_words",)

    def __init__(self, words: Sequence[int]) -> None:
        self._words = words

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        """The state words; on a little-endian machine a read-only view of the digest."""
        little = _little_endian(dtype)
        packed = struct.pack(f"<{len(self._words)}Q", *self._words)
        digest = hashlib.blake2b(packed, digest_size=n_words * little.itemsize).digest()
        return np.frombuffer(digest, little).astype(dtype, copy=False)


@functools.lru_cache
def _little_endian(dtype: Any) -> np.dtype:
    return np.dtype(dtype).newbyteorder("<")


def _generator(words: Sequence[int]) -> np.random.Generator:
    """A generator that is a pure function of `words` (uint64s).

    PCG64DXSM seeded with 256 hashed bits (state and stream increment): NumPy's bit
    generator for many parallel streams, and 2.5 us to build where Philox took 5 us and
    Philox over a SeedSequence 14-24 us.
    """
    return np.random.Generator(np.random.PCG64DXSM(_HashedWords(words)))


class _Scope:
    """`element_stream`'s context manager: a class, as a generator-based one (contextlib's)
    costs several times more per map call."""

    __slots__ = ("_previous", "_stream")

    def __init__(self, words: Sequence[int]) -> None:
        self._stream = ElementStream(words)

    def __enter__(self) -> ElementStream:
        self._previous = getattr(_local, "stream", None)
        _local.stream = self._stream
        return self._stream

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        _local.stream = self._previous
        if isinstance(error, StopIteration):
            # Out of an iterator's __next__ it would end the epoch early, silently, short.
            raise RuntimeError(f"the map function raised StopIteration ({error!r})") from None


def element_stream(words: Sequence[int]) -> _Scope:
    """Within this block, unseeded random ops of this thread draw from `words`' stream.

    `Dataset.map` opens one around each call of the user's function; nesting restores the
    outer stream on exit. A StopIteration raised inside becomes a RuntimeError, so that a
    map's bug cannot end an epoch early.

    Example:
      >>> with element_stream((seed, epoch, position)):
      ...     image = random_flip_left_right(image)
    """
    return _Scope(words)


def current_stream() -> ElementStream | None:
    """The element stream of the map call running in this thread, if any."""
    return getattr(_local, "stream", None)


def generator(seed: int | None) -> np.random.Generator | Any:
    """The generator a stateful random op with op seed `seed` (or None) draws from.

    A `np.random.Generator`, or outside a map without a seed the `np.random` module, whose
    `random`, `uniform` and `randint` draw from NumPy's global generator.
    """
    if seed is not None and not isinstance(seed, int | np.integer):
        raise TypeError(
            f"seed must be a Python int or None, got {type(seed).__name__}; for a pair of "
            "integers use the stateless_* form, e.g. stateless_random_flip_left_right(image, "
            "seed=(1, 2))"
        )
    stream = current_stream()
    if stream is not None:
        return stream.generator(seed)
    if seed is None:
        # NumPy's global RandomState through its public face: np.random.random, uniform and
        # randint are that generator's bound methods, so np.random.seed applies.
        return np.random
    with _op_lock:
        if int(seed) not in _op_generators:
            _op_generators[int(seed)] = _generator((2, int(seed) % 2**64))
        return _op_generators[int(seed)]


def stateless_generator(seed: Any) -> np.random.Generator:
    """A fresh generator that is a pure function of `seed` (two integers, as TF's)."""
    words = np.asarray(seed)
    if words.shape != (2,) or not np.issubdtype(words.dtype, np.integer):
        raise ValueError(
            f"a stateless seed is two integers, shape (2,), got {seed!r}; e.g. seed=(1, 2)"
        )
    return _generator((3, *(int(w) % 2**64 for w in words)))


def uniform(rng: Any, low: float, high: float, size: Any = None) -> Any:
    """Uniform floats in [low, high) from a Generator or NumPy's global generator."""
    return rng.uniform(low, high, size)


def integers(rng: Any, high: int, size: Any = None) -> Any:
    """Uniform ints in [0, high) from a Generator or NumPy's global generator."""
    return integers_of(rng)(0, high, size)


def integers_of(rng: Any) -> Callable[..., Any]:
    """`rng`'s integers(low, high[, size]): Generator.integers, or np.random.randint for the
    global generator (the same draws by two names); a hot loop binds it once."""
    return rng.integers if isinstance(rng, np.random.Generator) else rng.randint
