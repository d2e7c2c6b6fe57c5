"""`model.losses` in a TF-shaped custom loop over a Keras model: the regularizers' gradient.

TF's loops add `model.losses` to the loss inside the tape, so a kernel regularizer, an
activity regularizer and an `add_loss` term all move the weights. The step below is TF's,
with the tape written as `stateless_call` under `jax.value_and_grad` and `model.losses` read
after it in the differentiated function; one SGD step must give the hand-computed kernel,
on 1 and N replicas. Reads phalanx cannot resolve are errors naming the fix.
"""

import threading

import jax
import keras
import numpy as np
import pytest

import phalanx
from phalanx._src.strategy import keras_losses

pytestmark = pytest.mark.multidevice

N = jax.device_count()
GLOBAL_BATCH_SIZE = 2 * N
RATE = 0.1
X = np.random.RandomState(0).randn(GLOBAL_BATCH_SIZE, 3).astype(np.float32)
Y = (X[:, :1] > 0).astype(np.float32)
L2, ACTIVITY, ADD = 0.05, 0.02, 0.3


class _MeanOutputLoss(keras.layers.Layer):
    """Adds `ADD * mean(outputs)` with `add_loss`: a term of the activations, not weights."""

    def call(self, x):
        self.add_loss(ADD * keras.ops.mean(x))
        return x


def _model(kind):
    keras.utils.set_random_seed(0)
    dense = keras.layers.Dense(
        1,
        kernel_regularizer=keras.regularizers.L2(L2) if kind == "kernel" else None,
        activity_regularizer=keras.regularizers.L2(ACTIVITY) if kind == "activity" else None,
    )
    layers = [keras.Input((3,)), dense] + ([_MeanOutputLoss()] if kind == "add_loss" else [])
    return keras.Sequential(layers)


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _expected_kernel(kind, w, b):
    """One SGD step on mean BCE(logits) + the kind's term, by hand."""
    z = X @ w + b
    grad = X.T @ (_sigmoid(z) - Y) / len(X)
    if kind == "kernel":
        grad += 2 * L2 * w  # d/dw of L2 * sum(w**2)
    elif kind == "activity":
        grad += 2 * ACTIVITY * X.T @ z / len(X)  # Keras divides the term by the batch size
    elif kind == "add_loss":
        grad += ADD * X.mean(axis=0, keepdims=True).T  # d/dw of ADD * mean(x @ w + b)
    return w - RATE * grad


def _train_one_step(strategy, kind):
    with strategy.scope():
        model = _model(kind)
        optimizer = keras.optimizers.SGD(RATE)

    def compute_loss(trainable, non_trainable, features, labels):
        logits, non_trainable = model.stateless_call(trainable, non_trainable, features)
        per_example = keras.losses.binary_crossentropy(labels, logits, from_logits=True)
        loss = phalanx.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH_SIZE)
        if model.losses:  # TF: compute_loss(labels, predictions, model.losses)
            loss += phalanx.scale_regularization_loss(sum(model.losses))
        return loss

    def train_step(inputs):
        features, labels = inputs
        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        loss, gradients = jax.value_and_grad(compute_loss)(
            trainable, non_trainable, features, labels
        )
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    @phalanx.function
    def distributed_train_step(inputs):
        per_replica_losses = strategy.run(train_step, args=(inputs,))
        return strategy.reduce("sum", per_replica_losses, axis=None)

    w0, b0 = (np.asarray(v) for v in model.get_weights())
    dataset = phalanx.data.Dataset.from_tensor_slices((X, Y)).batch(GLOBAL_BATCH_SIZE)
    for batch in strategy.experimental_distribute_dataset(dataset):
        distributed_train_step(batch)
    return model, w0, b0


@pytest.mark.parametrize("replicas", sorted({1, N}))
@pytest.mark.parametrize("kind", ["kernel", "activity", "add_loss"])
def test_one_sgd_step_includes_the_losses_gradient(kind, replicas):
    strategy = phalanx.Strategy(devices=jax.devices()[:replicas])
    model, w0, b0 = _train_one_step(strategy, kind)
    kernel = np.asarray(model.get_weights()[0])
    np.testing.assert_allclose(kernel, _expected_kernel(kind, w0, b0), rtol=1e-5, atol=1e-7)
    # The term's share is not lost in the noise: without it the kernel would differ.
    without = _expected_kernel("none", w0, b0)
    assert np.abs(kernel - without).max() > 1e-4


def test_losses_read_where_no_stateless_call_was_differentiated_is_an_error():
    strategy = phalanx.Strategy(devices=jax.devices()[:1])
    with strategy.scope():
        model = _model("kernel")

    def loss_of_inputs(features):
        # A gradient with respect to the inputs: `model.losses` of which weights?
        return keras.ops.sum(model(features)) + sum(model.losses)

    def step(features):
        return jax.grad(loss_of_inputs)(features)

    with pytest.raises(ValueError, match=r"return_losses=True") as error:
        strategy.run(step, args=(X,))
    assert "model.losses" in str(error.value)


def test_losses_of_a_call_outside_the_gradient_are_an_error_inside_it():
    strategy = phalanx.Strategy(devices=jax.devices()[:1])
    with strategy.scope():
        model = _model("kernel")

    def step(features):
        trainable = [v.value for v in model.trainable_variables]
        model.stateless_call(trainable, [], features)  # outside the differentiated function

        def penalty(scale):
            return scale * sum(model.losses)  # those losses are constants here

        return jax.grad(penalty)(1.0)

    with pytest.raises(ValueError, match=r"made no `model.stateless_call`"):
        strategy.run(step, args=(X,))


def test_activity_losses_read_after_the_gradient_are_an_error():
    strategy = phalanx.Strategy(devices=jax.devices()[:1])
    with strategy.scope():
        model = _model("activity")

    def compute_loss(trainable, non_trainable, features):
        logits, _ = model.stateless_call(trainable, non_trainable, features)
        return keras.ops.mean(logits)

    def step(features):
        trainable = [v.value for v in model.trainable_variables]
        jax.grad(compute_loss)(trainable, [], features)
        return sum(model.losses)  # the activity term of a call inside the gradient

    with pytest.raises(ValueError, match=r"return_losses=True"):
        strategy.run(step, args=(X,))


def test_weight_losses_outside_a_gradient_are_the_current_values():
    strategy = phalanx.Strategy(devices=jax.devices()[:1])
    with strategy.scope():
        model = _model("kernel")

    def step(features):
        del features
        return sum(model.losses)

    got = strategy.run(step, args=(X,))
    want = L2 * np.sum(np.asarray(model.get_weights()[0]) ** 2)
    np.testing.assert_allclose(float(strategy.experimental_local_results(got)[0]), want, rtol=1e-6)


def test_return_losses_true_still_gives_keras_losses():
    strategy = phalanx.Strategy(devices=jax.devices()[:1])
    with strategy.scope():
        model = _model("kernel")

    def step(features):
        trainable = [v.value for v in model.trainable_variables]
        _, _, losses = model.stateless_call(trainable, [], features, return_losses=True)
        return sum(losses)

    got = strategy.run(step, args=(X,))
    want = L2 * np.sum(np.asarray(model.get_weights()[0]) ** 2)
    np.testing.assert_allclose(float(strategy.experimental_local_results(got)[0]), want, rtol=1e-6)


def _read_in_a_gradient_without_stateless_call(strategy, model):
    def step(features):
        return jax.grad(lambda scale: scale * sum(model.losses))(1.0)

    return strategy.run(step, args=(X,))


def test_a_trace_phalanx_does_not_know_fails_closed(monkeypatch):
    # As if a JAX release renamed its JVP and linearize traces: phalanx can no longer tell
    # that `jax.grad` differentiates, so a read that needs to know is an error, never the
    # regularizers' values without their gradient.
    strategy = phalanx.Strategy(devices=jax.devices()[:1])
    with strategy.scope():
        model = _model("kernel")
    monkeypatch.setattr(keras_losses, "_DIFFERENTIATING", ())
    with pytest.raises(
        ValueError, match=r"JAX trace phalanx does not know \(\w*Trace.*return_losses=True"
    ):
        _read_in_a_gradient_without_stateless_call(strategy, model)
    # A read after the step's own stateless_call, in the same function, still carries the
    # gradient: the losses are that call's, whatever the trace is called.
    trained, w0, b0 = _train_one_step(strategy, "kernel")
    kernel = np.asarray(trained.get_weights()[0])
    np.testing.assert_allclose(kernel, _expected_kernel("kernel", w0, b0), rtol=1e-5, atol=1e-7)


def test_an_unknown_enclosing_trace_fails_closed_even_outside_a_gradient(monkeypatch):
    strategy = phalanx.Strategy(devices=jax.devices()[:1])
    with strategy.scope():
        model = _model("kernel")
    # As if JAX renamed the trace of `jit`, which every step runs in.
    known = tuple(t for t in keras_losses._NOT_DIFFERENTIATING if t.__name__ != "DynamicJaxprTrace")
    monkeypatch.setattr(keras_losses, "_NOT_DIFFERENTIATING", known)

    def step(features):
        del features
        return sum(model.losses)

    with pytest.raises(ValueError, match=r"does not know \(DynamicJaxprTrace\)"):
        strategy.run(step, args=(X,))


def test_the_patch_holds_while_any_thread_still_steps():
    # Two threads step the same model; the first to finish must not unpatch it under the
    # other, whose `model.losses` in a gradient would then silently lose the gradient.
    with phalanx.Strategy(devices=jax.devices()[:1]).scope():
        model = _model("kernel")
    entered, first_left, errors = threading.Barrier(2), threading.Event(), []

    def first():
        with keras_losses.carried([(model, "model")], "thread one", None):
            entered.wait()
        first_left.set()

    def second():
        with keras_losses.carried([(model, "model")], "thread two", None):
            entered.wait()
            first_left.wait()
            try:
                jax.grad(lambda scale: scale * sum(model.losses))(1.0)
            except ValueError as error:
                errors.append(str(error))

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(errors) == 1 and errors[0].startswith("thread two: the step reads `model.losses`")
    assert "stateless_call" not in vars(model)  # the last one out removed the patch
