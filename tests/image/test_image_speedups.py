"""The Python fast paths of the random crop equal the NumPy code they replaced."""

from __future__ import annotations

import io
import math
import threading

import numpy as np
import pytest

from phalanx._src.image import boxes, decode, fused, randomness, tj3


def _old_lrint(value):
    return int(np.rint(np.float32(value)))


def _old_random_crop_box(rng, width, height, area_range, aspect_ratio):
    min_area = np.float32(area_range[0]) * np.float32(width * height)
    max_area = np.float32(area_range[1]) * np.float32(width * height)
    crop_h = _old_lrint(math.sqrt(min_area / aspect_ratio))
    max_h = _old_lrint(math.sqrt(max_area / aspect_ratio))
    if _old_lrint(max_h * aspect_ratio) > width:
        max_h = int((width + 0.5 - 1e-7) / aspect_ratio)
        if _old_lrint(max_h * aspect_ratio) > width:
            max_h -= 1
    max_h = min(max_h, height)
    crop_h = min(crop_h, max_h)
    if crop_h < max_h:
        crop_h += int(randomness.integers(rng, max_h - crop_h + 1))
    crop_w = _old_lrint(crop_h * aspect_ratio)
    area = float(crop_w * crop_h)
    if area < min_area:
        crop_h += 1
        crop_w = _old_lrint(crop_h * aspect_ratio)
        area = float(crop_w * crop_h)
    if area > max_area:
        crop_h -= 1
        crop_w = _old_lrint(crop_h * aspect_ratio)
        area = float(crop_w * crop_h)
    if not (min_area <= area <= max_area and 0 < crop_w <= width and 0 < crop_h <= height):
        return None
    y = int(randomness.integers(rng, height - crop_h)) if crop_h < height else 0
    x = int(randomness.integers(rng, width - crop_w)) if crop_w < width else 0
    return x, y, x + crop_w, y + crop_h


def _old_sample(rng, image_size, bounding_boxes, min_object_covered, aspect_ratio_range,
                area_range, max_attempts, use_image_if_no_bounding_boxes):  # fmt: skip
    """boxes._sample as it was with NumPy scalars (validation left out)."""
    height, width = (int(v) for v in np.asarray(image_size).reshape(-1)[:2])
    raw = np.zeros((0, 4), np.float32) if bounding_boxes is None else np.asarray(bounding_boxes)
    raw = raw.reshape(-1, 4).astype(np.float32)
    pixel_boxes = [
        (int(xmin * width), int(ymin * height), int(xmax * width), int(ymax * height))
        for ymin, xmin, ymax, xmax in raw.tolist()
    ] or [(0, 0, width, height)]
    crop = None
    low, high = (float(r) for r in aspect_ratio_range)
    for _ in range(int(max_attempts)):
        ratio = float(np.float32(randomness.uniform(rng, 0.0, 1.0) * (high - low) + low))
        candidate = _old_random_crop_box(rng, width, height, area_range, ratio)
        if candidate is not None and boxes._covers(candidate, pixel_boxes, min_object_covered):
            crop = candidate
            break
    if crop is None:
        crop = (0, 0, width, height)
    x0, y0, x1, y1 = crop
    begin = np.array([y0, x0, 0], np.int32)
    size_out = np.array([y1 - y0, x1 - x0, -1], np.int32)
    box = np.array([[[y0 / height, x0 / width, y1 / height, x1 / width]]], np.float32)
    return begin, size_out, box


def _case(i: int):
    """A random call of _sample: sizes, ranges and boxes, some that no attempt satisfies."""
    r = np.random.default_rng(i)
    height, width = (int(v) for v in r.integers(1, 3000, 2))
    low = float(r.uniform(0.01, 1.0))
    area_range = (low, float(r.uniform(low, 1.0)))
    ratio = float(r.uniform(0.1, 3.0))
    aspect_range = (ratio, ratio * float(r.uniform(1.0, 4.0)))
    corners = np.sort(r.uniform(0, 1, (int(r.integers(0, 4)), 2, 2)), axis=1)
    box_list = [(*low_corner, *high_corner) for low_corner, high_corner in corners.tolist()]
    bounding_boxes = tuple(box_list) if box_list and i % 2 else (box_list or None)
    return (
        (height, width, 3),
        bounding_boxes,
        float(r.choice([0.0, 0.1, 0.5, 0.9, 1.0])),
        aspect_range,
        area_range,
        int(r.integers(1, 20)),
        True,
    )


def test_sample_draws_the_crops_of_the_numpy_version():
    fallbacks = 0
    for i in range(3000):
        args = _case(i)
        if i % 5 == 0:  # NumPy's global RandomState, as an op outside a map uses
            old_rng, new_rng = np.random.RandomState(i), np.random.RandomState(i)
        else:
            old_rng, new_rng = np.random.default_rng(i), np.random.default_rng(i)
        expected = _old_sample(old_rng, *args)
        got = boxes._sample(new_rng, *args)
        for e, g in zip(expected, got, strict=True):
            assert e.dtype == g.dtype and np.array_equal(e, g), (i, args, expected, got)
        assert old_rng.random() == new_rng.random()  # the same draws consumed
        fallbacks += list(got[1][:2]) == list(args[0][:2])
    assert 30 < fallbacks < 2970  # both outcomes ran


def test_float32_rounding_equals_numpy():
    r = np.random.default_rng(0)
    values = np.concatenate([
        r.uniform(-1e6, 1e6, 20000),
        r.integers(-(2**26), 2**26, 20000) + 0.5,  # halves: ties to even
        r.integers(0, 2**40, 2000).astype(float),  # integers beyond float32's 24 bits
    ])  # fmt: skip
    for value in values.tolist():
        assert boxes._f32(value) == float(np.float32(value))
        assert boxes._lrint(value) == _old_lrint(value)


def test_boxes_of_every_form_give_the_same_crop_and_bad_ones_raise():
    forms = [((0.1, 0.2, 0.9, 0.8),), [[0.1, 0.2, 0.9, 0.8]], ([0.1, 0.2, 0.9, 0.8],),
             np.array([[[0.1, 0.2, 0.9, 0.8]]])]  # fmt: skip
    crops = [
        boxes._sample(np.random.default_rng(3), (300, 400, 3), b, 0.5, (0.5, 2), (0.1, 1), 10, 0)
        for b in forms
    ]
    for crop in crops[1:]:
        for a, b in zip(crops[0], crop, strict=True):
            np.testing.assert_array_equal(a, b)
    for bad in (((0.5, 0.0, 0.1, 1.0),), [[0.0, 0.0, 1.5, 1.0]]):
        for _ in range(2):  # a failed check is not remembered as a good one
            with pytest.raises(ValueError, match="bounding_boxes"):
                boxes._sample(np.random.default_rng(0), (9, 9, 3), bad, 0.1, (1, 1), (0.1, 1), 1, 0)


def test_stream_numbers_are_a_pure_function_of_the_words_in_any_thread():
    def draw(words):
        with randomness.element_stream(words) as stream:
            with randomness.element_stream((*words, 9)):  # a nested map's stream
                inner = randomness.generator(None).integers(0, 2**32, 4).tolist()
            outer = stream.generator(None).integers(0, 2**32, 4).tolist()
            seeded = randomness.generator(7).integers(0, 2**32, 4).tolist()
        return outer, inner, seeded

    expected = [draw((1, 2, i)) for i in range(64)]
    got = [None] * 64

    def work(start):
        for i in range(start, 64, 4):
            got[i] = draw((1, 2, i))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got == expected
    every = [tuple(n) for triple in expected for n in triple]
    assert len(set(every)) == len(every)  # each stream its own numbers
    # Pinned: a stream's numbers must not depend on the process (hash seeds, platform).
    assert randomness.stateless_generator((1, 2)).integers(0, 2**32, 2).tolist() == PINNED


PINNED = [3746439556, 2642984519]


def test_random_resized_crop_reads_the_jpeg_header_once(monkeypatch):
    if decode.simplejpeg_module() is None:
        pytest.skip("without simplejpeg the header is Pillow's, read where it is needed")
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((60, 80, 3), np.uint8)).save(buffer, format="JPEG")
    parses = []
    parse = decode.jpeg_header
    monkeypatch.setattr(decode, "jpeg_header", lambda data: parses.append(1) or parse(data))
    with randomness.element_stream((1, 2, 3)):
        fused.decode_random_resized_crop(buffer.getvalue(), (16, 16), antialias=False)
    assert len(parses) == 1


def test_a_ported_calls_array_boxes_and_list_ranges_are_prepared_once():
    # TF's examples pass the boxes as an array and the ranges as lists: neither hashable.
    shape = np.array([375, 500, 3], np.int32)
    box = np.asarray([[[0.0, 0.0, 1.0, 1.0]]], np.float32)
    boxes._remembered_preparation.cache_clear()
    for seed in range(3):
        boxes.sample_distorted_bounding_box(
            shape, box, seed, 0.1, [0.75, 1.33], [0.05, 1.0], 100, True
        )
    info = boxes._remembered_preparation.cache_info()
    assert (info.misses, info.hits) == (1, 2)
    # Another array of the same shape is another key, never a stale preparation.
    boxes.sample_distorted_bounding_box(shape, box / 2, 0, 0.1, [0.75, 1.33], [0.05, 1.0], 100)
    assert boxes._remembered_preparation.cache_info().misses == 2


def test_a_ported_function_parses_each_jpeg_header_once(monkeypatch):
    # The simplejpeg fallback, which releases the GIL even for a header (TurboJPEG 3 keeps
    # it for its header parse, so it needs no cache).
    simplejpeg = decode.simplejpeg_module()
    if simplejpeg is None:
        pytest.skip("without simplejpeg the header is Pillow's")
    from PIL import Image

    monkeypatch.setattr(tj3, "_loaded", None)
    parses = []

    class Counting:
        def __getattr__(self, name):
            return getattr(simplejpeg, name)

        def decode_jpeg_header(self, data):
            parses.append(len(data))
            return simplejpeg.decode_jpeg_header(data)

    monkeypatch.setattr(decode, "_simplejpeg", Counting())
    files = []
    for value in (10, 200):
        buffer = io.BytesIO()
        Image.fromarray(np.full((60, 80, 3), value, np.uint8)).save(buffer, format="JPEG")
        files.append(buffer.getvalue())
    for data in files:  # extract_jpeg_shape, then decode_and_crop_jpeg: as TF's ResNet code
        shape = decode.extract_jpeg_shape(data)
        crop = decode.decode_and_crop_jpeg(data, [1, 2, 30, 40], 3)
        assert shape.tolist() == [60, 80, 3] and crop.shape == (30, 40, 3)
        np.testing.assert_array_equal(crop, decode.decode_jpeg(data, 3)[1:31, 2:42])
    assert len(parses) == 2  # one per file: each file's own header, parsed once
