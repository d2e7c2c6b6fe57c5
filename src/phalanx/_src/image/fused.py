"""Decode, crop, resize and flip a JPEG in one pass: the fast path of image pipelines.

TF's ResNet-50 training preprocessing decodes the crop window (`decode_and_crop_jpeg`),
flips it and resizes it to 224x224 in float32: three passes over the pixels. Here (with
TF2's `tf.image.resize` as the resize: half-pixel centres; TF's official code calls TF1's
`tf.compat.v1.image.resize(align_corners=False)`, whose sampling differs):

1. the JPEG is decoded at the smallest of 1/8, 1/4, 1/2 or full scale (libjpeg-turbo's
   DCT-domain scaling) at which the crop window still has at least the output's size, which skips
   most of the IDCT work for large crops;
2. the crop window, mapped into the scaled image, the resize and the flip are folded into
   one set of taps per axis, applied once: two taps per pixel for TF's bilinear without
   antialias (`bilinear`), the kernels' taps otherwise (`resample`);
3. the result is rounded into a uint8 array (optionally the caller's preallocated one), so
   images travel as uint8 to the batch and to the device (4x fewer bytes than float32).

Every step runs in native code with the GIL released (simplejpeg's decode, NumPy's
gathers and arithmetic), so threads scale with the cores.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from phalanx._src.image import (
    backends,
    bilinear,
    boxes,
    decode,
    opencv,
    randomness,
    resample,
    resize,
    tj3,
)


def _scale_eighths(crop_h: int, crop_w: int, out_h: int, out_w: int) -> int:
    """The smallest scale in 1/8, 2/8, 4/8, 8/8 keeping the window >= out_h x out_w.

    libjpeg-turbo has SIMD IDCTs for those four scales only; its other N/8 scales are
    slower than a full decode (measured: 5/8 took 1.2x the full decode's time).
    """
    need = max(-(-8 * out_h // crop_h), -(-8 * out_w // crop_w))
    for eighths in (1, 2, 4):
        if eighths >= need:
            return eighths
    return 8  # a full decode (also when upscaling)


def decode_crop_resize_flip(
    contents: Any,
    crop_window: Any,
    size: Any,
    flip: bool = False,
    channels: int = 3,
    method: str = "bilinear",
    antialias: bool = False,
    scaled_decode: bool = True,
    dct_method: str = "",
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The window [y, x, height, width] of a JPEG resized to `size`, flipped, as uint8.

    Equals `resize(decode_and_crop_jpeg(contents, crop_window), size)` (then
    `flip_left_right` when `flip`) rounded to uint8, up to the DCT-domain scaling:
    with `scaled_decode` the JPEG is decoded at the smallest of 1/8, 1/4, 1/2 or full scale
    that keeps the window at least `size`, which is faster and acts as a mild anti-aliasing filter
    (pixels then differ from a full decode by a few levels; `scaled_decode=False` gives a
    full decode).

    Args:
      contents: the JPEG's bytes.
      crop_window: [offset_height, offset_width, target_height, target_width] in the
        full-resolution image (as `decode_and_crop_jpeg`).
      size: the output (height, width).
      flip: mirror left-right.
      channels: 1 or 3.
      method: a resize method (`ResizeMethod`), except area.
      antialias: as `resize`'s. With True, 3 channels and bilinear, bicubic or lanczos3,
        Pillow's C resampler runs the crop, resize and flip (about twice NumPy's speed);
        at the window's edges it reads the real neighbouring pixels where cropping first
        repeats the edge (within 2 levels of the unfused ops).
      scaled_decode: decode at a reduced DCT scale when the window allows.
      dct_method: as `decode_jpeg`'s (TF's: "" and "INTEGER_FAST" are the fast integer
        IDCT, "INTEGER_ACCURATE" the accurate one).
      out: an optional preallocated uint8 array (height, width, channels) to write into.

    Returns:
      A uint8 array (height, width, channels) (`out` when given).

    Raises:
      ValueError: the window is not inside the image, or a bad argument.

    Example:
      >>> begin, crop, _ = sample_distorted_bounding_box(extract_jpeg_shape(data), box)
      >>> image = decode_crop_resize_flip(
      ...     data, [begin[0], begin[1], crop[0], crop[1]], (224, 224), flip=True)
    """
    resize.check_method(method)
    if method == "area":
        raise ValueError("decode_crop_resize_flip resizes with a kernel; method 'area' is not one")
    decode.check_channels(channels, (1, 3))
    fast = decode.check_dct_method(dct_method)
    data = decode.as_bytes(contents, "decode_crop_resize_flip")
    out_size = decode.as_ints(size, 2)
    window = decode.as_ints(crop_window, 4)
    return _decode_crop_resize_flip(
        data, window, out_size, flip, channels, method, antialias, scaled_decode, fast, out,
        decode.jpeg_header(data),
    )  # fmt: skip


def _decode_crop_resize_flip(
    data: bytes,
    window: tuple[int, ...],
    size: tuple[int, ...],
    flip: bool,
    channels: int,
    method: str,
    antialias: bool,
    scaled_decode: bool,
    fast_dct: bool,
    out: np.ndarray | None,
    header: tuple[int, int, int] | None,
) -> np.ndarray:
    """`decode_crop_resize_flip` of checked arguments: the JPEG's bytes, the window and
    size as Python ints, `fast_dct` from `decode.check_dct_method`, and
    `decode.jpeg_header(data)`."""
    backends.announce()
    y, x, h, w = window
    out_h, out_w = size
    height, width, _ = decode.jpeg_shape(data, header)
    decode.check_window(y, x, h, w, height, width, "decode_crop_resize_flip")
    if out is None:
        out = np.empty((out_h, out_w, channels), np.uint8)
    elif out.shape != (out_h, out_w, channels) or out.dtype != np.uint8:
        raise ValueError(
            f"out must be a uint8 array of shape {(out_h, out_w, channels)}, got "
            f"{out.dtype} {out.shape}"
        )
    min_h = min_w = 0
    if scaled_decode:
        eighths = _scale_eighths(h, w, out_h, out_w)
        if eighths < 8:
            min_h = decode.scaled_size(height, eighths)
            min_w = decode.scaled_size(width, eighths)
    if antialias and channels == 3 and method in _PILLOW_FILTERS:
        fast_path = _pillow_resize(data, window, (height, width), size, flip, method, min_h,
                                   min_w, fast_dct, out)  # fmt: skip
        if fast_path is not None:
            return fast_path
    image, (wy, wx, wh, ww) = _decode_window(
        data, channels, window, (height, width), min_h, min_w, fast_dct, header
    )
    if method == "bilinear" and not antialias and opencv.usable(out):  # tf.image.resize's
        return opencv.resize_window_into(image, (wy, wx, wh, ww), flip, out)
    rows = resample.taps_for(method, antialias, image.shape[0], out_h, wy, wh)
    cols = resample.taps_for(method, antialias, image.shape[1], out_w, wx, ww)
    if flip:
        cols = cols.flipped()
    if method == "nearest":
        np.take(np.take(image, rows.index[:, 0], 0), cols.index[:, 0], 1, out=out)
        return out
    if method == "bilinear" and not antialias:  # tf.image.resize's: two taps a pixel
        return bilinear.resize_into(image, rows, cols, out)
    pixels = resample.resample(image, rows, cols, scratch=True)  # this thread's work array
    np.rint(pixels, out=pixels)
    np.clip(pixels, 0, 255, out=pixels)
    out[...] = pixels  # an exact cast: the values are integers in [0, 255]
    return out


def _decode_window(
    data: bytes,
    channels: int,
    window: tuple[int, ...],
    full: tuple[int, int],
    min_h: int,
    min_w: int,
    fast_dct: bool,
    header: tuple[int, int, int] | None,
) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    """The decoded pixels around `window` and the window in their coordinates.

    TurboJPEG 3 (`tj3`) decodes only the window's rows and iMCU columns, at the DCT scale
    that `min_h` x `min_w` asks for (0: full size). At full size the decoded region is the
    window itself, so the pixels are `decode_and_crop_jpeg`'s (TF's); at a reduced scale the
    window's edges fall between pixels and the region keeps one more on each side, the
    neighbour the bilinear warp reads there. Without TurboJPEG: the whole image, scaled.
    """
    y, x, h, w = window
    height, width = full
    if tj3.available():
        eighths = 8
        if min_h:
            eighths = next(e for e in (1, 2, 4, 8) if decode.scaled_size(height, e) >= min_h)
        if eighths == 8:
            pixels = tj3.decode(data, channels, window, fast_dct)
            if pixels is not None:
                return pixels, (0.0, 0.0, float(h), float(w))
        else:
            scale_h, scale_w = (
                decode.scaled_size(height, eighths),
                decode.scaled_size(width, eighths),
            )
            fy, fx = scale_h / height, scale_w / width
            y0, x0 = max(math.floor(y * fy) - 1, 0), max(math.floor(x * fx) - 1, 0)
            y1 = min(math.ceil((y + h) * fy) + 1, scale_h)
            x1 = min(math.ceil((x + w) * fx) + 1, scale_w)
            region = (y0, x0, y1 - y0, x1 - x0)
            pixels = tj3.decode(data, channels, region, fast_dct, eighths)
            if pixels is not None:
                return pixels, (y * fy - y0, x * fx - x0, h * fy, w * fx)
    image = decode.decode_jpeg_scaled(data, channels, min_h, min_w, fast_dct, header)
    fy, fx = image.shape[0] / height, image.shape[1] / width
    return image, (y * fy, x * fx, h * fy, w * fx)


# Pillow's antialiased filters equal TF's ScaleAndTranslate kernels (antialias=True).
_PILLOW_FILTERS = {"bilinear": "BILINEAR", "bicubic": "BICUBIC", "lanczos3": "LANCZOS"}


def _pillow_resize(
    data: bytes,
    window: tuple[int, int, int, int],
    full: tuple[int, int],
    size: tuple[int, int],
    flip: bool,
    method: str,
    min_h: int,
    min_w: int,
    fast_dct: bool,
    out: np.ndarray,
) -> np.ndarray | None:
    """The antialiased resize by Pillow's C resampler (GIL released, ~2x NumPy's speed).

    libjpeg-turbo decodes into 4-byte pixels that Pillow wraps without a copy; Pillow then
    crops (a fractional box), resizes and flips in C. Its kernels equal TF's antialiased
    ones; at the window's edges Pillow reads the real neighbouring pixels where a crop
    followed by a resize repeats the edge. None when simplejpeg or Pillow is missing.
    """
    if decode.simplejpeg_module() is None:
        return None
    try:
        from PIL import Image
    except ImportError:
        return None
    pixels = decode.decode_jpeg_rgbx(data, min_h, min_w, fast_dct)
    scaled_h, scaled_w = pixels.shape[:2]
    fy, fx = scaled_h / full[0], scaled_w / full[1]
    y, x, h, w = window
    source = Image.frombuffer("RGBX", (scaled_w, scaled_h), pixels, "raw", "RGBX", 0, 1)
    box = (x * fx, y * fy, (x + w) * fx, (y + h) * fy)
    filter_ = getattr(Image.Resampling, _PILLOW_FILTERS[method])
    resized = source.resize((size[1], size[0]), filter_, box=box)
    if flip:
        resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    # Pillow packs RGBX to RGB in C; a strided NumPy slice of the RGBX array took 8x longer.
    out[...] = np.frombuffer(resized.tobytes("raw", "RGB"), np.uint8).reshape(out.shape)
    return out


def decode_random_resized_crop(
    contents: Any,
    size: Any,
    bounding_boxes: Any = ((0.0, 0.0, 1.0, 1.0),),
    min_object_covered: float = 0.1,
    aspect_ratio_range: tuple[float, float] = (0.75, 1.33),
    area_range: tuple[float, float] = (0.05, 1.0),
    max_attempts: int = 100,
    random_flip: bool = True,
    seed: int | None = None,
    channels: int = 3,
    antialias: bool = False,
    scaled_decode: bool = True,
    dct_method: str = "",
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Inception's training crop of a JPEG (TF's ResNet-50 preprocessing), fused, as uint8.

    `sample_distorted_bounding_box` on the JPEG's header, then `decode_crop_resize_flip`
    with a random left-right flip: what TF's official ResNet-50 input pipeline does with
    `decode_and_crop_jpeg`, `random_flip_left_right` and a bilinear resize, in one pass.
    The resize is TF2's `tf.image.resize` (half-pixel centres), not the TF1
    `tf.compat.v1.image.resize(align_corners=False)` the official code calls. Inside
    `Dataset.map` the crop and flip are functions of the element's position.

    Args:
      contents: the JPEG's bytes.
      size: the output (height, width), e.g. (224, 224).
      bounding_boxes: boxes [ymin, xmin, ymax, xmax] in [0, 1] (default: the whole image).
      min_object_covered, aspect_ratio_range, area_range, max_attempts: as
        `sample_distorted_bounding_box` (defaults: TF's ResNet preprocessing).
      random_flip: flip left-right with probability 1/2.
      seed: an op-level seed (int) or None.
      channels: 1 or 3.
      antialias: as `resize`'s, and False by default as there: `tf.image.resize`'s
        bilinear (two taps per pixel, one OpenCV call). True filters the downscale
        (Pillow's resampler in C; about twice the CPU per ImageNet-sized photo, the
        benchmark's --stages).
      scaled_decode: decode at a reduced DCT scale when the window allows (faster; the
        pixels then differ from a full decode's by a few levels). False decodes at full
        size, so the result is `resize(decode_and_crop_jpeg(...))`'s rounded to uint8.
      dct_method: TF's: "" (the default) and "INTEGER_FAST" decode with libjpeg's fast
        integer IDCT, "INTEGER_ACCURATE" with the accurate one.
      out: an optional preallocated uint8 output.

    Returns:
      A uint8 array (height, width, channels).

    Example:
      >>> ds = records.map(lambda r: (decode_random_resized_crop(r["image"], (224, 224)),
      ...                             r["label"]), num_parallel_calls=AUTOTUNE)
    """
    data = decode.as_bytes(contents, "decode_random_resized_crop")
    fast = decode.check_dct_method(dct_method)
    rng = randomness.generator(seed)
    header = decode.jpeg_header(data)  # parsed once for the crop and the decode
    height, width, _ = decode.jpeg_shape(data, header)
    window = boxes._crop_window(
        rng,
        height,
        width,
        bounding_boxes,
        min_object_covered,
        aspect_ratio_range,
        area_range,
        max_attempts,
        True,
    )
    flip = bool(random_flip and rng.random() < 0.5)  # uniform(rng, 0, 1)'s number, cheaper
    decode.check_channels(channels, (1, 3))
    out_size = decode.as_ints(size, 2)
    return _decode_crop_resize_flip(
        data, window, out_size, flip, channels, "bilinear", antialias, scaled_decode, fast, out,
        header,
    )  # fmt: skip
