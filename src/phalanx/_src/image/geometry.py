"""Flips and crops, as tf.image's, on (height, width, channels) or batched NumPy images."""

from __future__ import annotations

from typing import Any

import numpy as np

from phalanx._src.image import opencv, randomness


def _image(image: Any, what: str) -> np.ndarray:
    array = np.asarray(image)
    if array.ndim not in (3, 4):
        raise ValueError(
            f"{what} takes an image (height, width, channels) or a batch (n, height, width, "
            f"channels), got an array of shape {array.shape}"
        )
    return array


def flip_left_right(image: Any) -> np.ndarray:
    """The image mirrored horizontally (every image of a batch), as tf.image's.

    Args:
      image: (height, width, channels) or (n, height, width, channels).

    Returns:
      A new array of the same shape and dtype.

    Example:
      >>> flip_left_right(np.arange(6).reshape(1, 3, 2))[0, :, 0]   # array([4, 2, 0])
    """
    return _mirrored(_image(image, "flip_left_right"))


def _mirrored(array: np.ndarray) -> np.ndarray:
    """Images (..., h, w, c) mirrored left-right, new: OpenCV's SIMD pass, else NumPy's."""
    flipped = opencv.flip_left_right(array)
    return flipped if flipped is not None else np.ascontiguousarray(array[..., ::-1, :])


def flip_up_down(image: Any) -> np.ndarray:
    """The image mirrored vertically, as tf.image.flip_up_down.

    Example:
      >>> flipped = flip_up_down(image)
    """
    array = _image(image, "flip_up_down")
    return np.ascontiguousarray(array[..., ::-1, :, :])


def _random_flip(image: Any, rng: Any, axis: int, what: str) -> np.ndarray:
    array = _image(image, what)
    if array.ndim == 3:
        flip = randomness.uniform(rng, 0.0, 1.0) < 0.5
        # Unflipped, the image itself, as TF's cond returns its input: a copy would cost a
        # pass and a GIL hand-over for nothing.
        return _flipped(array, axis) if flip else array
    flips = randomness.uniform(rng, 0.0, 1.0, len(array)) < 0.5
    out = array.copy()
    out[flips] = _flipped(array[flips], axis)
    return out


def _flipped(array: np.ndarray, axis: int) -> np.ndarray:
    """Images mirrored along `axis` of one image (0: up-down, 1: left-right), new."""
    return _mirrored(array) if axis == 1 else np.ascontiguousarray(np.flip(array, -3))


def random_flip_left_right(image: Any, seed: int | None = None) -> np.ndarray:
    """Mirrors the image horizontally with probability 1/2 (each image of a batch alone).

    Inside `Dataset.map` the draw is a function of the element's position (see
    `randomness`), so pipelines are reproducible; `seed` picks an op-level stream.

    Args:
      image: (height, width, channels) or (n, height, width, channels).
      seed: an op-level seed (int) or None.

    Returns:
      The flipped image, a new array, or the unflipped one: the input itself, as TF's
      returns its input tensor (for a batch, a new array).

    Example:
      >>> ds.map(lambda x: random_flip_left_right(x))
    """
    return _random_flip(image, randomness.generator(seed), 1, "random_flip_left_right")


def random_flip_up_down(image: Any, seed: int | None = None) -> np.ndarray:
    """Mirrors the image vertically with probability 1/2, as tf.image's.

    Example:
      >>> random_flip_up_down(image, seed=1)
    """
    return _random_flip(image, randomness.generator(seed), 0, "random_flip_up_down")


def stateless_random_flip_left_right(image: Any, seed: Any) -> np.ndarray:
    """Mirrors horizontally with probability 1/2; a pure function of `seed` (two ints).

    Example:
      >>> stateless_random_flip_left_right(image, seed=(1, 2))
    """
    rng = randomness.stateless_generator(seed)
    return _random_flip(image, rng, 1, "stateless_random_flip_left_right")


def stateless_random_flip_up_down(image: Any, seed: Any) -> np.ndarray:
    """Mirrors vertically with probability 1/2; a pure function of `seed` (two ints).

    Example:
      >>> stateless_random_flip_up_down(image, seed=(1, 2))
    """
    rng = randomness.stateless_generator(seed)
    return _random_flip(image, rng, 0, "stateless_random_flip_up_down")


def crop_to_bounding_box(
    image: Any, offset_height: int, offset_width: int, target_height: int, target_width: int
) -> np.ndarray:
    """The window of `image` at (offset_height, offset_width) of the target size.

    Raises:
      ValueError: the window does not lie inside the image.

    Example:
      >>> crop_to_bounding_box(image, 10, 20, 224, 224)
    """
    array = _image(image, "crop_to_bounding_box")
    height, width = array.shape[-3:-1]
    y, x, h, w = int(offset_height), int(offset_width), int(target_height), int(target_width)
    if y < 0 or x < 0 or h <= 0 or w <= 0 or y + h > height or x + w > width:
        raise ValueError(
            f"crop_to_bounding_box: window [y={y}, x={x}, height={h}, width={w}] does not lie "
            f"inside the {height}x{width} image"
        )
    return array[..., y : y + h, x : x + w, :].copy()


def central_crop(image: Any, central_fraction: float) -> np.ndarray:
    """The central `central_fraction` of the image along height and width, as TF's.

    Args:
      image: (height, width, channels) or a batch.
      central_fraction: in (0, 1].

    Returns:
      The cropped image (TF's offsets: int((size - size * fraction) / 2)).

    Raises:
      ValueError: central_fraction outside (0, 1].

    Example:
      >>> central_crop(image, 0.875)   # Inception's evaluation crop
    """
    if not 0.0 < central_fraction <= 1.0:
        raise ValueError(f"central_fraction must be in (0, 1], got {central_fraction!r}")
    array = _image(image, "central_crop")
    if central_fraction == 1.0:
        return array
    height, width = array.shape[-3:-1]
    top = int((float(height) - float(height) * central_fraction) / 2)
    left = int((float(width) - float(width) * central_fraction) / 2)
    return array[..., top : height - top, left : width - left, :].copy()


def _random_crop(value: Any, size: Any, rng: Any, what: str) -> np.ndarray:
    array = np.asarray(value)
    size = tuple(int(s) for s in np.asarray(size).reshape(-1))
    pairs = list(zip(size, array.shape, strict=False))
    if len(size) != array.ndim or any(s > d or s < 0 for s, d in pairs):
        raise ValueError(
            f"{what}: size {size} must have one entry per dimension of the value's shape "
            f"{array.shape}, each no larger than it"
        )
    offsets = [int(randomness.integers(rng, d - s + 1)) for s, d in pairs]
    return array[tuple(slice(o, o + s) for o, s in zip(offsets, size, strict=True))].copy()


def random_crop(value: Any, size: Any, seed: int | None = None) -> np.ndarray:
    """A uniformly placed window of shape `size` of `value`, as tf.image.random_crop.

    Args:
      value: any array.
      size: the window's shape, one entry per dimension of `value`.
      seed: an op-level seed (int) or None.

    Raises:
      ValueError: `size` does not fit in `value`.

    Example:
      >>> random_crop(image, (224, 224, 3))
    """
    return _random_crop(value, size, randomness.generator(seed), "random_crop")


def stateless_random_crop(value: Any, size: Any, seed: Any) -> np.ndarray:
    """`random_crop` as a pure function of `seed` (two ints).

    Example:
      >>> stateless_random_crop(image, (224, 224, 3), seed=(1, 2))
    """
    rng = randomness.stateless_generator(seed)
    return _random_crop(value, size, rng, "stateless_random_crop")
