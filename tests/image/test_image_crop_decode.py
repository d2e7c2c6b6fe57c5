"""decode_and_crop_jpeg's cropped decode (TurboJPEG 3) against tf.image.decode_and_crop_jpeg."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest

from phalanx import image
from phalanx._src.image import decode, fused, tj3

needs_tj3 = pytest.mark.skipif(
    not tj3.available(), reason="the cropped decode needs libturbojpeg (phalanx's `image` extra)"
)


def _photo(rng: np.random.Generator, height: int, width: int, gray: bool) -> np.ndarray:
    """Smooth colour fields plus noise: chroma that upsampling and the IDCT both shape."""
    y, x = np.mgrid[0:height, 0:width]
    phase = rng.uniform(0, 6, 3)
    smooth = np.stack(
        [128 + 90 * np.sin(x / rng.uniform(3, 20) + p) * np.cos(y / 9 - p) for p in phase], -1
    )
    pixels = np.clip(smooth + rng.normal(0, 12, smooth.shape), 0, 255).astype(np.uint8)
    return pixels[:, :, 0] if gray else pixels


def _pillow_jpeg(pixels: np.ndarray, rng: np.random.Generator) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(
        buffer,
        format="JPEG",
        quality=int(rng.integers(40, 100)),
        subsampling=int(rng.integers(0, 3)),  # 4:4:4, 4:2:2, 4:2:0
        progressive=bool(rng.random() < 0.3),
    )
    return buffer.getvalue()


def _windows(rng: np.random.Generator, height: int, width: int, count: int):
    for _ in range(count):
        h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        yield int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w


def _compare_with_tf(tf, files: list[bytes], rng: np.random.Generator) -> set[str]:
    """Asserts our crops equal TF's for every file, window, channels and dct_method; returns
    the dct_methods whose pixels differed from the fast IDCT's somewhere."""
    differs = set()
    for data in files:
        height, width, _ = image.extract_jpeg_shape(data).tolist()
        for window in _windows(rng, height, width, 2):
            for channels in (0, 1, 3):
                fast = None
                for dct_method in ("", "INTEGER_FAST", "INTEGER_ACCURATE"):
                    ours = image.decode_and_crop_jpeg(data, window, channels, dct_method)
                    theirs = tf.image.decode_and_crop_jpeg(
                        data, list(window), channels=channels, dct_method=dct_method
                    ).numpy()
                    np.testing.assert_array_equal(ours, theirs, err_msg=f"{window} {dct_method}")
                    fast = ours if fast is None else fast
                    if not np.array_equal(ours, fast):
                        differs.add(dct_method)
    return differs


@needs_tj3
def test_crops_equal_tensorflows_over_random_jpegs(monkeypatch):
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "true")  # as TF's first op sets it
    tf = pytest.importorskip("tensorflow", reason="compares with TF's own kernel")
    rng = np.random.default_rng(42)
    files = []
    for _ in range(40):
        height, width = (int(v) for v in rng.integers(1, 90, 2))
        files.append(_pillow_jpeg(_photo(rng, height, width, rng.random() < 0.2), rng))
    files.append(_pillow_jpeg(_photo(rng, 375, 500, False), rng))  # ImageNet-sized
    differs = _compare_with_tf(tf, files, rng)
    assert differs == {"INTEGER_ACCURATE"}  # dct_method reached the decoder, as TF's


@needs_tj3
def test_crops_equal_tensorflows_for_other_samplings_and_restart_markers(monkeypatch):
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    tf = pytest.importorskip("tensorflow", reason="compares with TF's own kernel")
    turbojpeg = pytest.importorskip("turbojpeg", reason="its encoder writes 4:4:0 and 4:1:1")
    rng = np.random.default_rng(7)
    files = []
    for sampling in ("Y440", "Y411", "Y441", "Y420"):
        for _ in range(4):
            height, width = (int(v) for v in rng.integers(1, 80, 2))
            pixels = np.ascontiguousarray(_photo(rng, height, width, False))
            files.append(
                turbojpeg.compress(
                    pixels,
                    int(rng.integers(50, 100)),
                    getattr(turbojpeg.SAMP, sampling),
                    progressive=bool(rng.random() < 0.3),
                    restartrows=int(rng.integers(0, 3)),
                )
            )
    _compare_with_tf(tf, files, rng)


@needs_tj3
def test_an_unaligned_window_is_a_view_of_a_wider_decode():
    rng = np.random.default_rng(0)
    data = _pillow_jpeg(_photo(rng, 64, 96, False), np.random.default_rng(1))
    crop = image.decode_and_crop_jpeg(data, [3, 21, 40, 50], 3)
    assert crop.shape == (40, 50, 3) and crop.base is not None
    assert crop.base.shape[1] > 50  # decoded from the iMCU boundary left of x = 21


def test_a_window_outside_the_image_is_an_error_that_says_so():
    data = _pillow_jpeg(_photo(np.random.default_rng(0), 30, 40, False), np.random.default_rng(1))
    with pytest.raises(ValueError, match=r"does not lie inside the 30x40 image"):
        image.decode_and_crop_jpeg(data, [10, 0, 21, 40])
    with pytest.raises(ValueError, match="not JPEG"):
        image.decode_and_crop_jpeg(data[:200] + b"\x00" * 50, [0, 0, 5, 5])


def test_without_turbojpeg_the_window_of_the_whole_decode(monkeypatch):
    data = _pillow_jpeg(_photo(np.random.default_rng(3), 50, 70, False), np.random.default_rng(4))
    cropped = image.decode_and_crop_jpeg(data, [5, 9, 30, 40], 3)
    monkeypatch.setattr(tj3, "_loaded", None)
    assert not tj3.available() and "none" in image.backends()["jpeg_crop"]
    whole = image.decode_and_crop_jpeg(data, [5, 9, 30, 40], 3)
    np.testing.assert_array_equal(whole, image.decode_jpeg(data, 3)[5:35, 9:49])
    # Equal away from the window's edges, where only chroma upsampling's context differs.
    np.testing.assert_array_equal(whole[4:-4, 4:-4], cropped[4:-4, 4:-4])


@needs_tj3
def test_each_thread_decodes_with_its_own_handle():
    rng = np.random.default_rng(5)
    files = [_pillow_jpeg(_photo(rng, 60, 80, False), rng) for _ in range(8)]
    windows = [next(_windows(rng, 60, 80, 1)) for _ in files]
    expected = [image.decode_and_crop_jpeg(f, w, 3) for f, w in zip(files, windows, strict=True)]
    results: dict[int, list] = {}

    def work(index: int) -> None:
        order = list(range(len(files)))[index % 3 :] + list(range(len(files)))[: index % 3]
        results[index] = [(k, image.decode_and_crop_jpeg(files[k], windows[k], 3)) for k in order]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for pairs in results.values():
        for k, crop in pairs:
            np.testing.assert_array_equal(crop, expected[k])


@needs_tj3
@pytest.mark.parametrize("size", [(24, 24), (60, 40), (224, 224)])
def test_the_fused_crop_decodes_the_window_alone_where_a_whole_decode_would(monkeypatch, size):
    # The region decoded around the window, then the warp, against the whole image's decode
    # at the same scale: equal up to the warp's rounding inside; along the output's edges a
    # full-scale window's own decode upsamples chroma from its edge, as TF's crop does.
    rng = np.random.default_rng(11)
    data = _pillow_jpeg(_photo(rng, 375, 500, False), rng)
    windows = list(_windows(rng, 375, 500, 12))
    region = [fused.decode_crop_resize_flip(data, w, size, flip=True) for w in windows]
    monkeypatch.setattr(tj3, "_loaded", None)
    for window, ours in zip(windows, region, strict=True):
        whole = fused.decode_crop_resize_flip(data, window, size, flip=True)
        difference = np.abs(ours.astype(int) - whole.astype(int))
        assert difference[2:-2, 2:-2].max() <= 1 and difference.mean() < 0.05, window


def test_dct_method_and_channels_are_checked_first():
    with pytest.raises(ValueError, match="dct_method"):
        decode.decode_and_crop_jpeg(b"", [0, 0, 1, 1], dct_method="FLOAT")
    with pytest.raises(ValueError, match="channels"):
        decode.decode_and_crop_jpeg(b"", [0, 0, 1, 1], channels=4)


@needs_tj3
def test_a_ported_function_parses_each_header_once(monkeypatch):
    released, held, carrier = tj3._loaded
    parses = []

    class Counting:
        def __getattr__(self, name):
            return getattr(held, name)

        def tj3DecompressHeader(self, handle, data, size):
            parses.append(size)
            return held.tj3DecompressHeader(handle, data, size)

    monkeypatch.setattr(tj3, "_loaded", (released, Counting(), carrier))
    rng = np.random.default_rng(8)
    files = [_pillow_jpeg(_photo(rng, 40, 56, False), rng) for _ in range(3)]
    for data in files:  # extract_jpeg_shape, then decode_and_crop_jpeg, as TF's ResNet code
        shape = image.extract_jpeg_shape(data)
        crop = image.decode_and_crop_jpeg(data, [2, 3, 30, 40], 3)
        assert shape.tolist() == [40, 56, 3] and crop.shape == (30, 40, 3)
    assert parses == [len(data) for data in files]
    image.decode_and_crop_jpeg(files[-1], [0, 0, 8, 8], 3)  # the decode used the header up
    assert len(parses) == 4
