"""Random image ops: TF's constraints and distributions, seeds and stateless forms."""

from __future__ import annotations

import numpy as np
import pytest

from phalanx import image
from phalanx._src.image import randomness

ARGS = dict(
    min_object_covered=0.1,
    aspect_ratio_range=(3 / 4, 4 / 3),
    area_range=(0.08, 1.0),
    max_attempts=10,
    use_image_if_no_bounding_boxes=True,
)
SHAPE = (375, 500, 3)


def _areas(sample) -> np.ndarray:
    areas = []
    for i in range(400):
        begin, size, _ = sample(i)
        begin, size = np.asarray(begin), np.asarray(size)
        assert begin[2] == 0 and size[2] == -1
        assert begin[0] >= 0 and begin[0] + size[0] <= SHAPE[0]
        assert begin[1] >= 0 and begin[1] + size[1] <= SHAPE[1]
        areas.append(size[0] * size[1] / (SHAPE[0] * SHAPE[1]))
    return np.array(areas)


def test_bounding_box_constraints_hold():
    areas = _areas(
        lambda i: image.stateless_sample_distorted_bounding_box(
            SHAPE, [[[0.0, 0.0, 1.0, 1.0]]], seed=(i, 7), **ARGS
        )
    )
    assert areas.min() >= 0.08 - 1e-6 and areas.max() <= 1.0


def test_bounding_box_distribution_matches_tensorflow():
    tf = pytest.importorskip("tensorflow", reason="TF's sampler is the reference distribution")
    ours = _areas(
        lambda i: image.stateless_sample_distorted_bounding_box(
            SHAPE, [[[0.0, 0.0, 1.0, 1.0]]], seed=(i, 7), **ARGS
        )
    )
    theirs = _areas(
        lambda i: tf.image.stateless_sample_distorted_bounding_box(
            SHAPE, [[[0.0, 0.0, 1.0, 1.0]]], seed=(i, 7), **ARGS
        )
    )
    # 400 samples each: the means of a [0.08, 1] variable agree to a few hundredths.
    assert abs(ours.mean() - theirs.mean()) < 0.05
    assert abs(np.median(ours) - np.median(theirs)) < 0.08


def test_bounding_box_fallback_and_errors():
    begin, size, box = image.sample_distorted_bounding_box(
        SHAPE, None, seed=1, area_range=(0.99, 1.0), aspect_ratio_range=(3.0, 3.0),
        max_attempts=3, use_image_if_no_bounding_boxes=True,
    )  # fmt: skip
    # No crop of aspect 3 covers 99 % of a 4:3 image: the whole image, as TF.
    assert list(begin) == [0, 0, 0] and list(size) == [375, 500, -1]
    np.testing.assert_allclose(box, [[[0, 0, 1, 1]]])
    with pytest.raises(ValueError, match="use_image_if_no_bounding_boxes"):
        image.sample_distorted_bounding_box(SHAPE, None)
    with pytest.raises(ValueError, match="area_range"):
        image.sample_distorted_bounding_box(SHAPE, [[[0, 0, 1, 1]]], area_range=(0.5, 0.1))


def test_stateless_ops_are_pure_functions_of_the_seed():
    pixels = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    for op in (
        lambda s: image.stateless_random_flip_left_right(pixels, s),
        lambda s: image.stateless_random_crop(pixels, (2, 3, 3), s),
        lambda s: image.stateless_random_brightness(pixels, 0.3, s),
        lambda s: image.stateless_random_contrast(pixels, 0.5, 1.5, s),
        lambda s: image.stateless_random_saturation(pixels, 0.5, 1.5, s),
        lambda s: image.stateless_random_hue(pixels, 0.2, s),
    ):
        np.testing.assert_array_equal(op((1, 2)), op((1, 2)))
    flips = {image.stateless_random_flip_left_right(pixels, (i, 0))[0, 0, 0] for i in range(20)}
    assert flips == {pixels[0, 0, 0], pixels[0, -1, 0]}  # both outcomes occur
    with pytest.raises(ValueError, match="two integers"):
        image.stateless_random_flip_left_right(pixels, 5)


def test_element_streams_decide_unseeded_and_seeded_draws():
    pixels = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)

    def draw():
        return [image.random_crop(pixels, (3, 3, 3)), image.random_brightness(pixels, 0.5, 4)]

    with randomness.element_stream((5, 0, 17)):
        first = draw()
    with randomness.element_stream((5, 0, 17)):
        again = draw()
    with randomness.element_stream((5, 0, 18)):
        other = draw()
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(first, other, strict=True))
    assert randomness.current_stream() is None


def test_unseeded_ops_outside_a_map_follow_numpys_global_seed():
    pixels = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    np.random.seed(0)
    first = [image.random_crop(pixels, (2, 2, 3)) for _ in range(5)]
    np.random.seed(0)
    again = [image.random_crop(pixels, (2, 2, 3)) for _ in range(5)]
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)


def test_random_flip_of_a_batch_flips_images_independently():
    batch = np.arange(64 * 2 * 3 * 1, dtype=np.float32).reshape(64, 2, 3, 1)
    flipped = image.stateless_random_flip_left_right(batch, (3, 4))
    same = [np.array_equal(f, b) for f, b in zip(flipped, batch, strict=True)]
    assert 0 < sum(same) < 64
    for f, b, kept in zip(flipped, batch, same, strict=True):
        assert kept or np.array_equal(f, b[:, ::-1])


def test_a_random_flip_that_keeps_the_image_returns_it_as_tfs_cond_does():
    pixels = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    results = [image.stateless_random_flip_left_right(pixels, (i, 0)) for i in range(20)]
    kept = [r for r in results if r is pixels]  # no copy: a pass and a GIL hand-over saved
    flipped = [r for r in results if r is not pixels]
    assert kept and flipped
    for r in flipped:
        np.testing.assert_array_equal(r, pixels[:, ::-1])
        assert not np.shares_memory(r, pixels)
