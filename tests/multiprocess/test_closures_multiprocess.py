"""A TF-shaped custom loop across two processes x two CPU devices (four replicas).

The step closes over the model, the optimizer and a metric and applies unreduced gradients
(TF's `apply_gradients`); `distributed_train_step` is `@phalanx.function`. Every process
checks that the numbers equal the explicit-argument form (state passed in, gradients reduced
by hand; tests/strategy/ compares both with one device), and that a prediction loop over a
partial batch collects each row once.
"""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from multiprocess_harness import run_multiprocess

import phalanx

pytestmark = pytest.mark.multiprocess

GLOBAL_BATCH_SIZE = 8
X = np.random.RandomState(0).randn(12, 4).astype(np.float32)  # 8, then 4 rows
Y = (X[:, 0] > 0).astype(np.int32)


def _loss(model, images, labels):
    predictions = model(images)
    per_example = optax.softmax_cross_entropy_with_integer_labels(predictions, labels)
    return phalanx.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH_SIZE), (
        predictions
    )


def _train(strategy, closed_over: bool):
    with strategy.scope():
        model = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.sgd(0.5), wrt=nnx.Param)
        train_accuracy = phalanx.metrics.SparseCategoricalAccuracy()
    ds = phalanx.data.Dataset.from_tensor_slices((X, Y)).batch(GLOBAL_BATCH_SIZE)
    dist = strategy.experimental_distribute_dataset(ds)

    def train_step(inputs):
        images, labels = inputs
        (loss, predictions), grads = nnx.value_and_grad(_loss, has_aux=True)(model, images, labels)
        optimizer.update(model, grads)
        train_accuracy.update_state(labels, predictions)
        return loss

    @phalanx.function
    def distributed_train_step(dataset_inputs):
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce("sum", per_replica_losses, axis=None)

    def explicit_step(model, optimizer, train_accuracy, inputs):
        images, labels = inputs
        (loss, predictions), grads = nnx.value_and_grad(_loss, has_aux=True)(model, images, labels)
        optimizer.update(model, phalanx.get_replica_context().all_reduce("sum", grads))
        train_accuracy.update_state(labels, predictions)
        return loss

    losses = []
    for x in dist:
        if closed_over:
            losses.append(float(distributed_train_step(x)))
        else:
            out = strategy.run(explicit_step, args=(model, optimizer, train_accuracy, x))
            losses.append(float(strategy.reduce("sum", out, axis=None)))
    kernel = np.asarray(jax.device_get(model.kernel[...]))
    return losses, kernel, float(train_accuracy.result()), model, strategy


def _body() -> None:
    strategy = phalanx.Strategy()
    assert strategy.num_replicas_in_sync == 4
    losses, kernel, accuracy, model, _ = _train(strategy, closed_over=True)
    want_losses, want_kernel, want_accuracy, _, _ = _train(strategy, closed_over=False)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(kernel, want_kernel, rtol=1e-6, atol=1e-7)
    assert accuracy == pytest.approx(want_accuracy)

    # Predictions over the 12 rows: each process collects its replicas' real rows only.
    def predict_step(inputs):
        return model(inputs[0])

    ds = phalanx.data.Dataset.from_tensor_slices((X,)).batch(GLOBAL_BATCH_SIZE)
    sizes = []
    for batch in strategy.experimental_distribute_dataset(ds):
        parts = strategy.experimental_local_results(strategy.run(predict_step, args=(batch,)))
        sizes.append([int(p.shape[0]) for p in parts])
    # Batches of 8 and 4 over 4 replicas (2 per process): 2 rows each, then 1 each.
    assert sizes == [[2, 2], [1, 1]]


def test_closed_over_state_across_two_processes():
    run_multiprocess(_body, timeout=120.0)
