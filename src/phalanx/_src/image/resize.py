"""tf.image.resize on NumPy: TF's methods, half-pixel centres and antialiasing."""

from __future__ import annotations

from typing import Any

import numpy as np

from phalanx._src.image import backends, decode, opencv, resample


class ResizeMethod:
    """The names `resize` takes, as tf.image.ResizeMethod."""

    AREA = "area"
    BICUBIC = "bicubic"
    BILINEAR = "bilinear"
    GAUSSIAN = "gaussian"
    LANCZOS3 = "lanczos3"
    LANCZOS5 = "lanczos5"
    MITCHELLCUBIC = "mitchellcubic"
    NEAREST_NEIGHBOR = "nearest"


METHODS = (
    "area",
    "bicubic",
    "bilinear",
    "gaussian",
    "lanczos3",
    "lanczos5",
    "mitchellcubic",
    "nearest",
)


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS} (ResizeMethod), got {method!r}")
    return method


def _target(height: int, width: int, size: Any, preserve_aspect_ratio: bool) -> tuple[int, int]:
    try:
        new_h, new_w = decode.as_ints(size, 2)
    except ValueError:
        raise ValueError(f"size must be two positive ints (height, width), got {size!r}") from None
    if new_h <= 0 or new_w <= 0:
        raise ValueError(f"size must be two positive ints (height, width), got {size!r}")
    if preserve_aspect_ratio:
        # As TF: the largest size within `size` with the image's aspect ratio.
        scale = min(new_h / height, new_w / width)
        new_h = max(round(height * scale), 1)
        new_w = max(round(width * scale), 1)
    return new_h, new_w


def resize(
    images: Any,
    size: Any,
    method: str = ResizeMethod.BILINEAR,
    preserve_aspect_ratio: bool = False,
    antialias: bool = False,
) -> np.ndarray:
    """Images resized to `size` (height, width), as tf.image.resize.

    Pixel centres sit at half-integers, as TF2's `tf.image.resize`. TF1's
    `tf.compat.v1.image.resize(..., align_corners=False)`, which TF's official ResNet-50
    preprocessing (tensorflow/models, imagenet_preprocessing.py) calls, samples output
    pixel i at i * scale without that offset, so its pixels differ from these (by up to a
    few levels on detailed images). `antialias=True` widens the
    kernel when shrinking so every input pixel contributes (TF's ScaleAndTranslate);
    lanczos3/5, gaussian and mitchellcubic always use that path, and `area` averages the
    input each output pixel covers, as TF's.

    Args:
      images: (height, width, channels) or (n, height, width, channels), any real dtype.
      size: the new (height, width).
      method: a `ResizeMethod` name: bilinear (default), nearest, bicubic, area, lanczos3,
        lanczos5, gaussian, mitchellcubic.
      preserve_aspect_ratio: fit within `size` keeping the aspect ratio.
      antialias: filter when downsampling (bilinear, bicubic and the kernels above).

    Returns:
      float32 images, except `nearest`, which keeps the input's dtype (as TF).

    Raises:
      ValueError: an unknown method, a bad size or an image that is not 3-D or 4-D.

    Example:
      >>> resize(image, (224, 224))                       # bilinear, float32
      >>> resize(image, (224, 224), antialias=True)       # as PIL's bilinear
    """
    check_method(method)
    backends.announce()
    array = np.asarray(images)
    if array.ndim not in (3, 4):
        raise ValueError(
            f"resize takes (height, width, channels) or (n, height, width, channels), got "
            f"shape {array.shape}"
        )
    if array.ndim == 4:
        return np.stack(
            [resize(image, size, method, preserve_aspect_ratio, antialias) for image in array]
        )
    height, width = array.shape[:2]
    new_h, new_w = _target(height, width, size, preserve_aspect_ratio)
    to_float = array.dtype.kind != "f" or array.dtype.itemsize == 8
    floats = to_float or array.dtype == np.float32  # (float16 stays float16, in NumPy)
    if method == "bilinear" and not antialias and floats and opencv.takes_float(array):
        # TF2's default: OpenCV's float path, ~8x the NumPy taps. The float32 copy it reads
        # goes to this thread's work array: a fresh one per image (~1 MB) cost the
        # allocator page faults, more CPU than the cast.
        if to_float:
            work = resample.scratch_array("resize-float", array.shape, np.float32)
            np.copyto(work, array, casting="unsafe")  # astype's cast, one GIL-free pass
            array = work
        return opencv.resize_float(array, (new_h, new_w))
    if method != "nearest" and to_float:
        array = array.astype(np.float32)  # one GIL-free pass
    rows = resample.taps_for(method, antialias, height, new_h)
    cols = resample.taps_for(method, antialias, width, new_w)
    if method == "nearest":
        return array[rows.index[:, 0]][:, cols.index[:, 0]]
    return resample.resample(array, rows, cols)
