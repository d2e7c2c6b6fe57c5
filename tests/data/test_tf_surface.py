"""More tf.data names: range, element_spec, get_next_as_optional, output_signature,
Options / with_options, and batch() of a batched dataset (it nests, as in tf.data)."""

from __future__ import annotations

import numpy as np
import pytest

import phalanx
from phalanx.data import Dataset, Options, TensorSpec


def test_range_as_tf_data():
    assert [int(v) for v in Dataset.range(5)] == [0, 1, 2, 3, 4]
    assert [int(v) for v in Dataset.range(2, 8, 3)] == [2, 5]
    assert next(iter(Dataset.range(3))).dtype == np.int64
    assert next(iter(Dataset.range(3, dtype=np.int32))).dtype == np.int32
    assert [list(b) for b in Dataset.range(9).batch(4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    with pytest.raises(TypeError, match=r"range\(\) takes 1 to 3 integers"):
        Dataset.range(1.5)


def test_element_spec():
    ds = Dataset.from_tensor_slices((np.zeros((6, 3), np.float32), np.arange(6)))
    assert ds.element_spec == (TensorSpec((3,), np.float32), TensorSpec((), np.int64))
    assert ds.batch(4).element_spec == (
        TensorSpec((None, 3), np.float32),
        TensorSpec((None,), np.int64),
    )
    assert ds.batch(4, drop_remainder=True).element_spec[0].shape == (4, 3)
    assert iter(ds).element_spec == ds.element_spec
    assert TensorSpec((None, 3), np.float32).is_compatible_with(np.zeros((7, 3), np.float32))
    assert not TensorSpec((None, 3), np.float32).is_compatible_with(np.zeros((7, 2), np.float32))


def test_get_next_as_optional():
    it = iter(Dataset.range(9).batch(4))
    values = []
    while True:
        optional = it.get_next_as_optional()
        if not optional.has_value():
            break
        values.append(list(optional.get_value()))
    assert values == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    with pytest.raises(ValueError, match="holds no value"):
        optional.get_value()
    it = iter(Dataset.range(2))
    assert int(it.get_next()) == 0


def test_from_generator_output_signature_casts_checks_and_gives_the_spec():
    calls = []

    def gen():
        calls.append(1)
        for i in range(5):
            yield np.full(4, i, np.float64), i

    signature = (TensorSpec((4,), np.float32), TensorSpec((), np.int32))
    ds = Dataset.from_generator(gen, output_signature=signature)
    assert ds.element_spec == signature and not calls  # known without running gen
    x, y = next(iter(ds.batch(5)))
    assert x.dtype == np.float32 and x.shape == (5, 4) and y.dtype == np.int32
    legacy = Dataset.from_generator(lambda: (np.random.rand(4) for _ in range(3)), np.float32, [4])
    assert legacy.element_spec == TensorSpec((4,), np.float32)
    assert len(list(legacy)) == 3

    any_shape = Dataset.from_generator(lambda: iter([np.zeros((2, 3)), np.zeros(5)]), np.float32)
    assert [v.shape for v in any_shape] == [(2, 3), (5,)]  # no output_shapes: any shape

    def wrong():
        yield np.zeros(3), 0

    with pytest.raises(ValueError, match=r"shape \(3,\).*output_signature says"):
        next(iter(Dataset.from_generator(wrong, output_signature=signature)))


def test_options_and_auto_shard_policy():
    options = Options()
    policy = phalanx.data.experimental.AutoShardPolicy
    options.experimental_distribute.auto_shard_policy = policy.DATA
    ds = Dataset.range(8).batch(4).with_options(options)
    assert ds.options().experimental_distribute.auto_shard_policy == policy.DATA
    assert Dataset.range(8).options().experimental_distribute.auto_shard_policy == policy.AUTO
    # options survive later transformations, and a second with_options merges
    more = Options()
    more.deterministic = True
    merged = ds.map(lambda x: x).with_options(more).options()
    assert merged.deterministic is True
    assert merged.experimental_distribute.auto_shard_policy == policy.DATA
    with pytest.raises(ValueError, match="auto_shard_policy must be an AutoShardPolicy"):
        options.experimental_distribute.auto_shard_policy = 7
    with pytest.raises(TypeError, match=r"with_options\(\) takes a phalanx\.data\.Options"):
        ds.with_options({"deterministic": True})


def test_batch_of_batches_nests_as_tf_data():
    nested = Dataset.range(12).batch(2).batch(3)
    assert [b.tolist() for b in nested] == [
        [[0, 1], [2, 3], [4, 5]],
        [[6, 7], [8, 9], [10, 11]],
    ]
    assert nested.batch_size == 3 and nested.cardinality == 2
    # streaming pipelines nest too
    streamed = Dataset.range(8).filter(lambda x: x < 6).batch(2).batch(3)
    assert [b.tolist() for b in streamed] == [[[0, 1], [2, 3], [4, 5]]]
    # process_split splits the outer (global) batch only
    split = Dataset.range(12).batch(2).batch(3).process_split(1, 2)
    assert [b.tolist() for b in split] == [[[4, 5]], [[10, 11]]]
    with pytest.raises(ValueError, match=r"elements of one shape.*drop_remainder=True"):
        list(Dataset.range(5).batch(2).batch(3))
