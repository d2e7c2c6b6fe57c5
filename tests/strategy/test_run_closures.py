"""TF-shaped custom loops: steps that close over the model, optimizer and metrics.

The step reads `model`, `optimizer` and `train_accuracy` from the enclosing scope and calls
`optimizer.update(model, grads)` without reducing the gradients, as TF's
`apply_gradients` is written; `distributed_train_step` is `@phalanx.function`. The numbers
must equal the explicit-argument form (state passed in, gradients all-reduced by hand) and
one device's full-batch training.
"""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import phalanx

pytestmark = pytest.mark.multidevice

N = jax.device_count()
REPLICAS = sorted({1, N})
X = np.random.RandomState(0).randn(40, 4).astype(np.float32)
Y = (X[:, 0] + X[:, 1] > 0).astype(np.int32)
GLOBAL_BATCH_SIZE = 2 * N  # 40 rows: full batches and a partial last one


def _dataset(strategy):
    ds = phalanx.data.Dataset.from_tensor_slices((X, Y)).batch(GLOBAL_BATCH_SIZE)
    return strategy.experimental_distribute_dataset(ds)


def _first_batch(strategy):
    """One full global batch, distributed."""
    full = [(X[:GLOBAL_BATCH_SIZE], Y[:GLOBAL_BATCH_SIZE])]
    (batch,) = list(strategy.experimental_distribute_dataset(full))
    return batch


def _build(strategy):
    with strategy.scope():
        model = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.sgd(0.5), wrt=nnx.Param)
        accuracy = phalanx.metrics.SparseCategoricalAccuracy()
    return model, optimizer, accuracy


def _loss(model, images, labels):
    predictions = model(images)
    per_example = optax.softmax_cross_entropy_with_integer_labels(predictions, labels)
    return phalanx.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH_SIZE), (
        predictions
    )


def _tf_shaped(strategy, compiled):
    """The tutorial's loop, state closed over; returns losses, kernel, accuracy, step."""
    model, optimizer, train_accuracy = _build(strategy)

    def train_step(inputs):
        images, labels = inputs
        (loss, predictions), grads = nnx.value_and_grad(_loss, has_aux=True)(model, images, labels)
        optimizer.update(model, grads)  # TF: optimizer.apply_gradients(zip(grads, vars))
        train_accuracy.update_state(labels, predictions)
        return loss

    def distributed_train_step(dataset_inputs):
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce("sum", per_replica_losses, axis=None)

    if compiled:
        distributed_train_step = phalanx.function(distributed_train_step)
    losses = [float(distributed_train_step(x)) for _ in range(2) for x in _dataset(strategy)]
    if compiled:
        assert len(distributed_train_step._cache) == 1  # the partial batch reuses the shape
    return losses, np.asarray(model.kernel[...]), float(train_accuracy.result()), optimizer


def _explicit(strategy):
    model, optimizer, train_accuracy = _build(strategy)

    def train_step(model, optimizer, train_accuracy, inputs):
        images, labels = inputs
        (loss, predictions), grads = nnx.value_and_grad(_loss, has_aux=True)(model, images, labels)
        grads = phalanx.get_replica_context().all_reduce("sum", grads)
        optimizer.update(model, grads)
        train_accuracy.update_state(labels, predictions)
        return loss

    losses = []
    for _ in range(2):
        for x in _dataset(strategy):
            per_replica = strategy.run(train_step, args=(model, optimizer, train_accuracy, x))
            losses.append(float(strategy.reduce("sum", per_replica, axis=None)))
    return losses, np.asarray(model.kernel[...]), float(train_accuracy.result())


def _one_device():
    model = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.5), wrt=nnx.Param)
    losses, correct = [], 0
    for _ in range(2):
        for start in range(0, len(X), GLOBAL_BATCH_SIZE):
            x, y = X[start : start + GLOBAL_BATCH_SIZE], Y[start : start + GLOBAL_BATCH_SIZE]

            def loss_fn(model, x=x, y=y):
                logits = model(x)
                per_example = optax.softmax_cross_entropy_with_integer_labels(logits, y)
                return per_example.sum() / GLOBAL_BATCH_SIZE, logits

            (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
            correct += int((np.asarray(logits).argmax(-1) == y).sum())
            optimizer.update(model, grads)
            losses.append(float(loss))
    return losses, np.asarray(model.kernel[...]), correct / (2 * len(X))


@pytest.mark.parametrize("replicas", REPLICAS)
@pytest.mark.parametrize("compiled", [True, False], ids=["phalanx.function", "eager"])
def test_tf_shaped_loop_equals_explicit_form_and_one_device(replicas, compiled):
    strategy = phalanx.Strategy(devices=jax.devices()[:replicas])
    losses, kernel, accuracy, optimizer = _tf_shaped(strategy, compiled)
    want_losses, want_kernel, want_accuracy = _explicit(strategy)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(kernel, want_kernel, rtol=1e-6, atol=1e-7)
    assert accuracy == pytest.approx(want_accuracy)
    one_losses, one_kernel, one_accuracy = _one_device()
    np.testing.assert_allclose(losses, one_losses, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(kernel, one_kernel, rtol=2e-6, atol=1e-6)
    assert accuracy == pytest.approx(one_accuracy)
    assert int(optimizer.step[...]) == 2 * len(list(_dataset(strategy)))


def test_one_sgd_step_on_unreduced_gradients_is_the_full_batch_step():
    strategy = phalanx.Strategy()
    model, optimizer, _ = _build(strategy)
    batch = _first_batch(strategy)

    def step(inputs):
        images, labels = inputs
        (loss, _), grads = nnx.value_and_grad(_loss, has_aux=True)(model, images, labels)
        optimizer.update(model, grads)  # summed over replicas, as apply_gradients does
        return loss

    strategy.run(step, args=(batch,))
    one = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
    x, y = X[:GLOBAL_BATCH_SIZE], Y[:GLOBAL_BATCH_SIZE]
    grads = nnx.grad(lambda m: _loss_one(m, x, y))(one)
    nnx.Optimizer(one, optax.sgd(0.5), wrt=nnx.Param).update(one, grads)
    np.testing.assert_allclose(model.kernel[...], one.kernel[...], rtol=1e-6, atol=1e-7)


def _loss_one(model, x, y):
    logits = model(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def test_partly_reduced_gradients_are_an_error():
    strategy = phalanx.Strategy()
    model, optimizer, _ = _build(strategy)
    batch = _first_batch(strategy)

    def step(inputs):
        images, labels = inputs
        (loss, _), grads = nnx.value_and_grad(_loss, has_aux=True)(model, images, labels)
        grads["kernel"] = phalanx.get_replica_context().all_reduce("sum", grads["kernel"])
        optimizer.update(model, grads)
        return loss

    with pytest.raises(ValueError, match=r"some are already reduced.*kernel.*all_reduce"):
        strategy.run(step, args=(batch,))


class _Trainer:
    """A class-based TF loop: the step is a method that reads self.model."""

    def __init__(self, strategy):
        self.strategy = strategy
        self.model, self.optimizer, self.accuracy = _build(strategy)

    def train_step(self, inputs):
        images, labels = inputs
        (loss, predictions), grads = nnx.value_and_grad(_loss, has_aux=True)(
            self.model, images, labels
        )
        self.optimizer.update(self.model, grads)
        self.accuracy.update_state(labels, predictions)
        return loss

    @phalanx.function
    def distributed_train_step(self, inputs):
        losses = self.strategy.run(self.train_step, args=(inputs,))
        return self.strategy.reduce("sum", losses, axis=None)


def test_a_method_reading_self_attributes_is_lifted():
    strategy = phalanx.Strategy()
    trainer = _Trainer(strategy)
    for x in _dataset(strategy):
        trainer.distributed_train_step(x)
    _, want_kernel, want_accuracy = _explicit(strategy)
    # _explicit trains two epochs; train one more epoch here to compare.
    for x in _dataset(strategy):
        trainer.distributed_train_step(x)
    np.testing.assert_allclose(trainer.model.kernel[...], want_kernel, rtol=1e-6, atol=1e-7)
    assert float(trainer.accuracy.result()) == pytest.approx(want_accuracy)


def test_a_python_loop_over_a_dataset_inside_the_function_runs_as_written():
    strategy = phalanx.Strategy()
    model, optimizer, _ = _build(strategy)

    def train_step(inputs):
        images, labels = inputs
        (loss, _), grads = nnx.value_and_grad(_loss, has_aux=True)(model, images, labels)
        optimizer.update(model, grads)
        return loss

    @phalanx.function
    def distributed_train_epoch(dataset):
        total_loss, num_batches = 0.0, 0
        for x in dataset:
            per_replica_losses = strategy.run(train_step, args=(x,))
            total_loss += strategy.reduce("sum", per_replica_losses, axis=None)
            num_batches += 1
        return total_loss / num_batches

    first = distributed_train_epoch(_dataset(strategy))
    second = distributed_train_epoch(_dataset(strategy))
    want, _, _ = _explicit(strategy)
    per_epoch = len(want) // 2
    assert float(first) == pytest.approx(np.mean(want[:per_epoch]), rel=1e-6)
    assert float(second) == pytest.approx(np.mean(want[per_epoch:]), rel=1e-6)


class _Counter(nnx.Module):
    """A trainer that is itself an NNX module: strategy.run(counter.step, ...)."""

    def __init__(self):
        self.total = nnx.metrics.MetricState(np.zeros((), np.float32))

    def step(self, inputs):
        self.total[...] += inputs[0].sum()
        return self.total[...]


def test_a_bound_method_of_an_nnx_module_carries_its_self():
    strategy = phalanx.Strategy()
    with strategy.scope():
        counter = _Counter()
    (batch,) = list(strategy.experimental_distribute_dataset([(X[:GLOBAL_BATCH_SIZE],)]))
    strategy.run(counter.step, args=(batch,))
    assert float(counter.total[...]) == pytest.approx(X[:GLOBAL_BATCH_SIZE].sum(), rel=1e-5)


def test_a_function_calling_another_carries_the_state_through_both():
    strategy = phalanx.Strategy()
    model, optimizer, accuracy = _build(strategy)
    batch = _first_batch(strategy)

    def train_step(inputs):
        images, labels = inputs
        (loss, predictions), grads = nnx.value_and_grad(_loss, has_aux=True)(model, images, labels)
        optimizer.update(model, grads)
        accuracy.update_state(labels, predictions)
        return loss

    @phalanx.function
    def inner(inputs):
        return strategy.reduce("sum", strategy.run(train_step, args=(inputs,)), axis=None)

    @phalanx.function
    def outer(inputs):
        return inner(inputs) + inner(inputs)

    outer(batch)
    assert int(optimizer.step[...]) == 2
    want_model, want_optimizer, _ = _build(strategy)
    for _ in range(2):
        images, labels = X[:GLOBAL_BATCH_SIZE], Y[:GLOBAL_BATCH_SIZE]
        grads = nnx.grad(lambda m, x=images, y=labels: _loss_one(m, x, y))(want_model)
        want_optimizer.update(want_model, grads)
    np.testing.assert_allclose(model.kernel[...], want_model.kernel[...], rtol=1e-6, atol=1e-7)


def test_a_step_defined_anew_on_every_call_compiles_once():
    """TF's `def step_fn(inputs)` inside the function that calls strategy.run: a new function
    object each call, with the same code and captures, reuses the compiled call; a captured
    number that changes compiles anew (it is baked into the program)."""
    strategy = phalanx.Strategy()
    model, _, _ = _build(strategy)
    traces = []

    def train_multiple_steps(images, scale):
        def step_fn(inputs):
            traces.append(scale)
            return model(inputs) * scale

        return strategy.run(step_fn, args=(images,))

    batch = next(iter(_dataset(strategy)))[0]
    first = train_multiple_steps(batch, 2.0)
    traced_once = len(traces)
    again = [train_multiple_steps(batch, 2.0) for _ in range(3)]
    assert len(traces) == traced_once
    for result in again:
        for a, b in zip(
            strategy.experimental_local_results(first),
            strategy.experimental_local_results(result),
            strict=True,
        ):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    train_multiple_steps(batch, 3.0)
    assert len(traces) > traced_once and traces[-1] == 3.0
