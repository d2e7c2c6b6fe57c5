"""as_batches: arrays, Datasets, Grain, plain iterables, and tf.data / torch (fakes if absent)."""

from __future__ import annotations

import json

import grain
import numpy as np
import pytest

from phalanx.data import Batches, Dataset, as_batches


def records(n: int = 10) -> list[dict]:
    return [{"x": np.full(2, i, np.float32), "y": np.int32(i)} for i in range(n)]


def ys(batches) -> list[list[int]]:
    return [np.asarray(b["y"]).tolist() for b in batches]


# -- arrays and Datasets --------------------------------------------------------------------


def test_arrays_become_a_batched_dataset():
    x, y = np.zeros((10, 3), np.float32), np.arange(10)
    ds = as_batches((x, y), batch_size=4)
    assert isinstance(ds, Dataset) and ds.batch_size == 4 and len(ds) == 3
    assert [b[1].tolist() for b in ds] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert as_batches({"y": y}, batch_size=4, drop_remainder=True).cardinality == 2
    assert as_batches(y).batch_size == 32  # Keras's default


def test_array_shuffle_is_seeded_and_reshuffles():
    ds = as_batches(np.arange(20), batch_size=20, shuffle=True, seed=1)
    first, second = [b.tolist() for b in ds], [b.tolist() for b in ds]
    again = [b.tolist() for b in as_batches(np.arange(20), batch_size=20, shuffle=True, seed=1)]
    assert first == again and first != second and sorted(first[0]) == list(range(20))


def test_datasets_pass_through_or_get_batched():
    batched = Dataset.from_tensor_slices(np.arange(6)).batch(4)
    assert as_batches(batched) is batched
    unbatched = Dataset.from_tensor_slices(np.arange(6))
    assert as_batches(unbatched, batch_size=4).batch_size == 4
    with pytest.raises(ValueError, match=r"call \.batch\(n\)"):
        as_batches(unbatched)
    with pytest.raises(ValueError, match=r"batch_size=8 was given for a batched Dataset"):
        as_batches(batched, batch_size=8)


# -- Grain ----------------------------------------------------------------------------------


def test_grain_map_dataset():
    batches = as_batches(grain.MapDataset.source(records()).batch(4))
    assert isinstance(batches, Batches) and batches.cardinality == 3
    assert ys(batches) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_grain_iter_dataset_is_checkpointable():
    source = (
        grain.MapDataset.source(records())
        .batch(3)
        .to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2))
    )
    batches = as_batches(source)
    it = iter(batches)
    next(it)
    assert it.checkpointable
    state = json.loads(json.dumps(it.get_state()))
    rest = ys(it)
    it2 = iter(batches)
    it2.set_state(state)
    assert ys(it2) == rest == [[3, 4, 5], [6, 7, 8], [9]]
    it.close()
    it2.close()


def test_grain_data_loader_is_checkpointable():
    sampler = grain.samplers.IndexSampler(
        10, shard_options=grain.sharding.NoSharding(), shuffle=True, num_epochs=1, seed=3
    )
    loader = grain.DataLoader(
        data_source=records(),
        sampler=sampler,
        operations=[grain.transforms.Batch(batch_size=4)],
        worker_count=0,
    )
    it = iter(as_batches(loader))
    next(it)
    state = it.get_state()
    rest = ys(it)
    it2 = iter(as_batches(loader))
    it2.set_state(state)
    assert ys(it2) == rest and len(rest) == 2
    with pytest.raises(ValueError, match="makes its own batches"):
        as_batches(loader, batch_size=4)


# -- generic iterables ----------------------------------------------------------------------


def test_a_list_of_batches_is_re_iterable():
    batches = as_batches([(np.zeros((2, 1)), np.arange(2)), (np.zeros((1, 1)), np.arange(1))])
    assert batches.cardinality == 2
    for _ in range(2):
        assert [b[1].tolist() for b in batches] == [[0, 1], [0]]
    it = iter(batches)
    assert not it.checkpointable
    with pytest.raises(TypeError, match="no get_state"):
        it.get_state()


def test_a_generator_is_checked_and_empty_passes_fail():
    def gen():
        yield {"x": np.zeros((2, 3)), "y": np.arange(2)}
        yield {"x": np.zeros((2, 3)), "y": np.arange(3)}

    it = iter(as_batches(gen()))
    assert next(it)["x"].shape == (2, 3)
    with pytest.raises(ValueError, match=r"batch 1 of the generator: x\['x'\] has 2 rows but"):
        next(it)
    with pytest.raises(ValueError, match=r"yielded no batches.*one-shot"):
        list(as_batches(iter([])))


def test_non_numeric_batch_is_rejected():
    with pytest.raises(TypeError, match=r"batch 0 of the list: y holds Python objects of type str"):
        list(as_batches([(np.zeros(2), np.array(["a", "b"]))]))


@pytest.mark.parametrize("bad", ["abc", 3, None, object()])
def test_unsupported_types(bad):
    with pytest.raises(TypeError, match=r"cannot read batches from a .*pass NumPy arrays"):
        as_batches(bad)


def test_a_top_level_list_with_batch_size_says_use_a_tuple():
    with pytest.raises(ValueError, match="an iterable of batches"):
        as_batches([np.zeros(4), np.zeros(4)], batch_size=2)


# -- tf.data and torch, through fakes (the libraries are optional) --------------------------


class FakeTFDataset:
    """What phalanx relies on in tf.data: `as_numpy_iterator()`."""

    __module__ = "tensorflow.python.data.ops.dataset_ops"

    def __len__(self) -> int:
        return 2

    def __iter__(self):
        raise AssertionError("a tf.data dataset must be read through as_numpy_iterator()")

    def as_numpy_iterator(self):
        yield np.zeros((2, 3), np.float32), np.array([0, 1])
        yield np.zeros((1, 3), np.float32), np.array([2])


class FakeTensor:
    """A torch.Tensor-like leaf that only converts through detach().cpu().numpy()."""

    __module__ = "torch"

    def __init__(self, array: np.ndarray):
        self._array = array

    def detach(self) -> FakeTensor:
        return self

    def cpu(self) -> FakeTensor:
        return self

    def numpy(self) -> np.ndarray:
        return self._array

    def __array__(self, *args, **kwargs):
        raise AssertionError("torch tensors that require grad cannot go through np.asarray")


class FakeDataLoader:
    __module__ = "torch.utils.data.dataloader"
    batch_size = 2

    def __len__(self) -> int:
        return 2

    def __iter__(self):
        # torch's default collate returns a list for (x, y) examples.
        yield [FakeTensor(np.ones((2, 3), np.float32)), FakeTensor(np.array([0, 1]))]
        yield [FakeTensor(np.ones((1, 3), np.float32)), FakeTensor(np.array([2]))]


def test_tf_data_through_as_numpy_iterator():
    batches = as_batches(FakeTFDataset())
    assert batches.cardinality == 2
    assert [b[1].tolist() for b in batches] == [[0, 1], [2]]
    with pytest.raises(ValueError, match=r"a tf\.data dataset, which makes its own batches"):
        as_batches(FakeTFDataset(), batch_size=2)


def test_torch_data_loader_tensors_become_numpy_tuples():
    batches = as_batches(FakeDataLoader())
    out = list(batches)
    assert all(type(b) is tuple for b in out)
    assert [b[1].tolist() for b in out] == [[0, 1], [2]]
    assert out[0][0].dtype == np.float32 and out[0][0].shape == (2, 3)
    with pytest.raises(ValueError, match="a torch DataLoader"):
        as_batches(FakeDataLoader(), batch_size=2)


def test_real_torch_data_loader_when_installed():
    torch = pytest.importorskip("torch")
    data = torch.utils.data.TensorDataset(torch.arange(6.0).reshape(3, 2), torch.arange(3))
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    assert [b[1].tolist() for b in as_batches(loader)] == [[0, 1], [2]]


def test_real_tf_data_when_installed():
    tf = pytest.importorskip("tensorflow")
    ds = tf.data.Dataset.from_tensor_slices((np.zeros((3, 2)), np.arange(3))).batch(2)
    assert [b[1].tolist() for b in as_batches(ds)] == [[0, 1], [2]]
