"""phalanx.data against tf.data over random op chains (benchmarks/tf_data_parity.py).

Each seed is one random pipeline built alike in both: it must yield tf.data's elements (or
raise where tf.data raises), agree on the cardinality where both know it, and restore
exactly from a JSON state. The suite runs a few dozen seeds (a few seconds); the script runs
hundreds (`python benchmarks/tf_data_parity.py --pipelines 1000`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.data import Dataset

tf = pytest.importorskip("tensorflow", reason="the differential test compares with tf.data")
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def parity():
    import sys

    sys.path.insert(0, str(BENCHMARKS))
    try:
        import tf_data_parity
    finally:
        sys.path.remove(str(BENCHMARKS))
    return tf_data_parity


@pytest.mark.parametrize("seed", range(24))
def test_a_random_pipeline_matches_tf_data(parity, seed):
    result = parity.run_one(seed, Dataset, tf.data.Dataset, tf)
    names = " -> ".join(parity.make_pipeline(seed, Dataset, tf.data.Dataset, tf).names)
    assert result.matched, f"{names}: {result.detail}"
    assert result.resumed in (True, None), names
    assert not result.cardinality.startswith("differ"), f"{names}: {result.cardinality}"
