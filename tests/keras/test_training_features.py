"""Keras models with phalanx's training machinery: steps_per_execution, gradient
accumulation, BackupAndRestore, learning-rate callbacks, checkpoints, strategy.run."""

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest
from keras_models import mlp, twin

import phalanx
from phalanx._src.train.api.keras_bridge.optimizer import from_keras


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 12)).astype(np.float32)
    return x, (np.abs(x[:, :5]).argmax(1)).astype(np.int32)


def _net():
    return keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(16),
            keras.layers.BatchNormalization(),
            keras.layers.Dropout(0.25),
            keras.layers.Dense(5),
        ]
    )


def _model(strategy, seed=0, **compile_kwargs):
    _, _, model = twin(_net, strategy, seed=seed)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        **compile_kwargs,
    )
    return model


def test_steps_per_execution_equals_single_steps(all_devices):
    x, y = _data(64)
    single = _model(all_devices)
    fused = _model(all_devices, steps_per_execution=4)
    expected = single.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    history = fused.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=1e-5)
    for a, b in zip(fused.get_weights(), single.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_gradient_accumulation_equals_the_larger_batch(all_devices):
    x, y = _data(64)
    weights = []
    for batch, steps in ((16, 1), (8, 2)):
        _, mine, model = twin(lambda: mlp(hidden=16, din=12, classes=5), all_devices)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-2),
            loss=keras.losses.SparseCategoricalCrossentropy(),
            gradient_accumulation_steps=steps,
        )
        model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0)
        weights.append(mine.get_weights())
    for a, b in zip(*weights, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


class _Interrupt(phalanx.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 2:
            raise RuntimeError("interrupted")


def test_backup_and_restore_resumes_a_keras_model(all_devices, tmp_path):
    x, y = _data(64)
    backup = phalanx.callbacks.BackupAndRestore(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="interrupted"):
        _model(all_devices).fit(
            x,
            y,
            batch_size=16,
            epochs=4,
            shuffle=False,
            verbose=0,
            callbacks=[backup, _Interrupt()],
        )
    resumed = _model(all_devices, seed=5)  # other weights: the backup wins
    history = resumed.fit(
        x, y, batch_size=16, epochs=4, shuffle=False, verbose=0, callbacks=[backup]
    )
    assert len(history.history["loss"]) == 2
    straight = _model(all_devices)
    straight.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0)
    for a, b in zip(resumed.get_weights(), straight.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_learning_rate_of_a_keras_optimizer_is_settable(all_devices):
    model = _model(all_devices)
    assert model.learning_rate == pytest.approx(1e-2)
    x, y = _data(32)
    schedule = phalanx.callbacks.LearningRateScheduler(lambda epoch, lr: 0.5**epoch * 1e-2)
    model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[schedule])
    assert model.learning_rate == pytest.approx(2.5e-3)


@pytest.mark.multidevice
def test_strategy_run_calls_the_keras_model_per_replica(all_devices):
    """A custom loop: each replica runs the Keras model on its share of the batch through
    the phalanx adapter, the gradients are all-reduced, and one step equals Keras's own
    train step on the whole global batch."""
    x, y = _data(8 * all_devices.num_replicas_in_sync)
    reference, _, model = twin(lambda: mlp(hidden=16, din=12, classes=5), all_devices)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    reference.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss_fn)
    expected = reference.train_on_batch(x, y)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss_fn)
    tx = from_keras(keras.optimizers.SGD(0.5))
    params, state = model.adapter.variables()
    opt_state = tx.init(params)

    def step(params, state, opt_state, inputs):  # once per replica
        features, labels = inputs
        rows = np.shape(features)[0]

        def loss(params):
            probs, new_state = model.adapter.apply(
                params, state, features, training=True, mask=jnp.ones((rows,), jnp.float32)
            )
            per_example = keras.losses.sparse_categorical_crossentropy(labels, probs)
            return phalanx.compute_average_loss(per_example), new_state

        (value, _), grads = jax.value_and_grad(loss, has_aux=True)(params)
        grads = phalanx.get_replica_context().all_reduce("sum", grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        return [p + u for p, u in zip(params, updates, strict=True)], opt_state, value

    dataset = phalanx.data.Dataset.from_tensor_slices((x, y)).batch(len(x))
    batch = next(iter(all_devices.experimental_distribute_dataset(dataset)))
    params, opt_state, per_replica = all_devices.run(step, args=(params, state, opt_state, batch))
    np.testing.assert_allclose(
        float(all_devices.reduce("sum", per_replica, axis=None)), expected, rtol=1e-5
    )
    for ours, theirs in zip(params, reference.trainable_variables, strict=True):
        # The optimizer state came in as each replica's own copy, so the new parameters come
        # back per replica (tf's mirrored variables): every replica holds the same values.
        for replica in getattr(ours, "values", (ours,)):
            np.testing.assert_allclose(np.asarray(replica), np.asarray(theirs.value), atol=1e-6)
