"""phalanx.image against tf.image on fixed inputs: live TF when installed, else reference.npz."""

from __future__ import annotations

import numpy as np
import pytest
from image_cases import REFERENCE, all_inputs, cases

CASES = cases()
IDS = [case[0] for case in CASES]


def _check(name: str, ours: np.ndarray, theirs: np.ndarray, atol: float) -> None:
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape, f"{name}: shape {ours.shape} != TF's {theirs.shape}"
    assert ours.dtype == theirs.dtype, f"{name}: dtype {ours.dtype} != TF's {theirs.dtype}"
    difference = np.abs(ours.astype(np.float64) - theirs.astype(np.float64)).max(initial=0)
    assert difference <= atol, f"{name}: max |phalanx - TF| = {difference} > {atol}"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_tensorflow(case, backend):
    tf = pytest.importorskip("tensorflow", reason="TF's outputs are checked live where TF is")
    name, ours, theirs, atol = case
    values = all_inputs()
    _check(name, ours(values), theirs(tf, values).numpy(), atol)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_stored_reference(case, backend):
    """The same comparison without TensorFlow: TF's outputs stored by make_reference.py.

    The stored inputs are the JPEG and PNG bytes TF decoded, so encoders do not matter."""
    name, ours, _, atol = case
    with np.load(REFERENCE) as archive:
        stored = dict(archive)
    if name not in stored:
        pytest.skip(f"{name}'s output is larger than reference.npz stores (checked live)")
    values = all_inputs()
    values["jpeg"] = stored["input_jpeg"].tobytes()
    values["png"] = stored["input_png"].tobytes()
    _check(name, ours(values), stored[name], atol)
