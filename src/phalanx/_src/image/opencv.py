"""TF2's bilinear resize of a window, flipped, into uint8, by OpenCV: one native call, GIL free.

`tf.image.resize(..., "bilinear")` without antialias (TF2's; TF1's
`tf.compat.v1.image.resize(align_corners=False)`, which TF's official ResNet-50
preprocessing calls, samples at i * scale instead and is not what this computes)
maps output pixel i to source coordinate (i + 0.5) * scale - 0.5, clamped to the image,
and mixes the two neighbours on each axis. OpenCV's `INTER_LINEAR` uses the same formula
with 11-bit fixed-point weights, so its uint8 result is within 1 level of TF's float
result rounded (`tests/image/test_image_fused.py` checks it against TF's). It runs in C++
with SIMD and the GIL released: on the benchmark's 500x375 JPEGs and Inception crops it
took ~0.17 ms per 224x224 image, where the five NumPy passes of `bilinear` took ~1.1 ms.

- An integer window of the decoded image (a full-scale decode) is a view that
  `cv2.resize` reads in place: the crop costs nothing, and the flip is `cv2.flip` of the
  small output.
- A fractional window (the image decoded at 1/2, 1/4 or 1/8 scale) is one `cv2.warpAffine`
  whose matrix is the resize's mapping, with the flip folded in. Its coordinates are
  quantised to 1/32 pixel, and at the window's edge it reads the real neighbouring pixel
  where cropping first would repeat the edge, so it is within a few levels of the NumPy
  taps there.

`flip_left_right` mirrors images in one SIMD pass: NumPy's copy of a reversed axis moves
one 3-byte pixel at a time (0.56 ms for a 300x350 RGB crop, against ~0.03 ms).

`stack_into` copies a streamed batch's elements into its array in one call, so the thread
that batches gives up the GIL once a batch rather than once an element.

`resize_float` is `tf.image.resize(images, size)` (bilinear, no antialias) of a float32
image: OpenCV's float path uses float weights, so it equals TF's to float rounding (3e-5
on values up to 255), at ~1/8 of the NumPy taps' time on a 224x224 output.

OpenCV (opencv-python-headless, phalanx's `image` extra) is optional: without it both
fall back to NumPy (`bilinear`, `resample`).

phalanx's map threads are the parallelism, as tf.data runs each op with an intra-op
parallelism of 1: the first OpenCV call here switches OpenCV to one thread
(`cv2.setNumThreads(1)`, process-wide). Its own pool (a thread per core, spinning between
calls) otherwise ran beside the map's threads: on 2 cores it burned 0.4 ms of CPU per image
of the TF port's pipeline with one map thread (863 against 1,330 images per CPU-second) and
would contend with 8-16 map threads on a larger host. Call `cv2.setNumThreads(n)` after
phalanx.image's first call to give OpenCV its pool back.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

_MAX_CHANNELS = 511  # the Python binding maps fewer than CV_CN_MAX (512) channels
# The element types every OpenCV since 4.x handles (5.x adds more).
_DEPTHS = frozenset(np.dtype(t) for t in ("u1", "i1", "u2", "i2", "i4", "f4", "f8"))

try:  # optional (phalanx's `image` extra)
    import cv2 as _cv2
except ImportError:  # pragma: no cover - exercised where OpenCV is missing
    _cv2 = None

_sequential = False  # whether OpenCV has been set to one thread (module docstring)
_sequential_lock = threading.Lock()


def _cv() -> Any:
    """OpenCV, switched to one thread on first use (the module docstring says why)."""
    global _sequential
    if not _sequential:
        with _sequential_lock:  # phalanx's other first callers wait outside OpenCV
            if not _sequential:
                _cv2.setNumThreads(1)
                _sequential = True
    return _cv2


def version() -> str | None:
    """OpenCV's version, or None where it is not installed (the NumPy paths run)."""
    return None if _cv2 is None else _cv2.__version__


def usable(out: np.ndarray) -> bool:
    """Whether OpenCV is installed and can write into `out` in place (C-contiguous)."""
    return _cv2 is not None and out.flags.c_contiguous


def resize_window_into(
    image: np.ndarray, window: tuple[float, float, float, float], flip: bool, out: np.ndarray
) -> np.ndarray:
    """`image`'s window [y, x, height, width] resized bilinearly (TF's) into uint8 `out`.

    Args:
      image: uint8 pixels (h, w, c), c in 1..4, C-contiguous.
      window: the window in `image`'s pixel coordinates; integers crop exactly, fractions
        (a DCT-scaled decode) are sampled through an affine map.
      flip: mirror left-right.
      out: a C-contiguous uint8 array (out_h, out_w, c), written and returned.

    Returns:
      `out`.

    Example:
      >>> pixels = decode_jpeg(data)
      >>> resize_window_into(pixels, (10, 40, 300, 400), True, np.empty((224, 224, 3), np.uint8))
    """
    if _cv2 is None:  # pragma: no cover - callers check usable()
        raise ImportError("OpenCV is not installed: pip install 'phalanx[image]'")
    cv = _cv()
    y, x, h, w = window
    out_h, out_w, channels = out.shape
    target = out if channels > 1 else out.reshape(out_h, out_w)
    source = image if channels > 1 else image.reshape(image.shape[:2])
    if all(float(v).is_integer() for v in window):
        y0, x0, y1, x1 = int(y), int(x), int(y + h), int(x + w)
        resized = cv.resize(source[y0:y1, x0:x1], (out_w, out_h), target, 0, 0, cv.INTER_LINEAR)
        _check_in_place(resized, target, "resize")
        if flip:
            _check_in_place(cv.flip(target, 1, target), target, "flip")
        return out
    sy, sx = h / out_h, w / out_w
    # dst (i, j) samples src (y + (i + 0.5) * sy - 0.5, x + (j + 0.5) * sx - 0.5); a flip
    # reads column out_w - 1 - j instead.
    column = (-sx, x + (out_w - 0.5) * sx - 0.5) if flip else (sx, x + 0.5 * sx - 0.5)
    matrix = np.array([(column[0], 0.0, column[1]), (0.0, sy, y + 0.5 * sy - 0.5)], np.float64)
    warped = cv.warpAffine(
        source,
        matrix,
        (out_w, out_h),
        target,
        cv.INTER_LINEAR | cv.WARP_INVERSE_MAP,
        cv.BORDER_REPLICATE,
    )
    _check_in_place(warped, target, "warpAffine")
    return out


def stack_into(values: list[np.ndarray] | tuple[np.ndarray, ...], out: np.ndarray) -> bool:
    """Copies arrays of one shape and dtype into the rows of `out` in one native call, or
    returns False (OpenCV missing, or a value that is not C-contiguous) for the caller's
    `np.stack(values, out=out)`.

    Why: NumPy releases and takes back the GIL for each value it copies. A streaming
    batch is stacked in the consuming thread, which then waits behind every map thread
    holding the GIL, once per element: with 16 threads of a GIL-heavy map that wait, not
    the copy, decides how fast batches come. `cv2.vconcat` of each value's bytes as one
    row copies the whole batch with one release (a batch of 64 float32 224x224x3 images
    under GIL contention: 0.10 ms of GIL held against 0.68 ms).

    Example:
      >>> out = np.empty((64, 224, 224, 3), np.float32)
      >>> stack_into(images, out) or np.stack(images, out=out)
    """
    if _cv2 is None or not out.flags.c_contiguous or out.nbytes == 0:
        return False
    rows = []
    for value in values:
        if not value.flags.c_contiguous:
            return False
        rows.append(value.reshape(1, -1).view(np.uint8))  # its bytes, as one row
    if rows[0].shape[1] >= 2**31:  # a Mat's columns are an int
        return False
    target = out.reshape(len(rows), -1).view(np.uint8)
    # (vconcat copies in the calling thread: OpenCV's thread setting is left as it is.)
    _check_in_place(_cv2.vconcat(rows, target), target, "vconcat")
    return True


def _check_in_place(result: np.ndarray, target: np.ndarray, what: str) -> None:
    """OpenCV returns a new array, silently, where it cannot write into `dst`: an error."""
    if result is not target:
        raise RuntimeError(
            f"OpenCV's {what} did not write into the output array ({target.dtype} "
            f"{target.shape}, got {result.dtype} {result.shape}); please report this"
        )


def takes_float(image: np.ndarray) -> bool:
    """Whether `resize_float` takes `image` (h, w, c) once cast to float32: OpenCV is
    installed and handles its channel count."""
    return _cv2 is not None and image.shape[2] <= _MAX_CHANNELS


def resize_float(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """A float32 (h, w, c) image resized bilinearly (TF's, no antialias), a new array.

    The caller checks `takes_float(image)` first.

    Example:
      >>> resize_float(pixels.astype(np.float32), (224, 224)).shape   # (224, 224, 3)
    """
    out_h, out_w = size
    resized = _cv().resize(image, (out_w, out_h), interpolation=_cv2.INTER_LINEAR)
    return resized.reshape(out_h, out_w, image.shape[2])


def flip_left_right(images: np.ndarray) -> np.ndarray | None:
    """(..., height, width, channels) images mirrored left-right, a new array, or None.

    A batch is flipped as one tall image (its rows are every image's rows). None where
    OpenCV is missing or cannot take the array (its element type or channel count), so
    the caller falls back to NumPy.

    Example:
      >>> flip_left_right(np.arange(6, dtype=np.uint8).reshape(1, 3, 2))[0, :, 0]   # [4, 2, 0]
    """
    if _cv2 is None or images.dtype not in _DEPTHS or images.shape[-1] > _MAX_CHANNELS:
        return None
    if images.size == 0:  # (OpenCV returns None for an empty image)
        return images.copy()
    if images.ndim == 3 and images.strides[1:] == (
        images.shape[2] * images.itemsize,
        images.itemsize,
    ):
        # One image whose pixels are contiguous rows (a crop of a decode is): OpenCV reads
        # the rows in place, one pass.
        return _cv().flip(images, 1).reshape(images.shape)  # (1 channel comes back 2-D)
    width, channels = images.shape[-2:]
    rows = np.ascontiguousarray(images).reshape(-1, width, channels)
    return _cv().flip(rows, 1).reshape(images.shape)
