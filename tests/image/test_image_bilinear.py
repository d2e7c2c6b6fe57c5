"""The direct two-tap bilinear resize (TF's resize_bilinear, no antialias) of the fused path."""

from __future__ import annotations

import math

import numpy as np
import pytest
from image_cases import BILINEAR_TOLERANCE as TOLERANCE
from image_cases import jpeg_bytes

from phalanx import image
from phalanx._src.image import opencv, resample


def _tf_bilinear(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """TF's resize_bilinear (half-pixel centres), written out from its formula, float64.

    in = (out + 0.5) * scale - 0.5; lower = max(floor(in), 0); upper = min(ceil(in),
    size - 1); value = lerp(lower, upper, in - floor(in)), rows then columns.
    """

    def axis(length: int, out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        position = (np.arange(out) + 0.5) * (length / out) - 0.5
        lower = np.maximum(np.floor(position), 0).astype(int)
        upper = np.minimum(np.ceil(position), length - 1).astype(int)
        return lower, upper, position - np.floor(position)

    source = pixels.astype(np.float64)
    top, bottom, dy = axis(pixels.shape[0], size[0])
    left, right, dx = axis(pixels.shape[1], size[1])
    rows = source[top] + (source[bottom] - source[top]) * dy[:, None, None]
    return rows[:, left] + (rows[:, right] - rows[:, left]) * dx[None, :, None]


@pytest.mark.parametrize(
    ("size", "out", "start", "extent"),
    [(200, 48, 20.0, 120.0), (150, 32, 10.0, 90.0), (37, 50, 0.0, 37.0), (9, 4, 3.5, 5.25)],
)
def test_bilinear_taps_equal_the_triangle_kernel_taps(size, out, start, extent):
    low = math.floor(start)
    local = min(math.ceil(start + extent), size) - low
    direct = resample.bilinear_taps(local, out, start - low, extent)
    kernel = resample.compact(
        resample.kernel_taps("triangle", local, out, start - low, extent, False)
    )
    signal = np.random.default_rng(0).uniform(0, 255, local)
    np.testing.assert_allclose(
        (signal[direct.index] * direct.weights).sum(1),
        (signal[kernel.index] * kernel.weights).sum(1),
        atol=1e-3,
    )
    assert direct.index.shape == (out, 2) and direct.index.min() >= 0
    assert direct.index.max() < local and np.all(direct.weights >= 0)


@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize(
    "window",
    [(10, 20, 90, 120), (0, 0, 150, 200), (37, 61, 40, 33), (149, 199, 1, 1), (0, 150, 150, 50)],
)
def test_fused_no_antialias_equals_tf_formula_on_the_crop(window, flip, backend):
    rng = np.random.default_rng(1)
    # Extreme pixels (0 and 255 side by side) check that no clip is needed after rounding.
    pixels = np.where(rng.uniform(size=(150, 200, 3)) < 0.5, 0, 255).astype(np.uint8)
    data = jpeg_bytes(pixels, quality=95)
    crop = image.decode_and_crop_jpeg(data, window, 3)  # the pixels the fused op decodes
    reference = _tf_bilinear(crop, (32, 48))
    if flip:
        reference = reference[:, ::-1]
    fused = image.decode_crop_resize_flip(data, window, (32, 48), flip=flip, scaled_decode=False)
    difference = np.abs(fused - reference)
    assert difference.max() <= TOLERANCE[backend] and difference.mean() < 0.3


def test_two_taps_not_summing_to_one_take_the_weighted_path():
    image_ = np.random.default_rng(2).uniform(0, 255, (6, 7, 3)).astype(np.float32)
    rows = resample.Taps(np.arange(6)[:, None], np.ones((6, 1), np.float32))
    index = np.stack([np.arange(4), np.arange(4) + 2], axis=1)
    weights = np.full((4, 2), 0.25, np.float32)  # sum 0.5: not a lerp
    result = resample.resample(image_, rows, resample.Taps(index, weights))
    expected = 0.25 * image_[:, index[:, 0]] + 0.25 * image_[:, index[:, 1]]
    np.testing.assert_allclose(result, expected, rtol=1e-6)


def test_grayscale_goes_through_the_same_two_tap_path(backend):
    rng = np.random.default_rng(3)
    data = jpeg_bytes(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8), quality=95)
    window = (5, 7, 50, 61)
    gray = image.decode_crop_resize_flip(data, window, (20, 30), channels=1, scaled_decode=False)
    crop = image.decode_jpeg(data, 1)[5:55, 7:68]
    assert gray.shape == (20, 30, 1)
    assert np.abs(gray - _tf_bilinear(crop, (20, 30))).max() <= TOLERANCE[backend]


@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("window", [(11, 23, 1001, 1203), (0, 0, 1200, 1600), (300, 700, 900, 900)])
def test_opencv_affine_path_of_a_scaled_decode_equals_the_numpy_taps(window, flip, monkeypatch):
    # A window of >= 2x the output decodes at 1/2..1/8 scale: a fractional window, which
    # OpenCV samples through one warpAffine (1/32-pixel coordinates).
    pytest.importorskip("cv2", reason="OpenCV is phalanx's `image` extra")
    y, x = np.mgrid[0:1200, 0:1600]
    smooth = np.stack([128 + 90 * np.sin(x / 71 + c) * np.cos(y / 57 - c) for c in range(3)], -1)
    data = jpeg_bytes(smooth.astype(np.uint8))
    ours = image.decode_crop_resize_flip(data, window, (224, 224), flip=flip)
    monkeypatch.setattr(opencv, "_cv2", None)
    taps = image.decode_crop_resize_flip(data, window, (224, 224), flip=flip)
    assert np.abs(ours.astype(int) - taps).max() <= 1


def test_an_output_opencv_cannot_write_in_place_takes_the_numpy_path():
    data = jpeg_bytes(np.random.default_rng(5).integers(0, 256, (60, 80, 3), dtype=np.uint8))
    strided = np.zeros((20, 60, 3), np.uint8)[:, ::2]
    assert not opencv.usable(strided)
    result = image.decode_crop_resize_flip(data, (5, 7, 50, 61), (20, 30), out=strided)
    assert result is strided
    expected = image.decode_crop_resize_flip(data, (5, 7, 50, 61), (20, 30))
    assert np.abs(strided.astype(int) - expected).max() <= 1


def test_resize_into_rejects_taps_that_are_not_bilinear():
    from phalanx._src.image import bilinear

    pixels = np.zeros((10, 10, 3), np.uint8)
    three = resample.kernel_taps("triangle", 10, 4, 0.0, 10.0, False)  # 3 taps, uncompacted
    two = resample.bilinear_taps(10, 4, 0.0, 10.0)
    with pytest.raises(ValueError, match="two per output pixel"):
        bilinear.resize_into(pixels, three, two, np.empty((4, 4, 3), np.uint8))


@pytest.mark.parametrize("window", [(40, 60, 300, 400), (0, 0, 375, 500), (100, 300, 150, 120)])
def test_matches_tensorflow_on_an_imagenet_sized_crop(window, monkeypatch):
    # TF's first op sets TF_FORCE_GPU_ALLOW_GROWTH (Keras's loader); undone after the test.
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    tf = pytest.importorskip("tensorflow", reason="compares with TF's own ops where installed")
    rng = np.random.default_rng(4)
    y, x = np.mgrid[0:375, 0:500]
    smooth = np.stack([128 + 90 * np.sin(x / 31 + c) * np.cos(y / 27 - c) for c in range(3)], -1)
    data = jpeg_bytes(np.clip(smooth + rng.normal(0, 5, smooth.shape), 0, 255).astype(np.uint8))
    crop = tf.image.decode_and_crop_jpeg(data, list(window), channels=3)
    theirs = tf.image.flip_left_right(tf.image.resize(crop, (224, 224))).numpy()
    ours = image.decode_crop_resize_flip(data, window, (224, 224), flip=True)
    difference = np.abs(ours - theirs)
    # As test_image_fused's: TF's cropped decode upsamples chroma differently along the
    # window's edge; elsewhere only rounding is left.
    assert difference.max() <= 4.5 and difference.mean() < 0.3


@pytest.mark.parametrize(
    ("shape", "size", "dtype"),
    [
        ((300, 350, 3), (224, 224), np.uint8),  # an Inception crop, shrunk
        ((448, 448, 3), (224, 224), np.float32),  # exactly 2x (OpenCV switches to its area path)
        ((30, 35, 1), (224, 200), np.float32),  # enlarged, one channel
        ((2, 40, 50, 7), (17, 23), np.float64),  # a batch, seven channels, float64 in
    ],
)
def test_resize_bilinear_through_opencv_equals_the_numpy_taps(shape, size, dtype, monkeypatch):
    pytest.importorskip("cv2", reason="OpenCV is phalanx's `image` extra")
    pixels = np.random.default_rng(6).uniform(0, 255, shape).astype(dtype)
    ours = image.resize(pixels, size)
    monkeypatch.setattr(opencv, "_cv2", None)
    taps = image.resize(pixels, size)
    assert ours.dtype == taps.dtype == np.float32 and ours.shape == taps.shape
    # OpenCV's float path weighs in float32 as the taps do: equal to float rounding.
    np.testing.assert_allclose(ours, taps, atol=1e-3, rtol=0)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.int64, np.bool_])
@pytest.mark.parametrize("shape", [(5, 7, 3), (2, 5, 7, 1), (3, 4, 6, 512), (0, 4, 6, 3)])
def test_flips_equal_numpys_reversal(shape, dtype, backend):
    # OpenCV mirrors what it can take (not int64 or bool, at most 512 channels); NumPy the rest.
    rng = np.random.default_rng(7)
    pixels = (rng.uniform(0, 255, shape)).astype(dtype)
    np.testing.assert_array_equal(image.flip_left_right(pixels), pixels[..., ::-1, :])
    flipped = image.stateless_random_flip_left_right(pixels, seed=(1, 2))
    kept = np.all(flipped == pixels, axis=(-3, -2, -1))
    mirrored = np.all(flipped == pixels[..., ::-1, :], axis=(-3, -2, -1))
    assert np.all(kept | mirrored)
    assert image.random_flip_left_right(pixels, seed=4).flags.c_contiguous


def test_an_opencv_call_that_does_not_write_in_place_raises():
    pytest.importorskip("cv2", reason="OpenCV is phalanx's `image` extra")
    pixels = np.zeros((30, 40, 3), np.uint8)
    # An output of another shape than it was told: OpenCV would return a new array.
    wrong = np.empty((12, 16, 3), np.uint8)
    with pytest.raises(RuntimeError, match="did not write into the output"):
        opencv._check_in_place(opencv._cv2.resize(pixels, (17, 12), wrong), wrong, "resize")
    assert opencv.resize_window_into(pixels, (0, 0, 30, 40), True, wrong) is wrong
