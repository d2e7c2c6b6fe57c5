"""The fused JPEG path (decode_crop_resize_flip) against the unfused ops and TF's pipeline."""

from __future__ import annotations

import numpy as np
import pytest
from image_cases import BILINEAR_TOLERANCE, jpeg_bytes

from phalanx import image
from phalanx._src.image import tj3


def _photo(height: int = 150, width: int = 200) -> bytes:
    """A JPEG with smooth content and detail, as photos have (generated, never downloaded)."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:height, 0:width]
    smooth = np.stack(
        [128 + 100 * np.sin(x / 17 + c) * np.cos(y / 23 - c) for c in range(3)], axis=-1
    )
    pixels = np.clip(smooth + rng.normal(0, 6, smooth.shape), 0, 255).astype(np.uint8)
    return jpeg_bytes(pixels, quality=92)


@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("window", [(10, 20, 90, 120), (0, 0, 150, 200), (37, 61, 40, 33)])
def test_full_decode_equals_the_unfused_ops(window, flip, backend):
    data = _photo()
    fused = image.decode_crop_resize_flip(data, window, (32, 48), flip=flip, scaled_decode=False)
    crop = image.decode_and_crop_jpeg(data, window, channels=3)
    reference = image.resize(crop, (32, 48))
    if flip:
        reference = image.flip_left_right(reference)
    assert fused.dtype == np.uint8 and fused.shape == (32, 48, 3)
    assert np.abs(fused - reference).max() <= BILINEAR_TOLERANCE[backend]


def test_matches_tensorflow_resnet_preprocessing(monkeypatch):
    # TF's first op sets TF_FORCE_GPU_ALLOW_GROWTH (Keras's loader); undone after the test.
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    tf = pytest.importorskip("tensorflow", reason="compares with TF's own ops where installed")
    data = _photo()
    window = [10, 20, 90, 120]
    crop = tf.image.decode_and_crop_jpeg(data, window, channels=3)
    theirs = tf.image.flip_left_right(tf.image.resize(crop, (32, 48))).numpy()
    ours = image.decode_crop_resize_flip(data, window, (32, 48), flip=True, scaled_decode=False)
    difference = np.abs(ours - theirs)
    # With TurboJPEG the window is decoded as TF's kernel decodes it: only the uint8
    # rounding is left (OpenCV's 11-bit weights: within 1 level). A whole decode's chroma
    # upsampling differs along the window's edge (up to 4 levels on ~0.5 % of the pixels).
    assert difference.max() <= (1.0 if tj3.available() else 4.5) and difference.mean() < 0.3


def test_scaled_decode_stays_close_to_the_full_decode():
    data = _photo(300, 400)
    window = (0, 0, 300, 400)  # 8x the output: decoded at 1/8 scale
    scaled = image.decode_crop_resize_flip(data, window, (36, 48), antialias=True)
    full = image.decode_crop_resize_flip(
        data, window, (36, 48), antialias=True, scaled_decode=False
    )
    difference = np.abs(scaled.astype(int) - full.astype(int))
    # The DCT-domain scale is a box-like filter, the antialiased kernel a triangle: close.
    assert difference.mean() < 6 and difference.max() < 48


def test_writes_into_a_preallocated_output_and_checks_it():
    data = _photo()
    out = np.zeros((16, 16, 3), np.uint8)
    result = image.decode_crop_resize_flip(data, (0, 0, 150, 200), (16, 16), out=out)
    assert result is out and out.any()
    with pytest.raises(ValueError, match="out must be a uint8 array of shape"):
        image.decode_crop_resize_flip(data, (0, 0, 150, 200), (16, 16), out=out[:8])


def test_rejects_a_window_outside_the_image():
    with pytest.raises(ValueError, match="does not lie inside the 150x200 image"):
        image.decode_crop_resize_flip(_photo(), (100, 0, 60, 10), (8, 8))


def test_grayscale_and_nearest():
    data = _photo()
    gray = image.decode_crop_resize_flip(data, (0, 0, 150, 200), (20, 20), channels=1)
    assert gray.shape == (20, 20, 1)
    nearest = image.decode_crop_resize_flip(
        data, (0, 0, 150, 200), (20, 20), method="nearest", scaled_decode=False
    )
    reference = image.resize(image.decode_jpeg(data, 3), (20, 20), "nearest")
    np.testing.assert_array_equal(nearest, reference)


def _crops(data: bytes, count: int, seed: int | None) -> list[np.ndarray]:
    return [image.decode_random_resized_crop(data, (24, 24), seed=seed) for _ in range(count)]


def test_random_resized_crop_is_reproducible_and_in_range():
    from phalanx._src.image import randomness

    data = _photo()
    # Inside a map: the crops are a function of the element's stream (and the op seed).
    with randomness.element_stream((7, 0, 11)):
        first = _crops(data, 3, seed=3)
    with randomness.element_stream((7, 0, 11)):
        again = _crops(data, 3, seed=3)
    with randomness.element_stream((7, 0, 12)):
        other = _crops(data, 3, seed=3)
    assert all(c.shape == (24, 24, 3) and c.dtype == np.uint8 for c in first)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))
    # An op seed gives a sequence, as TF's: successive calls differ.
    assert not np.array_equal(first[0], first[1]) or not np.array_equal(first[1], first[2])
    # Outside a map without a seed: NumPy's global generator, so np.random.seed repeats them.
    np.random.seed(5)
    unseeded = _crops(data, 3, seed=None)
    np.random.seed(5)
    assert all(np.array_equal(a, b) for a, b in zip(unseeded, _crops(data, 3, None), strict=True))


@pytest.mark.parametrize("method", ["bilinear", "bicubic", "lanczos3"])
def test_the_antialiased_fast_path_matches_the_unfused_ops(method):
    data = _photo()
    window = (10, 20, 90, 120)
    fused = image.decode_crop_resize_flip(
        data, window, (32, 48), flip=True, method=method, antialias=True, scaled_decode=False
    )
    crop = image.decode_and_crop_jpeg(data, window, channels=3)
    reference = image.flip_left_right(image.resize(crop, (32, 48), method, antialias=True))
    difference = np.abs(fused - np.clip(reference, 0, 255))
    # Pillow reads real neighbours at the window's edge where the crop repeats its edge.
    assert difference[2:-2, 2:-2].max() <= 1.0 and difference.max() <= 3.0
    assert difference.mean() < 0.5


def test_without_simplejpeg_pillow_decodes(monkeypatch):
    from phalanx._src.image import decode

    data = _photo()
    with_turbo = image.decode_crop_resize_flip(data, (0, 0, 150, 200), (40, 40), antialias=True)
    monkeypatch.setattr(decode, "_simplejpeg", None)
    assert decode.simplejpeg_module() is None
    pillow = image.decode_crop_resize_flip(data, (0, 0, 150, 200), (40, 40), antialias=True)
    full = image.decode_jpeg(data, 3)
    # Pillow's libjpeg uses the accurate IDCT: within a few levels of the fast one.
    assert np.abs(full.astype(int) - decode.decode_jpeg_scaled(data, 3).astype(int)).max() <= 4
    assert np.abs(pillow.astype(int) - with_turbo.astype(int)).mean() < 2


@pytest.mark.parametrize("dct_method", ["", "INTEGER_ACCURATE"])
def test_random_resized_crop_without_scaling_equals_the_ported_ops(dct_method, backend):
    from phalanx._src.image import randomness

    data = _photo(300, 400)
    words = (3, 1, 4)
    with randomness.element_stream(words):
        fused = image.decode_random_resized_crop(
            data, (48, 40), scaled_decode=False, dct_method=dct_method
        )
    with randomness.element_stream(words):  # the same numbers, drawn by the unfused ops
        begin, size, _ = image.sample_distorted_bounding_box(
            image.extract_jpeg_shape(data), [[[0.0, 0.0, 1.0, 1.0]]], min_object_covered=0.1,
            aspect_ratio_range=(0.75, 1.33), area_range=(0.05, 1.0), max_attempts=100,
        )  # fmt: skip
        window = [begin[0], begin[1], size[0], size[1]]
        crop = image.decode_and_crop_jpeg(data, window, 3, dct_method=dct_method)
        reference = image.resize(image.random_flip_left_right(crop), (48, 40))
    assert np.abs(fused - reference).max() <= BILINEAR_TOLERANCE[backend]


def test_dct_method_is_honoured_and_checked():
    data = _photo(300, 400)
    window = (0, 0, 300, 400)
    fast, accurate = (
        image.decode_crop_resize_flip(data, window, (300, 400), dct_method=m, scaled_decode=False)
        for m in ("INTEGER_FAST", "INTEGER_ACCURATE")
    )
    default = image.decode_crop_resize_flip(data, window, (300, 400), scaled_decode=False)
    assert np.array_equal(default, fast) and not np.array_equal(fast, accurate)
    with pytest.raises(ValueError, match="dct_method must be ''"):
        image.decode_random_resized_crop(data, (8, 8), dct_method="ACCURATE")


def test_backends_name_the_library_of_each_path(monkeypatch):
    from phalanx._src.image import opencv

    paths = image.backends()
    assert set(paths) == {
        "jpeg", "jpeg_crop", "resize", "fused_resize", "fused_antialias", "flip", "png"
    }  # fmt: skip
    if opencv.version() is not None:
        assert "OpenCV" in paths["fused_resize"] and "OpenCV" in paths["resize"]
    monkeypatch.setattr(opencv, "_cv2", None)
    assert image.backends()["fused_resize"].startswith("NumPy")


def test_opencv_runs_one_thread_once_phalanx_calls_it(monkeypatch):
    cv2 = pytest.importorskip("cv2", reason="OpenCV is phalanx's `image` extra")
    from phalanx._src.image import opencv

    monkeypatch.setattr(opencv, "_sequential", False)
    cv2.setNumThreads(2)
    image.resize(np.zeros((20, 30, 3), np.uint8), (8, 8))
    # Its own pool beside the map's threads burned CPU spinning (opencv.py's docstring).
    assert cv2.getNumThreads() == 1
    cv2.setNumThreads(4)  # a user who wants the pool back sets it after the first call
    image.resize(np.zeros((20, 30, 3), np.uint8), (8, 8))
    assert cv2.getNumThreads() == 4
    cv2.setNumThreads(1)
