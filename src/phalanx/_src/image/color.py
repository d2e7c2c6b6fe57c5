"""Pixel values: dtype conversion, standardisation and colour jitter, as tf.image's."""

from __future__ import annotations

from typing import Any

import numpy as np

from phalanx._src.image import randomness


def _is_int(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.integer)


def _max(dtype: np.dtype) -> int:
    return int(np.iinfo(dtype).max)


def convert_image_dtype(image: Any, dtype: Any, saturate: bool = False) -> np.ndarray:
    """Converts pixel values between dtypes, rescaling as tf.image.convert_image_dtype.

    Integers span [0, MAX] of their type and floats [0, 1): uint8 -> float32 divides by
    255; float -> uint8 multiplies by 255.5 and truncates (clipping first when `saturate`).

    Args:
      image: an image array.
      dtype: the target dtype (e.g. np.float32, np.uint8).
      saturate: clip before casting float to integer (out-of-range values stay valid).

    Returns:
      The converted array (the input itself when the dtype already matches).

    Example:
      >>> convert_image_dtype(np.array([0, 255], np.uint8), np.float32)   # [0., 1.]
    """
    array = np.asarray(image)
    target = np.dtype(dtype)
    source = array.dtype
    if source == target:
        return array
    if _is_int(source) and _is_int(target):
        in_max, out_max = _max(source), _max(target)
        if in_max > out_max:
            return (array // ((in_max + 1) // (out_max + 1))).astype(target)
        return array.astype(target) * target.type((out_max + 1) // (in_max + 1))
    if not _is_int(source) and not _is_int(target):
        return array.astype(target)
    if _is_int(source):
        return (array.astype(target) * target.type(1.0 / _max(source))).astype(target)
    scaled = array * np.asarray(_max(target) + 0.5, source)
    if saturate:
        info = np.iinfo(target)
        scaled = np.clip(scaled, info.min, info.max)
    return scaled.astype(target)


def _to_float(image: Any) -> tuple[np.ndarray, np.dtype]:
    array = np.asarray(image)
    if array.dtype in (np.float16, np.float32, np.float64):
        return array, array.dtype
    return convert_image_dtype(array, np.float32), array.dtype


def _back(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return convert_image_dtype(array, dtype, saturate=True)


def per_image_standardization(image: Any) -> np.ndarray:
    """(x - mean) / max(std, 1 / sqrt(N)) over each image, as TF's; float32 out.

    Integers are cast, not rescaled, as TF 2 does.

    Example:
      >>> per_image_standardization(image).mean()   # ~0
    """
    array = np.asarray(image)
    if array.ndim not in (3, 4):
        raise ValueError(f"per_image_standardization takes a 3-D or 4-D image, got {array.shape}")
    if not np.issubdtype(array.dtype, np.floating):
        array = array.astype(np.float32)
    axes = (-3, -2, -1)
    count = np.prod(array.shape[-3:])
    mean = array.mean(axis=axes, keepdims=True, dtype=np.float32)
    std = array.std(axis=axes, keepdims=True, dtype=np.float32)
    adjusted = np.maximum(std, np.float32(1.0 / np.sqrt(count)))
    return ((array - mean) / adjusted).astype(array.dtype)


def adjust_brightness(image: Any, delta: float) -> np.ndarray:
    """Adds `delta` to every pixel in [0, 1] float space, as tf.image.adjust_brightness.

    Example:
      >>> adjust_brightness(image, 0.1)
    """
    array, dtype = _to_float(image)
    return _back(array + np.asarray(delta, array.dtype), dtype)


def adjust_contrast(images: Any, contrast_factor: float) -> np.ndarray:
    """Scales each channel's distance from its mean by `contrast_factor`, as TF's.

    Example:
      >>> adjust_contrast(image, 1.5)
    """
    array, dtype = _to_float(images)
    mean = array.mean(axis=(-3, -2), keepdims=True, dtype=array.dtype)
    factor = np.asarray(contrast_factor, array.dtype)
    return _back((array - mean) * factor + mean, dtype)


def rgb_to_hsv(images: Any) -> np.ndarray:
    """RGB floats in [0, 1] to HSV (hue in [0, 1)), as tf.image.rgb_to_hsv.

    Example:
      >>> hsv = rgb_to_hsv(convert_image_dtype(image, np.float32))
    """
    rgb = np.asarray(images)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    value = rgb.max(axis=-1)
    minimum = rgb.min(axis=-1)
    delta = value - minimum
    with np.errstate(invalid="ignore", divide="ignore"):
        saturation = np.where(value > 0, delta / value, 0)
        safe = np.where(delta > 0, delta, 1)
        hue = np.where(
            value == r,
            (g - b) / safe,
            np.where(value == g, 2 + (b - r) / safe, 4 + (r - g) / safe),
        )
    hue = np.where(delta > 0, hue, 0) / 6
    hue = np.where(hue < 0, hue + 1, hue)
    return np.stack([hue, saturation, value], axis=-1).astype(rgb.dtype)


def hsv_to_rgb(images: Any) -> np.ndarray:
    """HSV (hue in [0, 1)) to RGB floats, as tf.image.hsv_to_rgb.

    Example:
      >>> rgb = hsv_to_rgb(hsv)
    """
    hsv = np.asarray(images)
    h, s, v = hsv[..., 0], hsv[..., 1], hsv[..., 2]
    c = s * v
    m = v - c
    dh = h * 6
    fmodu = np.mod(dh, 2.0)
    x = c * (1 - np.abs(fmodu - 1))
    sector = np.floor(dh).astype(np.int64) % 6
    zero = np.zeros_like(c)
    choices_r = [c, x, zero, zero, x, c]
    choices_g = [x, c, c, x, zero, zero]
    choices_b = [zero, zero, x, c, c, x]
    r = np.choose(sector, choices_r)
    g = np.choose(sector, choices_g)
    b = np.choose(sector, choices_b)
    return (np.stack([r, g, b], axis=-1) + m[..., None]).astype(hsv.dtype)


def adjust_saturation(image: Any, saturation_factor: float) -> np.ndarray:
    """Multiplies saturation (HSV) by `saturation_factor`, clipped to [0, 1], as TF's.

    Example:
      >>> adjust_saturation(image, 0.5)
    """
    array, dtype = _to_float(image)
    hsv = rgb_to_hsv(array.astype(np.float32))
    hsv[..., 1] = np.clip(hsv[..., 1] * np.float32(saturation_factor), 0, 1)
    return _back(hsv_to_rgb(hsv).astype(array.dtype), dtype)


def adjust_hue(image: Any, delta: float) -> np.ndarray:
    """Rotates hue by `delta` (in [-1, 1], a fraction of the circle), as TF's.

    Example:
      >>> adjust_hue(image, 0.1)
    """
    if not -1 <= delta <= 1:
        raise ValueError(f"delta must be in [-1, 1], got {delta!r}")
    array, dtype = _to_float(image)
    hsv = rgb_to_hsv(array.astype(np.float32))
    hsv[..., 0] = np.mod(hsv[..., 0] + np.float32(delta), 1.0)
    return _back(hsv_to_rgb(hsv).astype(array.dtype), dtype)


def _check_range(lower: float, upper: float, what: str) -> None:
    if not 0 <= lower < upper:
        raise ValueError(f"{what} needs 0 <= lower < upper, got lower={lower}, upper={upper}")


def random_brightness(image: Any, max_delta: float, seed: int | None = None) -> np.ndarray:
    """`adjust_brightness` by a delta uniform in [-max_delta, max_delta), as TF's.

    Example:
      >>> random_brightness(image, 0.2)
    """
    if max_delta < 0:
        raise ValueError(f"max_delta must be >= 0, got {max_delta}")
    rng = randomness.generator(seed)
    return adjust_brightness(image, randomness.uniform(rng, -max_delta, max_delta))


def random_contrast(image: Any, lower: float, upper: float, seed: int | None = None) -> np.ndarray:
    """`adjust_contrast` by a factor uniform in [lower, upper), as TF's.

    Example:
      >>> random_contrast(image, 0.8, 1.2)
    """
    _check_range(lower, upper, "random_contrast")
    rng = randomness.generator(seed)
    return adjust_contrast(image, randomness.uniform(rng, lower, upper))


def random_saturation(
    image: Any, lower: float, upper: float, seed: int | None = None
) -> np.ndarray:
    """`adjust_saturation` by a factor uniform in [lower, upper), as TF's.

    Example:
      >>> random_saturation(image, 0.5, 1.5)
    """
    _check_range(lower, upper, "random_saturation")
    rng = randomness.generator(seed)
    return adjust_saturation(image, randomness.uniform(rng, lower, upper))


def random_hue(image: Any, max_delta: float, seed: int | None = None) -> np.ndarray:
    """`adjust_hue` by a delta uniform in [-max_delta, max_delta), max_delta <= 0.5.

    Example:
      >>> random_hue(image, 0.08)
    """
    if not 0 <= max_delta <= 0.5:
        raise ValueError(f"max_delta must be in [0, 0.5], got {max_delta}")
    rng = randomness.generator(seed)
    return adjust_hue(image, randomness.uniform(rng, -max_delta, max_delta))


def stateless_random_brightness(image: Any, max_delta: float, seed: Any) -> np.ndarray:
    """`random_brightness` as a pure function of `seed` (two ints).

    Example:
      >>> stateless_random_brightness(image, 0.2, seed=(1, 2))
    """
    rng = randomness.stateless_generator(seed)
    return adjust_brightness(image, randomness.uniform(rng, -max_delta, max_delta))


def stateless_random_contrast(image: Any, lower: float, upper: float, seed: Any) -> np.ndarray:
    """`random_contrast` as a pure function of `seed` (two ints).

    Example:
      >>> stateless_random_contrast(image, 0.8, 1.2, seed=(1, 2))
    """
    _check_range(lower, upper, "stateless_random_contrast")
    rng = randomness.stateless_generator(seed)
    return adjust_contrast(image, randomness.uniform(rng, lower, upper))


def stateless_random_saturation(image: Any, lower: float, upper: float, seed: Any) -> np.ndarray:
    """`random_saturation` as a pure function of `seed` (two ints).

    Example:
      >>> stateless_random_saturation(image, 0.5, 1.5, seed=(1, 2))
    """
    _check_range(lower, upper, "stateless_random_saturation")
    rng = randomness.stateless_generator(seed)
    return adjust_saturation(image, randomness.uniform(rng, lower, upper))


def stateless_random_hue(image: Any, max_delta: float, seed: Any) -> np.ndarray:
    """`random_hue` as a pure function of `seed` (two ints).

    Example:
      >>> stateless_random_hue(image, 0.08, seed=(1, 2))
    """
    if not 0 <= max_delta <= 0.5:
        raise ValueError(f"max_delta must be in [0, 0.5], got {max_delta}")
    rng = randomness.stateless_generator(seed)
    return adjust_hue(image, randomness.uniform(rng, -max_delta, max_delta))
