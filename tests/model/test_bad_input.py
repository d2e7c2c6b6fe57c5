"""Bad input at the model's boundary gets a phalanx error naming what was received."""

import numpy as np
import pytest
from conftest import build, make_data
from flax import nnx

import phalanx


class _Batches:
    """A plain iterable of host batches (not an in-memory Dataset): checked batch by batch."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def test_feature_shape_mismatch_names_shapes_and_first_layer(one_device):
    model = build(one_device)
    x = np.zeros((16, 7), np.float32)  # the model takes 12 features
    y = np.zeros((16,), np.int32)
    with pytest.raises(ValueError, match=r"cannot take inputs of shape \(8, 7\)") as info:
        model.fit(x, y, batch_size=8, verbose=0)
    assert "takes 12 features on the last axis" in str(info.value)
    assert "dot_general" in str(info.value)  # the original reason, in one line
    with pytest.raises(ValueError, match=r"cannot take inputs of shape \(8, 7\)"):
        model.evaluate(x, y, batch_size=8)


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        (np.array([0, 1, 5, 2]), r"must be in \[0, 5\).*e\.g\. \[5\]"),
        (np.array([0, -1, 3, 2]), r"must be in \[0, 5\).*e\.g\. \[-1\]"),
        (np.array([0.0, 1.5, 3.0, 2.0], np.float32), r"not whole numbers, e\.g\. \[1\.5\]"),
    ],
)
def test_sparse_labels_out_of_range_or_fractional(one_device, labels, match):
    model = build(one_device)
    x, _ = make_data(4)
    with pytest.raises(ValueError, match=match):
        model.fit(x, labels, batch_size=4, verbose=0)
    with pytest.raises(ValueError, match=match):
        model.evaluate(x, labels, batch_size=4)
    assert model.train_step_count == 0


def test_dataset_checked_at_the_first_bad_batch(one_device):
    model = build(one_device)
    x, y = make_data(16)
    bad = y.copy()
    bad[13] = 9
    batches = _Batches([(x[:8], y[:8]), (x[8:], bad[8:])])
    with pytest.raises(ValueError, match=r"must be in \[0, 5\).*e\.g\. \[9\]"):
        model.fit(batches, verbose=0, prefetch=0)
    assert model.train_step_count == 1  # the good batch trained, the bad one stopped fit
    with pytest.raises(ValueError, match=r"must be in \[0, 5\)"):
        model.fit(batches, verbose=0)  # the same through the prefetch thread


def test_whole_float_labels_and_good_data_pass(one_device):
    model = build(one_device)
    x, y = make_data(16)
    model.fit(x, y.astype(np.float32), batch_size=8, verbose=0)
    dataset = phalanx.data.Dataset.from_tensor_slices((x, y)).batch(8)
    logs = model.evaluate(dataset, return_dict=True)
    assert np.isfinite(logs["loss"])


def test_validation_labels_checked_before_training(one_device):
    model = build(one_device)
    x, y = make_data(16)
    with pytest.raises(ValueError, match=r"must be in \[0, 5\)"):
        model.fit(x, y, batch_size=8, validation_data=(x[:4], y[:4] + 5), verbose=0)
    assert model.train_step_count == 0


def test_multi_output_sparse_labels_are_checked_per_output(one_device):
    from test_multi_output import TwoHeads, _data

    x, y_cls, y_reg = _data(8)
    with one_device.scope():
        model = phalanx.Model(TwoHeads(nnx.Rngs(0)))
        model.compile(
            optimizer="sgd",
            loss={"cls": phalanx.losses.SparseCategoricalCrossentropy(True), "reg": "mse"},
        )
    with pytest.raises(ValueError, match=r"labels of output 'cls'.*\[0, 3\)"):
        model.fit(x, {"cls": y_cls + 3, "reg": y_reg}, batch_size=8, verbose=0)
