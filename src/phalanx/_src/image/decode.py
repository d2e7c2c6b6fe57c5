"""JPEG and PNG decoding as tf.io's, with libjpeg-turbo's DCT-domain scaling.

JPEGs are decoded by simplejpeg (libjpeg-turbo; it releases the GIL for the whole decode,
so threads scale) when it is installed, by Pillow otherwise; PNGs and other formats by
Pillow. `dct_method` has TF's meaning: TF's JPEG ops decode with libjpeg's fast integer
IDCT (JDCT_IFAST) unless given "INTEGER_ACCURATE", so "" and "INTEGER_FAST" are the fast
IDCT and "INTEGER_ACCURATE" the accurate one. With simplejpeg, which honours it and
upsamples chroma with libjpeg's "fancy" filter as TF does, the pixels equal
tf.io.decode_jpeg's for the same `dct_method`. Pillow's fallback always uses the accurate
IDCT (within a few levels of the fast one); `backends()` says which decoder runs.

A decoder may also scale by N/8 (N = 1..8) inside the IDCT, which costs a fraction of a full
decode: `decode_jpeg_scaled` picks the smallest such scale that keeps a given region at
least a given size, which is what a crop-then-resize pipeline needs.

`decode_and_crop_jpeg` decodes only the window's rows and iMCU columns, as TF's kernel does,
through libjpeg-turbo's TurboJPEG 3 library (`tj3`: bundled by the `turbojpeg` wheel,
called with ctypes); its pixels equal TF's. Where that library is missing it decodes the
whole image and returns the window as a view.
"""

from __future__ import annotations

import io
import threading
from typing import Any

import numpy as np

from phalanx._src.image import tj3

_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
_SIMPLEJPEG_COLORSPACE = {1: "GRAY", 3: "RGB"}

try:  # libjpeg-turbo with the GIL released; optional (phalanx's `image` extra)
    import simplejpeg as _simplejpeg
except ImportError:  # pragma: no cover - exercised where simplejpeg is missing
    _simplejpeg = None


def pillow_module() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            "decoding images needs Pillow, phalanx's `image` extra: pip install 'phalanx[image]'"
        ) from None
    return Image


def as_bytes(contents: Any, what: str) -> bytes:
    """A file's bytes from Python bytes or the 1-D uint8 array `read_file` returns."""
    if isinstance(contents, np.ndarray):
        if contents.dtype == object and contents.ndim == 0:
            contents = contents.item()
        elif contents.dtype != np.uint8 or contents.ndim != 1:
            raise TypeError(
                f"{what} takes a file's bytes (bytes, or the 1-D uint8 array read_file "
                f"returns), got an array of dtype {contents.dtype} and shape {contents.shape}"
            )
        else:
            return contents.tobytes()
    if isinstance(contents, np.bytes_):
        return bytes(contents)
    if not isinstance(contents, bytes | bytearray | memoryview):
        raise TypeError(
            f"{what} takes a file's bytes (bytes, or read_file(path)), got "
            f"{type(contents).__name__}"
        )
    return bytes(contents) if not isinstance(contents, bytes) else contents


def as_ints(values: Any, count: int) -> tuple[int, ...]:
    """`count` Python ints from a sequence or array, as `np.asarray(values).reshape(count)`.

    A tuple or list of `count` Python ints, the usual argument, skips NumPy's conversion.
    """
    if (
        type(values) in (tuple, list)
        and len(values) == count
        and all(type(v) is int for v in values)
    ):
        return tuple(values)
    if type(values) is np.ndarray and values.size == count and values.dtype.kind in "iu":
        return tuple(values.ravel().tolist())  # extract_jpeg_shape's, a stacked window
    return tuple(int(v) for v in np.asarray(values).reshape(count))


def check_channels(channels: int, allowed: tuple[int, ...] = (0, 1, 3, 4)) -> int:
    if channels not in allowed:
        legal = ", ".join(str(c) for c in allowed[:-1]) + f" or {allowed[-1]}"
        raise ValueError(f"channels must be {legal}, got {channels!r}")
    return int(channels)


def open_pillow(data: bytes, formats: tuple[str, ...] | None, what: str) -> Any:
    """A loaded Pillow image, or a ValueError naming what the bytes were expected to be."""
    image_module = pillow_module()
    try:
        image = image_module.open(io.BytesIO(data), formats=formats)
        image.load()
    except Exception as error:
        kinds = "/".join(formats) if formats else "an image"
        raise ValueError(f"{what}: the bytes are not {kinds} ({error})") from None
    return image


def pillow_to_array(image: Any, channels: int, dtype: Any = np.uint8) -> np.ndarray:
    """A Pillow image as a (height, width, channels) array, channels as tf.io's decoders."""
    check_channels(channels)
    if channels:
        image = image.convert(_MODES[channels])
    elif image.mode not in ("L", "RGB", "RGBA", "I;16", "I"):
        image = image.convert("RGBA" if "A" in image.getbands() else "RGB")
    array = np.asarray(image)
    if array.ndim == 2:
        array = array[:, :, None]
    if np.dtype(dtype) == np.uint16:
        return array.astype(np.uint16) * (257 if array.dtype == np.uint8 else 1)
    return array.astype(dtype, copy=False)


class _LastHeader(threading.local):
    """This thread's last parsed header, by the bytes object: a ported TF function reads the
    same bytes with extract_jpeg_shape and then decode_and_crop_jpeg. simplejpeg releases the
    GIL even for the header's microsecond, and with several threads each release costs a
    hand-over; the second parse is skipped. (bytes are immutable: the same object has the
    same header.)"""

    data: bytes | None = None
    header: tuple[int, int, int] | None = None


_last_header = _LastHeader()


def jpeg_header(data: bytes) -> tuple[int, int, int] | None:
    """(height, width, channels) from the header, None if it cannot tell (Pillow then will).

    TurboJPEG 3 parses it with the GIL kept (a few microseconds); simplejpeg, the fallback,
    releases the GIL even for that.
    """
    if tj3.available():
        parsed = tj3.header(data)
        return None if parsed is None else parsed[:3]
    if _simplejpeg is None:
        return None
    last = _last_header
    if last.data is data:
        return last.header
    try:
        height, width, colorspace, _ = _simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    if colorspace == "Gray":
        header = height, width, 1
    elif colorspace in ("YCbCr", "RGB"):
        header = height, width, 3
    else:
        header = None  # CMYK / YCCK: Pillow converts those
    if type(data) is bytes:
        last.data, last.header = data, header
    return header


def extract_jpeg_shape(contents: Any) -> np.ndarray:
    """A JPEG's (height, width, channels) from its header alone, as tf.image.extract_jpeg_shape.

    Args:
      contents: the file's bytes (`read_file(path)` or Python bytes).

    Returns:
      An int32 array [height, width, channels].

    Raises:
      ValueError: the bytes are not a JPEG.

    Example:
      >>> extract_jpeg_shape(read_file("photo.jpg"))   # array([375, 500, 3], dtype=int32)
    """
    data = as_bytes(contents, "extract_jpeg_shape")
    return np.asarray(jpeg_shape(data, jpeg_header(data)), np.int32)


def jpeg_shape(data: bytes, header: tuple[int, int, int] | None) -> tuple[int, int, int]:
    """(height, width, channels): `jpeg_header(data)` when it parsed one, else Pillow's.

    Callers that parsed the header already pass it here and to `decode_jpeg_scaled`, so
    a fused decode reads it once.
    """
    if header is not None:
        return header
    image_module = pillow_module()
    try:
        image = image_module.open(io.BytesIO(data), formats=("JPEG",))
    except Exception as error:
        raise ValueError(f"extract_jpeg_shape: the bytes are not JPEG ({error})") from None
    return image.height, image.width, len(image.getbands())


def scaled_size(size: int, eighths: int) -> int:
    """libjpeg's output size for `size` pixels scaled by eighths/8 (rounded up)."""
    return -(-size * eighths // 8)


def check_dct_method(dct_method: str) -> bool:
    """Whether `dct_method` (TF's names) asks for libjpeg's fast integer IDCT.

    TF's decode kernels map "" and "INTEGER_FAST" to JDCT_IFAST ("sacrificing image
    quality for speed", their comment says) and "INTEGER_ACCURATE" to JDCT_ISLOW.
    """
    if dct_method not in ("", "INTEGER_FAST", "INTEGER_ACCURATE"):
        raise ValueError(
            f"dct_method must be '' (TF's default: the fast IDCT), 'INTEGER_FAST' or "
            f"'INTEGER_ACCURATE', got {dct_method!r}; e.g. dct_method='INTEGER_ACCURATE'"
        )
    return dct_method != "INTEGER_ACCURATE"


def decode_jpeg_scaled(
    data: bytes,
    channels: int,
    min_height: int = 0,
    min_width: int = 0,
    fast_dct: bool = True,
    header: tuple[int, int, int] | None = None,
) -> np.ndarray:
    """The JPEG decoded at the smallest N/8 scale whose image is at least the given size.

    With min_height = min_width = 0 this is a full decode. Returns a (h, w, channels)
    uint8 array, channels 0 meaning the file's own. `header` is `jpeg_header(data)` when
    the caller has it (None: parsed here).
    """
    if header is None:
        header = jpeg_header(data)
    if header is not None and _simplejpeg is not None and channels in (0, 1, 3):
        want = channels or header[2]
        try:
            array = _simplejpeg.decode_jpeg(
                data,
                colorspace=_SIMPLEJPEG_COLORSPACE[want],
                min_height=min_height,
                min_width=min_width,
                fastdct=fast_dct,
            )
        except ValueError as error:
            raise ValueError(f"decode_jpeg: the bytes are not JPEG ({error})") from None
        return array if array.ndim == 3 else array[:, :, None]
    image = open_pillow_jpeg(data, min_height, min_width)
    return pillow_to_array(image, channels)


def simplejpeg_module() -> Any:
    """simplejpeg, or None where it is not installed."""
    return _simplejpeg


def decode_jpeg_rgbx(data: bytes, min_height: int, min_width: int, fast_dct: bool) -> np.ndarray:
    """A JPEG as (h, w, 4) RGBX uint8 (the layout Pillow wraps without a copy); simplejpeg."""
    try:
        return _simplejpeg.decode_jpeg(
            data,
            colorspace="RGBX",
            min_height=min_height,
            min_width=min_width,
            fastdct=fast_dct,
        )
    except ValueError as error:
        raise ValueError(f"decode_jpeg: the bytes are not JPEG ({error})") from None


def open_pillow_jpeg(data: bytes, min_height: int, min_width: int) -> Any:
    """Pillow's JPEG decode, scaled in the DCT domain by `draft` when a size is asked."""
    image_module = pillow_module()
    try:
        image = image_module.open(io.BytesIO(data), formats=("JPEG",))
        if min_height > 0 or min_width > 0:
            # draft picks the largest reduction that keeps the image >= the requested size.
            image.draft(image.mode, (max(min_width, 1), max(min_height, 1)))
        image.load()
    except Exception as error:
        raise ValueError(f"decode_jpeg: the bytes are not JPEG ({error})") from None
    return image


def decode_jpeg(
    contents: Any, channels: int = 0, ratio: int = 1, dct_method: str = ""
) -> np.ndarray:
    """A JPEG's pixels as a (height, width, channels) uint8 array, as tf.io.decode_jpeg.

    With libjpeg-turbo (simplejpeg) the pixels equal TF's for the same `dct_method`; the
    Pillow fallback always uses the accurate IDCT (within 3 levels of the fast one).
    `backends()["jpeg"]` says which decoder runs.

    Args:
      contents: the file's bytes (`read_file(path)` or Python bytes).
      channels: 0 keeps the file's channels; 1 grayscale, 3 RGB.
      ratio: 1, 2, 4 or 8: decode at 1/ratio scale in the DCT domain (as TF's `ratio`).
      dct_method: as TF's: "" (the default) and "INTEGER_FAST" decode with libjpeg's fast
        integer IDCT, "INTEGER_ACCURATE" with the accurate one.

    Returns:
      A uint8 array (height, width, channels); sizes with `ratio` round up as libjpeg's.

    Raises:
      ValueError: the bytes are not a JPEG, or a bad channels / ratio.

    Example:
      >>> image = decode_jpeg(read_file("photo.jpg"), channels=3)
    """
    check_channels(channels, (0, 1, 3))
    if ratio not in (1, 2, 4, 8):
        raise ValueError(f"ratio must be 1, 2, 4 or 8, got {ratio!r}")
    fast = check_dct_method(dct_method)
    data = as_bytes(contents, "decode_jpeg")
    if ratio == 1:
        return decode_jpeg_scaled(data, channels, fast_dct=fast)
    height, width, _ = extract_jpeg_shape(data)
    eighths = 8 // ratio
    return decode_jpeg_scaled(
        data, channels, scaled_size(int(height), eighths), scaled_size(int(width), eighths), fast
    )


def decode_and_crop_jpeg(
    contents: Any, crop_window: Any, channels: int = 0, dct_method: str = ""
) -> np.ndarray:
    """The window [y, x, height, width] of a JPEG, as tf.image.decode_and_crop_jpeg.

    Decodes only the window's rows and iMCU columns, as TF's kernel, through libjpeg-turbo's
    TurboJPEG 3 library (the `turbojpeg` wheel of phalanx's `image` extra): the pixels then
    equal TF's for every sampling, progressive or not, and each `dct_method` (tested
    against `tf.image.decode_and_crop_jpeg` over random JPEGs). Without that library the
    whole image is decoded (simplejpeg, else Pillow) and the window returned as a view:
    along the window's edges a few pixels then differ from TF's by up to 4 levels, as TF's
    cropped decode upsamples chroma from the window's own edge. `backends()["jpeg_crop"]`
    says which runs.

    Args:
      contents: the file's bytes.
      crop_window: [offset_height, offset_width, target_height, target_width] (ints).
      channels: 0 keeps the file's channels; 1 grayscale, 3 RGB.
      dct_method: as `decode_jpeg`'s.

    Returns:
      A uint8 array (target_height, target_width, channels); a view of a slightly wider
      decode when the window's x offset is not on an iMCU boundary (8 or 16 pixels).

    Raises:
      ValueError: the window does not lie inside the image, or the bytes are not a JPEG.

    Example:
      >>> begin, size, _ = sample_distorted_bounding_box(extract_jpeg_shape(data), boxes)
      >>> window = [begin[0], begin[1], size[0], size[1]]
      >>> crop = decode_and_crop_jpeg(data, window, channels=3)
    """
    y, x, h, w = window = as_ints(crop_window, 4)
    check_channels(channels, (0, 1, 3))
    fast = check_dct_method(dct_method)
    data = as_bytes(contents, "decode_and_crop_jpeg")
    parsed = tj3.header(data) if tj3.available() else None
    if parsed is not None:
        check_window(y, x, h, w, parsed[0], parsed[1], "decode_and_crop_jpeg")
        pixels = tj3.decode(data, channels, window, fast)  # the header parsed just now
        if pixels is not None:
            return pixels
    header = parsed[:3] if parsed is not None else jpeg_header(data)
    image = decode_jpeg_scaled(data, channels, fast_dct=fast, header=header)
    check_window(y, x, h, w, image.shape[0], image.shape[1], "decode_and_crop_jpeg")
    return image[y : y + h, x : x + w]


def check_window(y: int, x: int, h: int, w: int, height: int, width: int, what: str) -> None:
    if y < 0 or x < 0 or h <= 0 or w <= 0 or y + h > height or x + w > width:
        raise ValueError(
            f"{what}: crop window [y={y}, x={x}, height={h}, width={w}] does not lie inside "
            f"the {height}x{width} image; use a window with 0 <= y, y + height <= {height}, "
            f"0 <= x, x + width <= {width}"
        )


def decode_png(contents: Any, channels: int = 0, dtype: Any = np.uint8) -> np.ndarray:
    """A PNG's pixels as a (height, width, channels) array, as tf.io.decode_png.

    Args:
      contents: the file's bytes (`read_file(path)` or Python bytes).
      channels: 0 keeps the file's channels; 1 grayscale, 3 RGB, 4 RGBA.
      dtype: np.uint8 (default) or np.uint16.

    Returns:
      An array (height, width, channels) of `dtype`.

    Raises:
      ValueError: the bytes are not a PNG. ImportError: Pillow is not installed.

    Example:
      >>> image = decode_png(read_file("digit.png"), channels=1)   # (28, 28, 1) uint8
    """
    data = as_bytes(contents, "decode_png")
    return pillow_to_array(open_pillow(data, ("PNG",), "decode_png"), channels, dtype)


def decode_image(contents: Any, channels: int = 0, dtype: Any = np.uint8) -> np.ndarray:
    """Any image Pillow reads (PNG, JPEG, GIF's first frame, BMP) as a 3-D array.

    JPEGs go through `decode_jpeg` (libjpeg-turbo where simplejpeg is installed).

    Args:
      contents: the file's bytes.
      channels: 0 keeps the file's channels; 1, 3 or 4 converts.
      dtype: np.uint8 (default) or np.uint16.

    Returns:
      An array (height, width, channels) of `dtype`.

    Raises:
      ValueError: the bytes are no image Pillow reads.

    Example:
      >>> image = decode_image(read_file(path), channels=3)
    """
    data = as_bytes(contents, "decode_image")
    if data[:3] == b"\xff\xd8\xff" and channels in (0, 1, 3) and np.dtype(dtype) == np.uint8:
        return decode_jpeg_scaled(data, channels)
    return pillow_to_array(open_pillow(data, None, "decode_image"), channels, dtype)
