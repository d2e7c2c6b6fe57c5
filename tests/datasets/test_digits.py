"""The UCI digits shipped inside the package: always there, checked, split the same way."""

import numpy as np
import pytest

from phalanx._src.datasets import digits as digits_lib
from phalanx.datasets import digits


def test_loads_the_embedded_digits_with_a_fixed_split():
    (x_train, y_train), (x_test, y_test) = digits.load_data()
    assert x_train.shape == (1438, 8, 8) and x_test.shape == (359, 8, 8)
    assert x_train.dtype == np.uint8 and y_test.dtype == np.uint8
    assert int(x_train.max()) == 16 and int(x_train.min()) == 0
    labels = np.concatenate([y_train, y_test])
    # The published class counts of the 1,797 images.
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    again = digits.load_data()
    assert np.array_equal(again[1][0], x_test) and np.array_equal(again[0][1], y_train)


def test_a_damaged_copy_is_refused(monkeypatch):
    monkeypatch.setattr(digits_lib, "SHA256", "0" * 64)
    with pytest.raises(ValueError, match="does not match its recorded sha256"):
        digits.load_data()
