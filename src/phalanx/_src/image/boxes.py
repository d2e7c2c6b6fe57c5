"""tf.image.sample_distorted_bounding_box: Inception's random crop, TF's algorithm.

The sampler follows TF's kernel (sample_distorted_bounding_box_op.cc) step by step: up to
`max_attempts` times draw an aspect ratio, then a height between the smallest and largest
that keep the area in `area_range` and the crop inside the image, round as TF does, place
the crop uniformly, and accept it if it covers at least `min_object_covered` of some box;
if no attempt succeeds the whole image is the crop. The numbers drawn come from phalanx's
streams (`randomness`), not TF's Philox, so crops differ from TF's one by one but follow
the same distribution and constraints.
"""

from __future__ import annotations

import functools
import math
import struct
from typing import Any

import numpy as np

from phalanx._src.image import decode, randomness

_FLOAT32 = struct.Struct("f")  # packing a C float rounds to float32 as np.float32 does
_pack, _unpack = _FLOAT32.pack, _FLOAT32.unpack


def _f32(value: float) -> float:
    """`value` rounded to float32, as np.float32 does, in a third of its time."""
    return _unpack(_pack(value))[0]


def _lrint(value: float) -> int:
    return round(_unpack(_pack(value))[0])  # C's lrintf: to float32, then half to even


def _random_crop_box(
    integers: Any,
    width: int,
    height: int,
    min_area: float,
    max_area: float,
    aspect_ratio: float,
) -> tuple[int, int, int, int] | None:
    # TF computes the areas, and area / aspect_ratio, in float32. A double's +, *, / or sqrt
    # of float32 values rounded to float32 is the float32 operation's result (53 >= 2*24+2
    # bits), so _f32 of Python's arithmetic reproduces it.
    crop_h = _lrint(math.sqrt(_f32(min_area / aspect_ratio)))
    max_h = _lrint(math.sqrt(_f32(max_area / aspect_ratio)))
    if _lrint(max_h * aspect_ratio) > width:
        max_h = int((width + 0.5 - 1e-7) / aspect_ratio)
        if _lrint(max_h * aspect_ratio) > width:
            max_h -= 1
    max_h = min(max_h, height)
    crop_h = min(crop_h, max_h)
    if crop_h < max_h:
        crop_h += int(integers(0, max_h - crop_h + 1))
    crop_w = _lrint(crop_h * aspect_ratio)
    area = _f32(crop_w * crop_h)
    if area < min_area:
        crop_h += 1
        crop_w = _lrint(crop_h * aspect_ratio)
        area = _f32(crop_w * crop_h)
    if area > max_area:
        crop_h -= 1
        crop_w = _lrint(crop_h * aspect_ratio)
        area = _f32(crop_w * crop_h)
    if not (min_area <= area <= max_area and 0 < crop_w <= width and 0 < crop_h <= height):
        return None
    y = int(integers(0, height - crop_h)) if crop_h < height else 0
    x = int(integers(0, width - crop_w)) if crop_w < width else 0
    return x, y, x + crop_w, y + crop_h


def _covers(crop: tuple[int, int, int, int], boxes: tuple, min_object_covered: float) -> bool:
    for x0, y0, x1, y1 in boxes:
        area = (x1 - x0) * (y1 - y0)
        if area <= 0:
            continue
        inter_w = min(crop[2], x1) - max(crop[0], x0)
        inter_h = min(crop[3], y1) - max(crop[1], y0)
        inter = max(inter_w, 0) * max(inter_h, 0)
        if inter / area >= min_object_covered:
            return True
    return False


def _checked_boxes(bounding_boxes: Any) -> tuple[tuple[float, float, float, float], ...]:
    """The boxes as float32-valued (ymin, xmin, ymax, xmax) tuples, checked."""
    raw = np.zeros((0, 4), np.float32) if bounding_boxes is None else np.asarray(bounding_boxes)
    raw = raw.reshape(-1, 4).astype(np.float32)
    if np.any(raw < 0) or np.any(raw > 1) or np.any(raw[:, 2] < raw[:, 0]):
        raise ValueError(
            "bounding_boxes must be [ymin, xmin, ymax, xmax] in [0, 1] with min <= max, got "
            f"{raw.tolist()}"
        )
    return tuple(tuple(box) for box in raw.tolist())


def _crop_window(
    rng: Any,
    height: int,
    width: int,
    bounding_boxes: Any,
    min_object_covered: float,
    aspect_ratio_range: tuple[float, float],
    area_range: tuple[float, float],
    max_attempts: int,
    use_image_if_no_bounding_boxes: bool,
) -> tuple[int, int, int, int]:
    """The sampled crop as (y, x, height, width), in Python: no NumPy scalar on the way."""
    setup = (height, width, bounding_boxes, aspect_ratio_range, area_range, max_attempts,
             use_image_if_no_bounding_boxes)  # fmt: skip
    key = tuple([_hashable(value) for value in setup])
    # Something with no small hashable stand-in is prepared on every call.
    unhashable = any(part is _UNHASHABLE for part in key)
    prepared = _prepare(setup) if unhashable else _remembered_preparation(key)
    boxes, min_area, max_area, low, high, attempts = prepared
    integers = randomness.integers_of(rng)  # rng.random() below is uniform(0, 1)'s number
    for _ in range(attempts):
        ratio = _f32(rng.random() * (high - low) + low)
        crop = _random_crop_box(integers, width, height, min_area, max_area, ratio)
        if crop is not None and _covers(crop, boxes, min_object_covered):
            x0, y0, x1, y1 = crop
            return y0, x0, y1 - y0, x1 - x0
    return 0, 0, height, width


_NUMBERS = frozenset((int, float, bool, type(None)))
_UNHASHABLE = object()  # `_hashable`'s answer for a value with no cache key


class _Frozen(tuple):
    """A small array as a hashable (dtype, shape, bytes), for `_prepare`'s cache key."""

    def thaw(self) -> np.ndarray:
        return np.frombuffer(self[2], self[0]).reshape(self[1])


def _hashable(value: Any) -> Any:
    """`value` as a cache key equal for equal values, or `_UNHASHABLE`.

    A ported TF function passes the boxes as an array and the ranges as lists (as TF's
    examples do); as keys (a frozen array, tuples) they are prepared once, not per call.
    """
    kind = type(value)
    if kind in _NUMBERS:
        return value
    if kind is list or kind is tuple:
        if all(type(item) in _NUMBERS for item in value):  # the ranges: the usual case
            return tuple(value)
        items = tuple([_hashable(item) for item in value])
        nested = any(item is _UNHASHABLE or type(item) is _Frozen for item in items)
        return _UNHASHABLE if nested else items
    if isinstance(value, np.ndarray):
        return (
            _Frozen((value.dtype.str, value.shape, value.tobytes())) if value.size <= 256 else None
        )
    try:
        hash(value)
    except TypeError:
        return _UNHASHABLE
    return value


def _prepare(
    setup: tuple[Any, ...],
) -> tuple[tuple[tuple[int, int, int, int], ...], float, float, float, float, int]:
    """What `_crop_window`'s attempts share, checked: the boxes in pixels (x0, y0, x1, y1),
    the float32 area bounds, the aspect ratio range and the number of attempts.

    `setup` holds `_crop_window`'s arguments but the generator and `min_object_covered`.
    A pipeline crops every image with the same arguments and few distinct image sizes:
    hashable ones are prepared once and remembered.
    """
    (height, width, bounding_boxes, aspect_ratio_range, area_range, max_attempts,
     use_image_if_no_bounding_boxes) = (
        part.thaw() if type(part) is _Frozen else part for part in setup
    )  # fmt: skip
    if not (0 < area_range[0] <= area_range[1] <= 1.0):
        raise ValueError(f"area_range must satisfy 0 < low <= high <= 1, got {area_range!r}")
    if not (0 < aspect_ratio_range[0] <= aspect_ratio_range[1]):
        raise ValueError(f"aspect_ratio_range must be positive, got {aspect_ratio_range!r}")
    if max_attempts <= 0:
        raise ValueError(f"max_attempts must be > 0, got {max_attempts!r}")
    boxes = tuple(
        (int(xmin * width), int(ymin * height), int(xmax * width), int(ymax * height))
        for ymin, xmin, ymax, xmax in _checked_boxes(bounding_boxes)
    )
    if not boxes:
        if not use_image_if_no_bounding_boxes:
            raise ValueError(
                "no bounding box given: pass bounding_boxes (e.g. [[[0, 0, 1, 1]]]) or "
                "use_image_if_no_bounding_boxes=True"
            )
        boxes = ((0, 0, width, height),)
    pixels = _f32(width * height)
    min_area = _f32(_f32(float(area_range[0])) * pixels)
    max_area = _f32(_f32(float(area_range[1])) * pixels)
    low, high = float(aspect_ratio_range[0]), float(aspect_ratio_range[1])
    return boxes, min_area, max_area, low, high, int(max_attempts)


_remembered_preparation = functools.lru_cache(maxsize=1024)(_prepare)


def _sample(
    rng: Any,
    image_size: Any,
    bounding_boxes: Any,
    min_object_covered: float,
    aspect_ratio_range: tuple[float, float],
    area_range: tuple[float, float],
    max_attempts: int,
    use_image_if_no_bounding_boxes: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    try:
        height, width, _ = decode.as_ints(image_size, 3)
    except ValueError:
        raise ValueError(
            f"image_size must be [height, width, channels], got {image_size!r}"
        ) from None
    if height <= 0 or width <= 0:
        raise ValueError(f"image_size must be positive, got {image_size!r}")
    y, x, h, w = _crop_window(
        rng,
        height,
        width,
        bounding_boxes,
        min_object_covered,
        aspect_ratio_range,
        area_range,
        max_attempts,
        use_image_if_no_bounding_boxes,
    )
    begin = np.array((y, x, 0), np.int32)
    size_out = np.array((h, w, -1), np.int32)
    box = np.array([[[y / height, x / width, (y + h) / height, (x + w) / width]]], np.float32)
    return begin, size_out, box


def sample_distorted_bounding_box(
    image_size: Any,
    bounding_boxes: Any = None,
    seed: int | None = None,
    min_object_covered: float = 0.1,
    aspect_ratio_range: tuple[float, float] = (0.75, 1.33),
    area_range: tuple[float, float] = (0.05, 1.0),
    max_attempts: int = 100,
    use_image_if_no_bounding_boxes: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A random crop of an image, as tf.image.sample_distorted_bounding_box.

    Args:
      image_size: [height, width, channels] (e.g. `extract_jpeg_shape(contents)`).
      bounding_boxes: boxes [ymin, xmin, ymax, xmax] in [0, 1], shape (..., 4), or None.
      seed: an op-level seed (int) or None (inside `Dataset.map`: the element's stream).
      min_object_covered: the fraction of some box the crop must cover.
      aspect_ratio_range: the crop's width / height range.
      area_range: the crop's area as a fraction of the image's.
      max_attempts: tries before falling back to the whole image.
      use_image_if_no_bounding_boxes: treat the whole image as the box when none is given.

    Returns:
      (begin, size, bboxes) as TF's: int32 [y, x, 0], int32 [height, width, -1], and the
      crop as a float32 box of shape (1, 1, 4).

    Raises:
      ValueError: bad ranges or boxes, or no box and use_image_if_no_bounding_boxes False.

    Example:
      >>> shape = extract_jpeg_shape(contents)
      >>> begin, size, _ = sample_distorted_bounding_box(
      ...     shape, [[[0.0, 0.0, 1.0, 1.0]]], area_range=(0.08, 1.0),
      ...     aspect_ratio_range=(3 / 4, 4 / 3), max_attempts=10)
      >>> crop = decode_and_crop_jpeg(contents, [begin[0], begin[1], size[0], size[1]])
    """
    return _sample(
        randomness.generator(seed),
        image_size,
        bounding_boxes,
        min_object_covered,
        aspect_ratio_range,
        area_range,
        max_attempts,
        use_image_if_no_bounding_boxes,
    )


def stateless_sample_distorted_bounding_box(
    image_size: Any,
    bounding_boxes: Any,
    seed: Any,
    min_object_covered: float = 0.1,
    aspect_ratio_range: tuple[float, float] = (0.75, 1.33),
    area_range: tuple[float, float] = (0.05, 1.0),
    max_attempts: int = 100,
    use_image_if_no_bounding_boxes: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`sample_distorted_bounding_box` as a pure function of `seed` (two ints).

    Example:
      >>> begin, size, box = stateless_sample_distorted_bounding_box(shape, boxes, (1, 2))
    """
    return _sample(
        randomness.stateless_generator(seed),
        image_size,
        bounding_boxes,
        min_object_covered,
        aspect_ratio_range,
        area_range,
        max_attempts,
        use_image_if_no_bounding_boxes,
    )
