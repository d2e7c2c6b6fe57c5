"""The 1,797 8x8 UCI handwritten digits, shipped inside the package: a dataset that is
always there, offline, for the main job's fallback, examples and tests.

The data (`data/digits.csv.gz`, 57 KB) is the copy scikit-learn ships, licensed CC BY 4.0
by the UCI repository; `data/PROVENANCE.md` says where it comes from.
"""

from __future__ import annotations

import gzip
import hashlib
from importlib import resources

import numpy as np

SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"
NUM_EXAMPLES = 1797
IMAGE_SHAPE = (8, 8)
MAX_PIXEL = 16  # each pixel counts the "on" pixels of a 4x4 block of the original 32x32 bitmap
TEST_FRACTION = 0.2
SPLIT_SEED = 0

Split = tuple[np.ndarray, np.ndarray]


def _read() -> tuple[np.ndarray, np.ndarray]:
    raw = resources.files("phalanx._src.datasets").joinpath("data/digits.csv.gz").read_bytes()
    if hashlib.sha256(raw).hexdigest() != SHA256:
        raise ValueError(
            "phalanx's embedded digits.csv.gz does not match its recorded sha256; the "
            "installation is damaged, reinstall phalanx"
        )
    table = np.loadtxt(gzip.decompress(raw).decode().splitlines(), delimiter=",", dtype=np.uint8)
    return table[:, :-1].reshape(-1, *IMAGE_SHAPE), table[:, -1]


def load_data() -> tuple[Split, Split]:
    """Loads the digits in Keras's layout, with a fixed held-out test split.

    The split is a seeded permutation (the same on every machine and call): 20 % of the
    examples (359) are the test set, the other 1,438 the training set.

    Returns:
      `((x_train, y_train), (x_test, y_test))`: x uint8 (N, 8, 8) with values 0..16, y uint8
      with values 0..9.

    Raises:
      ValueError: the embedded file is damaged (its checksum does not match).

    Example:
      >>> (x_train, y_train), (x_test, y_test) = phalanx.datasets.digits.load_data()
      >>> x_train.shape, x_test.shape, int(x_train.max())
      ((1438, 8, 8), (359, 8, 8), 16)
    """
    x, y = _read()
    order = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    n_test = round(TEST_FRACTION * len(x))
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])
