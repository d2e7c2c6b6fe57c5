"""Which native library computes phalanx.image's pixels: a report, and a debug-log line.

The same call gives slightly different pixels with different installs: OpenCV's bilinear
resize into uint8 uses 11-bit fixed-point weights (and, for a window of a DCT-scaled
decode, `warpAffine` at 1/32 pixel), the NumPy fallback float32 taps; libjpeg-turbo through
simplejpeg honours `dct_method`, Pillow's fallback decoder always uses the accurate IDCT.
`backends()` says which path this process takes, so a result can be reproduced (or a
difference explained); the first `resize` or fused decode logs the same at debug level on
the "phalanx.image" logger.
"""

from __future__ import annotations

import importlib.metadata
import logging

from phalanx._src.image import decode, opencv, tj3

_log = logging.getLogger("phalanx.image")
_announced = False


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def backends() -> dict[str, str]:
    """The library behind each of phalanx.image's pixel paths in this process.

    Why: the fused crop's OpenCV resize, the NumPy fallback and Pillow's decoder give pixels
    a level or a few apart. Knowing which ran makes a result reproducible.

    Returns:
      A dict of path -> library (with its version):
      - "jpeg": the JPEG decoder of whole images (`decode_jpeg`, `decode_image`, the fused
        ops, and `decode_and_crop_jpeg` where "jpeg_crop" has no library);
      - "jpeg_crop": `decode_and_crop_jpeg`'s decoder of the window alone (TF's pixels);
      - "resize": `resize(..., "bilinear")` without antialias (the other methods: NumPy);
      - "fused_resize": the bilinear resize of `decode_crop_resize_flip` and
        `decode_random_resized_crop` (antialias=False) into uint8;
      - "fused_antialias": the same with antialias=True (bilinear, bicubic, lanczos3);
      - "flip": `flip_left_right` and the random flips;
      - "png": PNG and other formats.

    Example:
      >>> from phalanx import image
      >>> image.backends()["jpeg"]
      'libjpeg-turbo through simplejpeg 1.9.0 (dct_method honoured; "" is the fast IDCT, as TF)'
    """
    has_pillow = _version("pillow") != "?"
    pillow = f"Pillow {_version('pillow')}" if has_pillow else "none (install Pillow)"
    simplejpeg = decode.simplejpeg_module()
    if simplejpeg is not None:
        jpeg = (
            f"libjpeg-turbo through simplejpeg {simplejpeg.__version__} (dct_method honoured; "
            '"" is the fast IDCT, as TF)'
        )
    elif has_pillow:
        jpeg = f"{pillow}'s libjpeg (always the accurate IDCT, whatever dct_method)"
    else:
        jpeg = "none (install phalanx[image])"
    crop = tj3.describe()
    if crop is not None:
        crop += ": decodes the window's rows and iMCU columns only, as TF's kernel"
    else:
        crop = 'none: the "jpeg" decoder decodes the whole image (install phalanx[image])'
    if opencv.version() is not None:
        cv = f"OpenCV {opencv.version()} (one thread: the map's threads are the parallelism)"
        resize = f"{cv} cv2.resize on float32 (float weights: TF's values to float rounding)"
        fused = (
            f"{cv} cv2.resize INTER_LINEAR into uint8 (11-bit weights, within 1 level of "
            "TF's rounded); cv2.warpAffine at 1/32 pixel for a DCT-scaled decode's window"
        )
        flip = f"{cv} cv2.flip"
    else:
        resize = "NumPy separable taps (float32)"
        fused = "NumPy two-tap bilinear in float32, rounded into uint8"
        flip = "NumPy copy of a reversed view"
    antialias = (
        f"{pillow} resampler (TF's antialiased kernels)"
        if has_pillow and simplejpeg is not None
        else "NumPy separable taps"
    )
    return {
        "jpeg": jpeg,
        "jpeg_crop": crop,
        "resize": resize,
        "fused_resize": fused,
        "fused_antialias": antialias,
        "flip": flip,
        "png": pillow,
    }


def announce() -> None:
    """Logs `backends()` once per process, at debug level (the first resize or fused crop)."""
    global _announced
    if _announced:
        return
    _announced = True
    if _log.isEnabledFor(logging.DEBUG):
        chosen = "; ".join(f"{path}: {library}" for path, library in backends().items())
        _log.debug("phalanx.image pixel paths: %s", chosen)
