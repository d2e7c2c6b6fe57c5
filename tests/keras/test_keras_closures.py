"""TF-shaped custom loops over Keras 3 objects: steps that close over the model, optimizer
and metrics, on the JAX backend.

The step reads `model`, `optimizer` and `train_accuracy` from the enclosing scope, takes
gradients with JAX over `model.stateless_call` (Keras's JAX custom-loop idiom), and calls
`optimizer.apply_gradients(zip(grads, model.trainable_variables))` without reducing them, as
TF's loop is written. The numbers must equal the same program on one device.
"""

import jax
import keras
import numpy as np
import pytest

import phalanx

pytestmark = pytest.mark.multidevice

N = jax.device_count()
REPLICAS = sorted({1, N})
X = np.random.RandomState(0).randn(40, 4).astype(np.float32)
Y = (X[:, 0] + X[:, 1] > 0).astype(np.int32)
GLOBAL_BATCH_SIZE = 2 * N  # 40 rows: full batches and a partial last one
EPOCHS = 2


def _dataset(strategy, drop_remainder=False):
    ds = phalanx.data.Dataset.from_tensor_slices((X, Y))
    ds = ds.batch(GLOBAL_BATCH_SIZE, drop_remainder=drop_remainder)
    return strategy.experimental_distribute_dataset(ds)


class _Classifier(keras.Model):
    """A user's subclassed model: its class lives in the user's module, not in keras."""

    def __init__(self, batch_norm):
        super().__init__()
        self.norm = keras.layers.BatchNormalization(momentum=0.5) if batch_norm else None
        self.dense = keras.layers.Dense(3)

    def call(self, x, training=False):
        if self.norm is not None:
            x = self.norm(x, training=training)
        return self.dense(x)


def _model(batch_norm=False):
    keras.utils.set_random_seed(0)
    model = _Classifier(batch_norm)
    model(X[:1])  # builds it
    return model


def _one_device():
    """The same training on one device: full global batches, Keras's stateless API."""
    model = _model()
    optimizer = keras.optimizers.SGD(0.5, momentum=0.9)
    optimizer.build(model.trainable_variables)
    accuracy = keras.metrics.SparseCategoricalAccuracy()
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    optimizer_variables = [v.value for v in optimizer.variables]
    losses = []
    for _ in range(EPOCHS):
        for start in range(0, len(X), GLOBAL_BATCH_SIZE):
            x, y = X[start : start + GLOBAL_BATCH_SIZE], Y[start : start + GLOBAL_BATCH_SIZE]

            def loss_fn(trainable, non_trainable=non_trainable, x=x, y=y):
                logits, non_trainable = model.stateless_call(
                    trainable, non_trainable, x, training=True
                )
                per_example = keras.losses.sparse_categorical_crossentropy(
                    y, logits, from_logits=True
                )
                return per_example.sum() / GLOBAL_BATCH_SIZE, (logits, non_trainable)

            (loss, (logits, non_trainable)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                trainable
            )
            trainable, optimizer_variables = optimizer.stateless_apply(
                optimizer_variables, grads, trainable
            )
            accuracy.update_state(y, logits)
            losses.append(float(loss))
    return losses, [np.asarray(v) for v in trainable + non_trainable], float(accuracy.result())


def _loss(model, trainable, non_trainable, images, labels):
    logits, non_trainable = model.stateless_call(trainable, non_trainable, images, training=True)
    per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    loss = phalanx.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH_SIZE)
    return loss, (logits, non_trainable)


@pytest.mark.parametrize("replicas", REPLICAS)
@pytest.mark.parametrize("compiled", [True, False], ids=["phalanx.function", "eager"])
def test_tf_shaped_keras_loop_equals_one_device(replicas, compiled):
    strategy = phalanx.Strategy(devices=jax.devices()[:replicas])
    with strategy.scope():
        model = _model()
        optimizer = keras.optimizers.SGD(0.5, momentum=0.9)  # built by phalanx from the model found
        train_accuracy = keras.metrics.SparseCategoricalAccuracy()

    def train_step(inputs):
        images, labels = inputs
        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        (loss, (predictions, _)), grads = jax.value_and_grad(_loss, argnums=1, has_aux=True)(
            model, trainable, non_trainable, images, labels
        )
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        train_accuracy.update_state(labels, predictions)
        return loss

    def distributed_train_step(dataset_inputs):
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce("sum", per_replica_losses, axis=None)

    if compiled:
        distributed_train_step = phalanx.function(distributed_train_step)
    losses = [float(distributed_train_step(x)) for _ in range(EPOCHS) for x in _dataset(strategy)]
    if compiled:
        assert len(distributed_train_step._cache) == 1  # the partial batch reuses the shape
    want_losses, want_weights, want_accuracy = _one_device()
    np.testing.assert_allclose(losses, want_losses, rtol=2e-6, atol=1e-6)
    for variable, want in zip(model.weights, want_weights, strict=True):
        np.testing.assert_allclose(np.asarray(variable.value), want, rtol=2e-6, atol=1e-6)
    assert float(train_accuracy.result()) == pytest.approx(want_accuracy)
    assert int(optimizer.iterations.value) == len(losses)

    def predict_step(inputs):
        return model(inputs[0])  # a plain call reads the trained weights

    predictions = strategy.run(predict_step, args=(next(iter(_dataset(strategy))),))
    np.testing.assert_allclose(
        np.concatenate([np.asarray(p) for p in strategy.experimental_local_results(predictions)]),
        model.predict(X[:GLOBAL_BATCH_SIZE], verbose=0),
        rtol=1e-5,
        atol=1e-6,
    )


def test_the_stateless_jax_loop_of_kerass_guide_runs_per_replica():
    """Keras's "custom training loop in JAX": state passed in and returned explicitly."""
    strategy = phalanx.Strategy()
    model = _model()
    optimizer = keras.optimizers.SGD(0.5, momentum=0.9)
    optimizer.build(model.trainable_variables)

    def train_step(state, data):
        trainable, non_trainable, optimizer_variables = state
        x, y = data
        (loss, (_, non_trainable)), grads = jax.value_and_grad(_loss, argnums=1, has_aux=True)(
            model, trainable, non_trainable, x, y
        )
        trainable, optimizer_variables = optimizer.stateless_apply(
            optimizer_variables, grads, trainable
        )
        return loss, (trainable, non_trainable, optimizer_variables)

    state = (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in optimizer.variables],
    )
    losses = []
    for _ in range(EPOCHS):
        for batch in _dataset(strategy):
            loss, state = strategy.run(train_step, args=(state, batch))
            losses.append(float(strategy.reduce("sum", loss, axis=None)))
    want_losses, want_weights, _ = _one_device()
    np.testing.assert_allclose(losses, want_losses, rtol=2e-6, atol=1e-6)
    # The returned state is per replica, as any value computed from the step's inputs; the
    # summed gradients keep every replica's copy equal to one device's.
    for value, want in zip(state[0], want_weights, strict=True):
        for local in strategy.experimental_local_results(value):
            np.testing.assert_allclose(np.asarray(local), want, rtol=2e-6, atol=1e-6)


def _train_with_batch_norm(strategy, reduce_first):
    model = _model(batch_norm=True)
    optimizer = keras.optimizers.SGD(0.5, momentum=0.9)

    def step(inputs):
        images, labels = inputs
        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        (loss, (_, non_trainable)), grads = jax.value_and_grad(_loss, argnums=1, has_aux=True)(
            model, trainable, non_trainable, images, labels
        )
        if reduce_first:
            grads = phalanx.get_replica_context().all_reduce("sum", grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        for variable, value in zip(model.non_trainable_variables, non_trainable, strict=True):
            variable.assign(value)
        return loss

    @phalanx.function
    def train(inputs):
        return strategy.reduce("sum", strategy.run(step, args=(inputs,)), axis=None)

    for _ in range(EPOCHS):
        for x in _dataset(strategy, drop_remainder=True):
            train(x)
    return model


def test_reduced_gradients_are_not_summed_twice_and_moving_means_are_averaged():
    strategy = phalanx.Strategy()
    reduced = _train_with_batch_norm(strategy, reduce_first=True)
    summed = _train_with_batch_norm(strategy, reduce_first=False)
    for a, b in zip(reduced.trainable_variables, summed.trainable_variables, strict=True):
        np.testing.assert_allclose(np.asarray(a.value), np.asarray(b.value), rtol=1e-6, atol=1e-7)
    # Each replica normalises with its own batch (as TF does) and updates its moving mean;
    # the replicas' moving means are averaged, which over equal-sized batches is the global
    # batch's update (the BatchNorm reads the raw inputs, so it does not depend on weights).
    want = np.zeros(4, np.float32)
    for _ in range(EPOCHS):
        for start in range(0, len(X) - GLOBAL_BATCH_SIZE + 1, GLOBAL_BATCH_SIZE):
            want = 0.5 * want + 0.5 * X[start : start + GLOBAL_BATCH_SIZE].mean(0)
    np.testing.assert_allclose(
        np.asarray(reduced.norm.moving_mean.value), want, rtol=1e-5, atol=1e-6
    )


def test_a_keras_model_that_is_not_built_is_named():
    strategy = phalanx.Strategy()
    unbuilt = keras.Sequential([keras.layers.Dense(2)])
    (batch,) = list(strategy.experimental_distribute_dataset([(X[:GLOBAL_BATCH_SIZE],)]))

    with pytest.raises(ValueError, match=r"Keras layer `unbuilt`.*not built.*keras.Input"):
        strategy.run(lambda inputs: unbuilt(inputs[0]), args=(batch,))


def test_an_unbuilt_optimizer_beside_two_models_is_named():
    strategy = phalanx.Strategy()
    generator, discriminator = _model(), _model()
    g_optimizer = keras.optimizers.SGD(0.1)
    (batch,) = list(strategy.experimental_distribute_dataset([(X[:GLOBAL_BATCH_SIZE],)]))

    def step(inputs):
        grads = [jax.numpy.zeros(v.shape) for v in generator.trainable_variables]
        g_optimizer.apply_gradients(zip(grads, generator.trainable_variables, strict=True))
        return generator(inputs[0]) + discriminator(inputs[0])

    with pytest.raises(
        ValueError, match=r"`g_optimizer`.*not built.*found: `discriminator`, `generator`"
    ):
        strategy.run(step, args=(batch,))
    g_optimizer.build(generator.trainable_variables)
    strategy.run(step, args=(batch,))
    assert int(g_optimizer.iterations.value) == 1


def test_a_keras_variable_phalanx_did_not_find_is_named():
    class Holder:
        model = _model()  # a class attribute: not among the names phalanx searches

    strategy = phalanx.Strategy()
    holder = Holder()
    model = _model()
    (batch,) = list(strategy.experimental_distribute_dataset([(X[:GLOBAL_BATCH_SIZE],)]))

    def step(inputs):
        return model(inputs[0]) + holder.model(inputs[0])

    with pytest.raises(ValueError, match=r"reads the Keras variable '[\w/]*dense[_\d]*/kernel'"):
        strategy.run(step, args=(batch,))


def test_a_step_changing_keras_state_inside_jax_jit_names_phalanx_function():
    strategy = phalanx.Strategy()
    train_accuracy = keras.metrics.SparseCategoricalAccuracy()
    (batch,) = list(
        strategy.experimental_distribute_dataset([(X[:GLOBAL_BATCH_SIZE], Y[:GLOBAL_BATCH_SIZE])])
    )

    def step(inputs):
        train_accuracy.update_state(inputs[1], jax.nn.one_hot(inputs[1], 2))
        return inputs[1]

    @jax.jit
    def distributed_step(inputs):
        return strategy.run(step, args=(inputs,))

    with pytest.raises(ValueError, match=r"inside jax.jit.*Keras variable.*@phalanx.function"):
        distributed_step(batch)


def _tape_style(model, images, labels):
    def loss_fn():  # TF's GradientTape records this; JAX differentiates arguments
        logits = model(images)
        return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)

    return jax.grad(lambda: loss_fn().mean())()


def _variables_to_grad(model, images, labels):
    def loss_fn(variables):
        logits = model(images)
        return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)

    return jax.grad(lambda v: loss_fn(v).mean())(model.trainable_variables)


@pytest.mark.parametrize(
    ("gradient", "message"),
    [
        (_tape_style, r"function of no arguments.*With a Keras model.*stateless_call"),
        (_variables_to_grad, r"Keras variables.*v.value for v in model.trainable_variables"),
    ],
)
def test_tf_style_gradients_of_a_keras_model_name_stateless_call(gradient, message):
    strategy = phalanx.Strategy()
    model = _model()
    (batch,) = list(
        strategy.experimental_distribute_dataset([(X[:GLOBAL_BATCH_SIZE], Y[:GLOBAL_BATCH_SIZE])])
    )

    def step(inputs):
        return gradient(model, *inputs)

    with pytest.raises(TypeError, match=message):
        strategy.run(step, args=(batch,))


def test_keras_random_layers_draw_one_stream_that_advances_once_per_step():
    strategy = phalanx.Strategy()
    dropout = keras.layers.Dropout(0.5, seed=1)
    ones = np.ones((GLOBAL_BATCH_SIZE, 64), np.float32)
    (batch,) = list(strategy.experimental_distribute_dataset([(ones,)]))

    def step(inputs):
        return dropout(inputs[0], training=True)

    masks = []
    for _ in range(2):
        local = strategy.experimental_local_results(strategy.run(step, args=(batch,)))
        for replica in local[1:]:  # the seed generator's state is one replicated variable
            np.testing.assert_array_equal(np.asarray(replica), np.asarray(local[0]))
        masks.append(np.asarray(local[0]))
    # The same draws as the layer called eagerly, once per step, on one replica's rows.
    eager = keras.layers.Dropout(0.5, seed=1)
    for mask in masks:
        np.testing.assert_array_equal(mask, np.asarray(eager(ones[:2], training=True)))
    assert not np.array_equal(masks[0], masks[1])
