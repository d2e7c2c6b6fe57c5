"""libjpeg-turbo's TurboJPEG 3 API through ctypes: a JPEG's crop window decoded alone.

Why: TF's `decode_and_crop_jpeg` decodes only the window's rows and iMCU columns
(`jpeg_crop_scanline`, `jpeg_skip_scanlines`): on ImageNet-sized photos and Inception crops
it does ~3/4 of a full decode's work. No wheel's Python API offers that, but libjpeg-turbo's
own C library does, through `tj3SetCroppingRegion`; this module calls it with ctypes, for
`decode_and_crop_jpeg` and for the fused crops (at a DCT scale there: `tj3SetScalingFactor`).

Where the library comes from: the `turbojpeg` wheel (0.0.2, phalanx's `image` extra on
Linux x86_64, CPython 3.11-3.13) bundles `libturbojpeg.so.0.3.0`, a shared library with the
versioned TurboJPEG 3 ABI (libjpeg-turbo 2.1.92, the 3.0 beta). phalanx uses none of that
package's Python code, only the library it carries; the library is found among the
distribution's files (importlib.metadata), never by a hard-coded path. The risk: the package
is small, built in 2023, and its library a beta; nothing here depends on it. Where it is
missing, fails to load, or fails on a file (an error, a warning, a sampling it cannot crop),
`decode` returns None and the caller decodes the whole image with simplejpeg (or Pillow)
and slices it, as before. `backends()["jpeg_crop"]` says which decoder runs.

Errors come back as return codes (TurboJPEG catches libjpeg's longjmp inside C), so ctypes
calls are safe. Each thread owns its decompressor (TurboJPEG handles are not thread-safe).
The decode itself is a `CDLL` call, which releases the GIL; the microsecond calls around it
(the header, the parameters) are `PyDLL` calls that keep it, so a decode costs one GIL
hand-over, not four.

The pixels: TurboJPEG decodes as TF's kernel does: libjpeg's "fancy" chroma upsampling
(TJPARAM_FASTUPSAMPLE = 0, TF's `fancy_upscaling=True`), the fast integer IDCT unless
asked for the accurate one (TF's `dct_method`), and the window's x offset aligned down to
the iMCU width with the extra columns sliced off afterwards (as TF's `jpeg_crop_scanline`
call does). `tests/image/test_image_crop_decode.py` compares them with
`tf.image.decode_and_crop_jpeg` over random JPEGs.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import threading

import numpy as np

# Distributions that carry libturbojpeg with the TurboJPEG 3 API (see the module docstring).
_CARRIERS = ("turbojpeg",)

_INIT_DECOMPRESS = 1
# TJPARAM values (turbojpeg.h, TurboJPEG 3).
_SUBSAMP, _JPEG_WIDTH, _JPEG_HEIGHT, _COLORSPACE, _FAST_UPSAMPLE, _FAST_DCT = 4, 5, 6, 8, 9, 10
_PF_RGB, _PF_GRAY = 0, 6
_CS_RGB, _CS_YCBCR, _CS_GRAY = 0, 1, 2
# tjMCUWidth: the iMCU width for TJSAMP 4:4:4, 4:2:2, 4:2:0, gray, 4:4:0, 4:1:1, 4:4:1. A crop's
# x offset must be a multiple of it. Other values (unknown samplings) are not cropped.
_MCU_WIDTH = (8, 16, 16, 8, 8, 32, 8)


class _Region(ctypes.Structure):
    _fields_ = (("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int))


class _Scaling(ctypes.Structure):
    _fields_ = (("num", ctypes.c_int), ("denom", ctypes.c_int))


_UNCROPPED = _Region(0, 0, 0, 0)
# TurboJPEG takes reduced fractions: eighths -> its scaling factor.
_SCALES = {8: _Scaling(1, 1), 4: _Scaling(1, 2), 2: _Scaling(1, 4), 1: _Scaling(1, 8)}


def _library() -> tuple[str, str] | None:
    """(path, carrier) of the bundled libturbojpeg of the first installed carrier, or None."""
    for name in _CARRIERS:
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for file in distribution.files or ():
            lower = file.name.lower()
            if (
                lower.startswith("libturbojpeg") and (".so" in lower or lower.endswith(".dylib"))
            ) or (lower.startswith("turbojpeg") and lower.endswith(".dll")):
                return str(distribution.locate_file(file)), f"{name} {distribution.version}"
    return None


def _declare(library: ctypes.CDLL) -> ctypes.CDLL:
    """`library` with the signatures of the TurboJPEG 3 functions used here."""
    handle, data, size = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    signatures = {
        "tj3Init": (handle, [ctypes.c_int]),
        "tj3Destroy": (None, [handle]),
        "tj3Set": (ctypes.c_int, [handle, ctypes.c_int, ctypes.c_int]),
        "tj3Get": (ctypes.c_int, [handle, ctypes.c_int]),
        "tj3DecompressHeader": (ctypes.c_int, [handle, data, size]),
        "tj3SetCroppingRegion": (ctypes.c_int, [handle, _Region]),
        "tj3SetScalingFactor": (ctypes.c_int, [handle, _Scaling]),
        "tj3Decompress8": (
            ctypes.c_int,
            [handle, data, size, ctypes.c_void_p, ctypes.c_int, ctypes.c_int],
        ),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(library, name)  # AttributeError: not the TurboJPEG 3 API
        function.restype, function.argtypes = restype, argtypes
    return library


def _load() -> tuple[ctypes.CDLL, ctypes.PyDLL, str] | None:
    """The library twice (releasing and keeping the GIL) and its carrier, or None."""
    found = _library()
    if found is None:
        return None
    path, carrier = found
    try:
        # One dlopen, two calling conventions: CDLL releases the GIL, PyDLL keeps it.
        return _declare(ctypes.CDLL(path)), _declare(ctypes.PyDLL(path)), carrier
    except (OSError, AttributeError):
        return None


_loaded = _load()


def available() -> bool:
    """Whether TurboJPEG 3 decodes crops in this process."""
    return _loaded is not None


def describe() -> str | None:
    """The library and its carrier, for `backends()`; None where it is not loaded."""
    if _loaded is None:
        return None
    return f"libturbojpeg (TurboJPEG 3 API) from the {_loaded[2]} wheel"


class _Handle:
    """A TurboJPEG decompressor with TF's upsampling, destroyed with its owner."""

    def __init__(self, library: ctypes.PyDLL) -> None:
        self._library = library
        self.value = library.tj3Init(_INIT_DECOMPRESS)
        # TF's fancy_upscaling=True (TurboJPEG's default too, set once for certain).
        if self.value and library.tj3Set(self.value, _FAST_UPSAMPLE, 0) != 0:
            library.tj3Destroy(self.value)
            self.value = None

    def __del__(self) -> None:
        if self.value:
            self._library.tj3Destroy(self.value)


class _Decompressor(threading.local):
    """This thread's decompressor (TurboJPEG handles are not thread-safe), which goes with
    the thread's locals, and the bytes whose header it holds (a ported TF function reads
    the same bytes with `extract_jpeg_shape`, then `decode_and_crop_jpeg`: one parse)."""

    handle: _Handle | None = None
    data: bytes | None = None  # held, so no other object can take its id meanwhile
    parsed: tuple[int, int, int, int] | None = None

    def get(self) -> int | None:
        if self.handle is None:
            self.handle = _Handle(_loaded[1])
        return self.handle.value


_decompressor = _Decompressor()


def header(data: bytes) -> tuple[int, int, int, int] | None:
    """(height, width, channels, TJSAMP) from the JPEG's header, the GIL kept (a few us).

    channels is 1 (grayscale) or 3 (YCbCr or RGB); None for what TurboJPEG cannot read or
    what it does not decode here (CMYK, YCCK: the caller's fallback converts those). The
    thread's decompressor keeps the header for a `decode` of the same bytes, and the same
    bytes object asked again is not parsed again.
    """
    state = _decompressor
    if state.data is data:
        return state.parsed
    handle = state.get() if _loaded is not None else None
    if handle is None:
        return None
    held = _loaded[1]
    state.data = None
    if held.tj3DecompressHeader(handle, data, len(data)) != 0:
        return None
    colorspace = held.tj3Get(handle, _COLORSPACE)
    if colorspace not in (_CS_RGB, _CS_YCBCR, _CS_GRAY):
        return None
    state.parsed = (
        held.tj3Get(handle, _JPEG_HEIGHT),
        held.tj3Get(handle, _JPEG_WIDTH),
        1 if colorspace == _CS_GRAY else 3,
        held.tj3Get(handle, _SUBSAMP),
    )
    if type(data) is bytes:  # immutable: the same object has the same header
        state.data = data
    return state.parsed


def decode(
    data: bytes,
    channels: int,
    window: tuple[int, int, int, int] | None,
    fast_dct: bool,
    eighths: int = 8,
) -> np.ndarray | None:
    """The JPEG's pixels in `window` (y, x, height, width; None: all), or None.

    With `eighths` < 8 (1, 2 or 4) the image is decoded at eighths/8 scale in the DCT
    domain (sizes rounded up, as libjpeg's) and `window` is in that scaled image's pixels.
    `window` must lie inside the (scaled) image: the caller checks it. channels: 0 (the
    file's own), 1 or 3. Returns a (height, width, channels) uint8 array, a view when
    the window's x offset was not on an iMCU boundary; None where TurboJPEG is not loaded
    or does not decode this file, so the caller falls back to a whole decode.
    """
    parsed = header(data)  # this thread's decompressor now holds `data`'s header
    if parsed is None:
        return None
    height, width, own, subsamp = parsed
    released, held, _ = _loaded
    state = _decompressor
    handle = state.handle.value
    channels = channels or own
    if eighths != 8:
        height, width = -(-height * eighths // 8), -(-width * eighths // 8)
    y, x, h, w = (0, 0, height, width) if window is None else window
    if (y, x, h, w) == (0, 0, height, width):
        region, skip = _UNCROPPED, 0
    elif 0 <= subsamp < len(_MCU_WIDTH):
        # Columns decoded left of the window (from the scaled iMCU boundary), sliced off.
        skip = x % -(-_MCU_WIDTH[subsamp] * eighths // 8)
        region = _Region(x - skip, y, w + skip, h)
    else:
        return None  # a sampling TurboJPEG cannot crop
    # Every parameter is set for every decode: none is left from another file's.
    if (
        held.tj3Set(handle, _FAST_DCT, int(fast_dct)) != 0
        or held.tj3SetScalingFactor(handle, _SCALES[eighths]) != 0
        or held.tj3SetCroppingRegion(handle, region) != 0
    ):
        return None
    pixels = np.empty((h, w + skip, channels), np.uint8)
    pitch = (w + skip) * channels
    pixel_format = _PF_RGB if channels == 3 else _PF_GRAY
    failed = released.tj3Decompress8(
        handle, data, len(data), pixels.ctypes.data, pitch, pixel_format
    )
    state.data = None  # the decode used up the header it held
    if failed:
        return None  # an error or a warning: the fallback decoder raises its own
    return pixels[:, skip:] if skip else pixels
