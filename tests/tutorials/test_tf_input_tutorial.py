"""TensorFlow's "Distributed Input" tutorial (tensorflow/docs, site/en/tutorials/distribute/
input.ipynb), ported with renames only: tf.distribute.MirroredStrategy -> phalanx.Strategy,
tf.data -> phalanx.data, tf.function -> phalanx.function. Each test is one of its cells,
kept as written there, with asserts on what the cell prints (per-replica batch sizes and
values) added after it. The tutorial's 2 virtual CPUs are the test suite's fake devices.

Lines that still differ from the TF original beyond the renames, and why:
- `tf.constant(...)` -> `jnp.asarray(...)`, `a.numpy()` -> `np.asarray(a)`, `tf.float32`
  -> `np.float32`, `tf.TensorShape([4])` -> `[4]`: JAX and NumPy spellings of TF objects.
- in the `get_next_as_optional` and `element_spec` cells, `tf.range` and `tf.print` are
  written `range` and `print` (phalanx.function runs a Python loop over an iterator as
  written), and the printed values are also collected for the asserts.
- the Keras StringLookup cell (`tf.keras.layers` -> `keras.layers`, Keras 3 on JAX, whose
  preprocessing layers run eagerly on the NumPy batches `map` hands them) runs on the
  tutorial's 2 devices (`phalanx.Strategy(jax.devices()[:2])`): its global batch of 4 does
  not split over the suite's 8 or 3. The printed per-replica values are collected for the
  asserts, and a Python-vocabulary variant of the cell follows it.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import phalanx


def _local(strategy, value):
    return [np.asarray(v) for v in strategy.experimental_local_results(value)]


def _split(rows, replicas):
    """tf.distribute's split of a global batch: ceil(rows / replicas) each, the last short."""
    per = -(-rows // replicas)
    return [min(per, max(0, rows - i * per)) for i in range(replicas)]


def test_a_plain_loop_over_a_dataset():
    global_batch_size = 16
    # Create a phalanx.data.Dataset object.
    dataset = phalanx.data.Dataset.from_tensors(([1.0], [1.0])).repeat(100).batch(global_batch_size)

    @phalanx.function
    def train_step(inputs):
        features, labels = inputs
        return labels - 0.3 * features

    # Iterate over the dataset using the for..in construct.
    printed = []
    for inputs in dataset:
        print(train_step(inputs))
        printed.append(np.asarray(train_step(inputs)))
    assert [len(p) for p in printed] == [16] * 6 + [4]
    np.testing.assert_allclose(np.concatenate(printed), 0.7, rtol=1e-6)


def test_experimental_distribute_dataset_splits_the_global_batch():
    global_batch_size = 16
    mirrored_strategy = phalanx.Strategy()

    dataset = phalanx.data.Dataset.from_tensors(([1.0], [1.0])).repeat(100).batch(global_batch_size)
    # Distribute input using the `experimental_distribute_dataset`.
    dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)
    # 1 global batch of data fed to the model in 1 step.
    print(next(iter(dist_dataset)))

    features, _ = next(iter(dist_dataset))
    per_replica = mirrored_strategy.run(lambda x: x, args=(features,))
    replicas = mirrored_strategy.num_replicas_in_sync
    assert [len(v) for v in _local(mirrored_strategy, per_replica)] == _split(16, replicas)


def test_auto_shard_policy_option():
    dataset = phalanx.data.Dataset.from_tensors(([1.0], [1.0])).repeat(64).batch(16)
    options = phalanx.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        phalanx.data.experimental.AutoShardPolicy.DATA
    )
    dataset = dataset.with_options(options)

    policy = dataset.options().experimental_distribute.auto_shard_policy
    assert policy == phalanx.data.experimental.AutoShardPolicy.DATA


def test_distribute_datasets_from_function():
    global_batch_size = 16
    mirrored_strategy = phalanx.Strategy()
    if global_batch_size % mirrored_strategy.num_replicas_in_sync:
        pytest.skip("get_per_replica_batch_size(16) raises on this replica count, as in TF")

    def dataset_fn(input_context):
        batch_size = input_context.get_per_replica_batch_size(global_batch_size)
        dataset = phalanx.data.Dataset.from_tensors(([1.0], [1.0])).repeat(64).batch(16)
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        dataset = dataset.batch(batch_size)
        dataset = dataset.prefetch(2)  # This prefetches 2 batches per device.
        return dataset

    dist_dataset = mirrored_strategy.distribute_datasets_from_function(dataset_fn)

    # batch(16) then batch(per-replica size) nests: elements of (16 / replicas, 16, 1).
    # The 64 rows make only 4 batches of 16, fewer than one step's worth on 8 replicas:
    # the one (partial) step holds all 4, one per replica, the rest get empty values.
    replicas = mirrored_strategy.num_replicas_in_sync
    steps = []
    for features, _ in dist_dataset:
        local = _local(mirrored_strategy, mirrored_strategy.run(lambda x: x, args=(features,)))
        steps.append(local)
    assert all(v.shape[1:] == (16, 1) for local in steps for v in local)
    assert sum(len(v) for local in steps for v in local) == 4
    if replicas == 8:
        assert [len(v) for v in steps[0]] == [1, 1, 1, 1, 0, 0, 0, 0]


@pytest.mark.multidevice
def test_pythonic_loop_and_explicit_iterator():
    global_batch_size = 16
    mirrored_strategy = phalanx.Strategy()

    dataset = phalanx.data.Dataset.from_tensors(([1.0], [1.0])).repeat(100).batch(global_batch_size)
    dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)

    @phalanx.function
    def train_step(inputs):
        features, labels = inputs
        return labels - 0.3 * features

    sizes = []
    for x in dist_dataset:
        # train_step trains the model using the dataset elements
        loss = mirrored_strategy.run(train_step, args=(x,))
        print("Loss is ", loss)
        sizes.append([len(v) for v in _local(mirrored_strategy, loss)])
    replicas = mirrored_strategy.num_replicas_in_sync
    # the last global batch holds 4 rows: TF splits them over the first replicas
    assert sizes == [_split(16, replicas)] * 6 + [_split(4, replicas)]

    num_epochs = 10
    steps_per_epoch = 5
    for epoch in range(num_epochs):  # noqa: B007 (as the tutorial writes it)
        dist_iterator = iter(dist_dataset)
        for step in range(steps_per_epoch):  # noqa: B007
            # train_step trains the model using the dataset elements
            loss = mirrored_strategy.run(train_step, args=(next(dist_iterator),))
            # which is the same as
            # loss = mirrored_strategy.run(train_step, args=(dist_iterator.get_next(),))
            print("Loss is ", loss)
    np.testing.assert_allclose(np.concatenate(_local(mirrored_strategy, loss)), 0.7, rtol=1e-6)


def test_get_next_as_optional():
    # You can break the loop with `get_next_as_optional` by checking if the `Optional`
    # contains a value
    global_batch_size = 4
    steps_per_loop = 5
    strategy = phalanx.Strategy()

    dataset = phalanx.data.Dataset.range(9).batch(global_batch_size)
    distributed_iterator = iter(strategy.experimental_distribute_dataset(dataset))

    @phalanx.function
    def train_fn(distributed_iterator):
        for _ in range(steps_per_loop):
            optional_data = distributed_iterator.get_next_as_optional()
            if not optional_data.has_value():
                break
            per_replica_results = strategy.run(lambda x: x, args=(optional_data.get_value(),))
            print(strategy.experimental_local_results(per_replica_results))
            seen.extend(_local(strategy, per_replica_results))

    seen = []
    train_fn(distributed_iterator)
    # 9 elements in batches of 4: 3 steps, then the optional is empty and the loop breaks.
    np.testing.assert_array_equal(np.concatenate(seen), np.arange(9))


def test_element_spec_as_input_signature():
    global_batch_size = 16
    epochs = 5
    steps_per_epoch = 5
    mirrored_strategy = phalanx.Strategy()

    dataset = phalanx.data.Dataset.from_tensors(([1.0], [1.0])).repeat(100).batch(global_batch_size)
    dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)

    @phalanx.function(input_signature=[dist_dataset.element_spec])
    def train_step(per_replica_inputs):
        def step_fn(inputs):
            return 2 * inputs

        return mirrored_strategy.run(step_fn, args=(per_replica_inputs,))

    for _ in range(epochs):
        iterator = iter(dist_dataset)
        for _ in range(steps_per_epoch):
            output = train_step(next(iterator))
            print(output)
            # `2 * inputs` of a (features, labels) tuple repeats the tuple, in TF as in Python.
            assert len(output) == 4
            for part in output:
                np.testing.assert_array_equal(np.concatenate(_local(mirrored_strategy, part)), 1.0)
    assert jax.tree.leaves(dist_dataset.element_spec)[0].shape == (None, 1)


def test_ordering_predictions_with_enumerate():
    mirrored_strategy = phalanx.Strategy()
    dataset_size = 24
    batch_size = 6
    dataset = phalanx.data.Dataset.range(dataset_size).enumerate().batch(batch_size)
    dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)

    def predict(index, inputs):
        outputs = 2 * inputs
        return index, outputs

    result = {}
    for index, inputs in dist_dataset:
        output_index, outputs = mirrored_strategy.run(predict, args=(index, inputs))
        indices = list(mirrored_strategy.experimental_local_results(output_index))
        rindices = []
        for a in indices:
            rindices.extend(np.asarray(a))
        outputs = list(mirrored_strategy.experimental_local_results(outputs))
        routputs = []
        for a in outputs:
            routputs.extend(np.asarray(a))
        for i, value in zip(rindices, routputs):  # noqa: B905 (as the tutorial)
            result[i] = value

    print(result)
    assert {int(k): int(v) for k, v in result.items()} == {i: 2 * i for i in range(24)}


def test_distribute_values_from_function():
    mirrored_strategy = phalanx.Strategy()

    def value_fn(ctx):
        return jnp.asarray(ctx.replica_id_in_sync_group)

    distributed_values = mirrored_strategy.experimental_distribute_values_from_function(value_fn)
    for _ in range(4):
        result = mirrored_strategy.run(lambda x: x, args=(distributed_values,))
        print(result)
    local = [int(np.asarray(v).reshape(-1)[0]) for v in _local(mirrored_strategy, result)]
    assert local == list(range(mirrored_strategy.num_replicas_in_sync))


def test_from_generator():
    mirrored_strategy = phalanx.Strategy()

    def input_gen():
        while True:
            yield np.random.rand(4)

    # use Dataset.from_generator
    dataset = phalanx.data.Dataset.from_generator(
        input_gen, output_types=(np.float32), output_shapes=[4]
    )
    dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)
    iterator = iter(dist_dataset)
    for _ in range(4):
        result = mirrored_strategy.run(lambda x: x, args=(next(iterator),))
        print(result)

    # each element (4 values) is split over the replicas, as TF rebatches it
    local = _local(mirrored_strategy, result)
    assert sum(len(v) for v in local) == 4
    assert all(v.dtype == np.float32 and ((v >= 0) & (v < 1)).all() for v in local)
    assert jax.tree.structure(dataset.element_spec) == jax.tree.structure(0)


def _string_lookup_ids(strategy, dataset_fn, steps=3):
    """The per-replica values of the first `steps` batches of the cell's distributed dataset."""
    distributed_dataset = strategy.distribute_datasets_from_function(dataset_fn)

    # Print out a few example batches.
    distributed_dataset_iterator = iter(distributed_dataset)
    printed = []
    for _ in range(steps):
        batch = next(distributed_dataset_iterator)
        print(batch)
        printed.append(_local(strategy, strategy.run(lambda x: x, args=(batch,))))
    return printed


def _expected_ids(strategy, steps=3):
    """["a", "c", "e"] repeated, looked up in vocab ["a", "b", "c", "d", "f"] (0: unknown),
    cut into per-replica batches of 4 / replicas, one per replica each step."""
    replicas = strategy.num_replicas_in_sync
    per = 4 // replicas
    ids = [1, 3, 0] * (steps * 4)
    chunks = [ids[i * per : (i + 1) * per] for i in range(steps * replicas)]
    return [chunks[s * replicas : (s + 1) * replicas] for s in range(steps)]


def _import_keras_on_jax():
    """keras with the JAX backend (read on keras's first import only), os.environ as it was:
    that first import sets TF_FORCE_GPU_ALLOW_GROWTH for TensorFlow."""
    before = dict(os.environ)
    os.environ.setdefault("KERAS_BACKEND", "jax")
    try:
        return pytest.importorskip("keras")
    finally:
        os.environ.clear()
        os.environ.update(before)


def test_keras_string_lookup_in_dataset_fn():
    keras = _import_keras_on_jax()
    if keras.backend.backend() != "jax":
        pytest.skip(f"keras was imported with the {keras.backend.backend()} backend")
    tf = keras  # the cell's `tf.keras.layers`, as Keras 3 spells it: keras.layers

    strategy = phalanx.Strategy(jax.devices()[:2])
    vocab = ["a", "b", "c", "d", "f"]

    with strategy.scope():
        # Create the layer(s) under scope.
        layer = tf.layers.StringLookup(vocabulary=vocab)

    def dataset_fn(input_context):
        # a phalanx.data.Dataset
        dataset = phalanx.data.Dataset.from_tensor_slices(["a", "c", "e"]).repeat()

        # Custom your batching, sharding, prefetching, etc.
        global_batch_size = 4
        batch_size = input_context.get_per_replica_batch_size(global_batch_size)
        dataset = dataset.batch(batch_size)
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)

        # Apply the preprocessing layer(s) to the phalanx.data.Dataset
        def preprocess_with_kpl(input):
            return layer(input)

        processed_ds = dataset.map(preprocess_with_kpl)
        return processed_ds

    printed = _string_lookup_ids(strategy, dataset_fn)
    assert [[v.tolist() for v in step] for step in printed] == _expected_ids(strategy)


def test_python_vocabulary_in_dataset_fn():
    strategy = phalanx.Strategy(jax.devices()[:2])
    vocab = ["a", "b", "c", "d", "f"]
    # The StringLookup's numbering in plain Python: 0 for an unknown word, then the vocab.
    index = {word: i + 1 for i, word in enumerate(vocab)}

    def dataset_fn(input_context):
        dataset = phalanx.data.Dataset.from_tensor_slices(["a", "c", "e"]).repeat()
        batch_size = input_context.get_per_replica_batch_size(4)
        dataset = dataset.batch(batch_size)
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return dataset.map(lambda words: np.array([index.get(w, 0) for w in words], np.int32))

    printed = _string_lookup_ids(strategy, dataset_fn)
    assert [[v.tolist() for v in step] for step in printed] == _expected_ids(strategy)
