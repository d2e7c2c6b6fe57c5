"""Fixed inputs and the table of phalanx.image functions checked against tf.image.

Each case is (name, phalanx function of the inputs, TF function of (tf, inputs), atol).
`make_reference.py` runs the TF side once into reference.npz, which the tests use where
TensorFlow is not installed.
"""

from __future__ import annotations

import io

import numpy as np

from phalanx import image

REFERENCE = __file__.replace("image_cases.py", "reference.npz")
STORED_BYTES = 1024  # reference.npz keeps the outputs up to this size (the file stays small)
# The fused bilinear resize against TF's exact formula, in levels: OpenCV's INTER_LINEAR is
# that formula with 11-bit fixed-point weights (0.73 seen); NumPy's float32 taps only round
# (0.5, plus float32 summation order).
BILINEAR_TOLERANCE = {"opencv": 1.0, "numpy": 0.5 + 1e-3}


def inputs() -> dict[str, np.ndarray]:
    """Small deterministic images: smooth gradients plus a pattern, so resizes differ."""
    y, x = np.mgrid[0:10, 0:12]
    red = 127 + 120 * np.sin(x / 3.0) * np.cos(y / 4.0)
    green = (x * 11 + y * 7) % 256
    blue = 255 * ((x // 3 + y // 2) % 2)
    rgb = np.stack([red, green, blue], axis=-1).astype(np.uint8)
    return {"rgb": rgb, "float": rgb.astype(np.float32) / 255.0}


def jpeg_bytes(rgb: np.ndarray, quality: int = 90) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def png_bytes(rgb: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG")
    return buffer.getvalue()


_RESIZES = [
    (size, method, antialias)
    for size in ((4, 7), (13, 17))
    for method in ("bilinear", "nearest", "bicubic", "area", "lanczos3", "gaussian")
    for antialias in (False, True)
    if not (method in ("nearest", "area") and antialias)
]


def cases() -> list[tuple]:
    """(name, phalanx(inputs), tf(tf, inputs), atol) for every checked function."""
    table = [
        ("decode_jpeg3", lambda i: image.decode_jpeg(i["jpeg"], 3),
         lambda tf, i: tf.io.decode_jpeg(i["jpeg"], 3), 0),
        ("decode_jpeg1", lambda i: image.decode_jpeg(i["jpeg"], 1),
         lambda tf, i: tf.io.decode_jpeg(i["jpeg"], 1), 0),
        ("decode_jpeg_ratio2", lambda i: image.decode_jpeg(i["jpeg"], 3, ratio=2),
         lambda tf, i: tf.io.decode_jpeg(i["jpeg"], 3, ratio=2), 0),
        ("extract_jpeg_shape", lambda i: image.extract_jpeg_shape(i["jpeg"]),
         lambda tf, i: tf.image.extract_jpeg_shape(i["jpeg"]), 0),
        ("decode_and_crop_jpeg", lambda i: image.decode_and_crop_jpeg(i["jpeg"], [3, 5, 6, 4], 3),
         lambda tf, i: tf.image.decode_and_crop_jpeg(i["jpeg"], [3, 5, 6, 4], 3), 0),
        ("decode_png", lambda i: image.decode_png(i["png"], 3),
         lambda tf, i: tf.io.decode_png(i["png"], 3), 0),
        ("central_crop", lambda i: image.central_crop(i["rgb"], 0.6),
         lambda tf, i: tf.image.central_crop(i["rgb"], 0.6), 0),
        ("flip_left_right", lambda i: image.flip_left_right(i["rgb"]),
         lambda tf, i: tf.image.flip_left_right(i["rgb"]), 0),
        ("flip_up_down", lambda i: image.flip_up_down(i["rgb"]),
         lambda tf, i: tf.image.flip_up_down(i["rgb"]), 0),
        ("crop_to_bounding_box", lambda i: image.crop_to_bounding_box(i["rgb"], 2, 3, 5, 7),
         lambda tf, i: tf.image.crop_to_bounding_box(i["rgb"], 2, 3, 5, 7), 0),
        ("u8_to_f32", lambda i: image.convert_image_dtype(i["rgb"], np.float32),
         lambda tf, i: tf.image.convert_image_dtype(i["rgb"], tf.float32), 1e-7),
        ("f32_to_u8", lambda i: image.convert_image_dtype(i["float"] * 1.1 - 0.05, np.uint8, True),
         lambda tf, i: tf.image.convert_image_dtype(i["float"] * 1.1 - 0.05, tf.uint8, True), 0),
        ("u8_to_i32", lambda i: image.convert_image_dtype(i["rgb"], np.int32),
         lambda tf, i: tf.image.convert_image_dtype(i["rgb"], tf.int32), 0),
        ("u16_to_u8", lambda i: image.convert_image_dtype(i["rgb"].astype("uint16") * 257, "uint8"),
         lambda tf, i: tf.image.convert_image_dtype(i["rgb"].astype("uint16") * 257, "uint8"), 0),
        ("standardize", lambda i: image.per_image_standardization(i["rgb"]),
         lambda tf, i: tf.image.per_image_standardization(i["rgb"]), 1e-5),
        ("brightness", lambda i: image.adjust_brightness(i["rgb"], 0.2),
         lambda tf, i: tf.image.adjust_brightness(i["rgb"], 0.2), 1),
        ("contrast", lambda i: image.adjust_contrast(i["float"], 1.7),
         lambda tf, i: tf.image.adjust_contrast(i["float"], 1.7), 1e-5),
        ("saturation", lambda i: image.adjust_saturation(i["float"], 0.4),
         lambda tf, i: tf.image.adjust_saturation(i["float"], 0.4), 1e-5),
        ("hue", lambda i: image.adjust_hue(i["float"], 0.3),
         lambda tf, i: tf.image.adjust_hue(i["float"], 0.3), 1e-5),
        ("hue_u8", lambda i: image.adjust_hue(i["rgb"], -0.2),
         lambda tf, i: tf.image.adjust_hue(i["rgb"], -0.2), 1),
        ("rgb_to_hsv", lambda i: image.rgb_to_hsv(i["float"]),
         lambda tf, i: tf.image.rgb_to_hsv(i["float"]), 1e-5),
        ("hsv_to_rgb", lambda i: image.hsv_to_rgb(image.rgb_to_hsv(i["float"])),
         lambda tf, i: tf.image.hsv_to_rgb(tf.image.rgb_to_hsv(i["float"])), 1e-5),
    ]  # fmt: skip
    for size, method, antialias in _RESIZES:
        name = f"resize_{method}_{size[0]}x{size[1]}{'_aa' if antialias else ''}"
        table.append(
            (
                name,
                lambda i, s=size, m=method, a=antialias: image.resize(i["rgb"], s, m, False, a),
                lambda tf, i, s=size, m=method, a=antialias: tf.image.resize(
                    i["rgb"], s, m, False, a
                ),
                # float32 sums in another order: values in [0, 255] agree to ~1e-4.
                2e-3,
            )
        )
    table.append(
        (
            "resize_preserve_aspect",
            lambda i: image.resize(i["rgb"], (6, 6), preserve_aspect_ratio=True),
            lambda tf, i: tf.image.resize(i["rgb"], (6, 6), preserve_aspect_ratio=True),
            2e-3,
        )
    )
    return table


def all_inputs() -> dict:
    values = inputs()
    values["jpeg"] = jpeg_bytes(values["rgb"])
    values["png"] = png_bytes(values["rgb"])
    return values
