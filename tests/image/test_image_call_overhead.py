"""The cheap paths around the native work behave as the general ones they shortcut."""

from __future__ import annotations

import numpy as np
import pytest
from image_cases import jpeg_bytes

from phalanx import image
from phalanx._src.image import boxes, decode, randomness


def _numpy_ints(values, count):
    return tuple(int(v) for v in np.asarray(values).reshape(count))


@pytest.mark.parametrize(
    "values",
    [(224, 224), [7, -3], (True, 3), (2.7, 3), (np.int64(7), 8), np.array([5, 6]), [[1, 2]],
     (2**70, 1), ("4", "5")],
)  # fmt: skip
def test_as_ints_equals_numpys_conversion(values):
    got = decode.as_ints(values, 2)
    assert got == _numpy_ints(values, 2) and all(type(v) is int for v in got)


@pytest.mark.parametrize("values", [(1, 2, 3), [1], ()])
def test_as_ints_of_a_wrong_length_raises_numpys_error(values):
    with pytest.raises(ValueError, match="reshape"):
        decode.as_ints(values, 2)


def test_window_and_size_as_arrays_give_the_tuples_pixels():
    pixels = np.random.default_rng(0).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    data = jpeg_bytes(pixels, quality=90)
    expected = image.decode_crop_resize_flip(data, (5, 7, 40, 50), (24, 32), flip=True)
    got = image.decode_crop_resize_flip(data, np.array([5, 7, 40, 50]), [24, 32], flip=True)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(
        image.decode_and_crop_jpeg(data, np.array([[5, 7], [40, 50]])),
        image.decode_and_crop_jpeg(data, (5, 7, 40, 50)),
    )


def test_crop_window_of_lists_and_arrays_equals_the_remembered_tuples():
    def crop(boxes_, aspect_ratio_range, area_range):
        rng = np.random.default_rng(1)
        return [
            boxes._crop_window(rng, 375, 500, boxes_, 0.1, aspect_ratio_range, area_range, 10, 1)
            for _ in range(20)
        ]

    expected = crop(((0.0, 0.0, 1.0, 1.0),), (0.75, 1.33), (0.05, 1.0))
    assert crop([[0, 0, 1, 1]], [0.75, 1.33], [0.05, 1.0]) == expected
    assert crop(None, np.array([0.75, 1.33]), np.array([0.05, 1.0])) == expected
    for bad in ((0.5, 0.1), [0.5, 0.1]):
        for _ in range(2):  # a failed check is not remembered as a good one
            with pytest.raises(ValueError, match="area_range"):
                crop(None, (0.75, 1.33), bad)


def test_element_stream_nests_and_turns_stop_iteration_into_runtime_error():
    assert randomness.current_stream() is None
    with randomness.element_stream((1, 2)) as outer:
        assert randomness.current_stream() is outer
        with randomness.element_stream((1, 3)) as inner:
            assert randomness.current_stream() is inner is not outer
        assert randomness.current_stream() is outer
        stop = r"raised StopIteration \(StopIteration\('x'\)\)"
        with pytest.raises(RuntimeError, match=stop), randomness.element_stream((1, 4)):
            raise StopIteration("x")
        assert randomness.current_stream() is outer
        with pytest.raises(KeyError), randomness.element_stream((1, 5)):
            raise KeyError("other errors pass through")
        assert randomness.current_stream() is outer
    assert randomness.current_stream() is None


def test_an_element_stream_builds_generators_only_when_asked(monkeypatch):
    built = []
    make = randomness._generator
    monkeypatch.setattr(randomness, "_generator", lambda words: built.append(words) or make(words))
    with randomness.element_stream((-1, np.uint64(5), 2**64 + 7)):
        assert built == []  # a map without random ops
        first = randomness.generator(None).integers(0, 2**32, 4).tolist()
        randomness.generator(None)
        randomness.generator(3)
    assert built == [(2**64 - 1, 5, 7), (2**64 - 1, 5, 7, 1, 3)]  # the words as uint64s
    with randomness.element_stream((2**64 - 1, 5, 7)):
        assert randomness.generator(None).integers(0, 2**32, 4).tolist() == first
