"""The seeds' first program with `import keras` for `tf.keras`, on every replica, against
Keras's own fit on one device from the same weights and data (unshuffled)."""

import keras
import numpy as np
import pytest
from keras_models import mlp, mnist_subset, twin


def _compile_like_the_seed(model):
    model.compile(
        optimizer=keras.optimizers.Adam(),
        loss=keras.losses.CategoricalCrossentropy(),
        metrics=[keras.metrics.CategoricalAccuracy(name="train_accuracy")],
    )


def test_seed_program_matches_keras_fit(mnist_path, all_devices):
    x, y = mnist_subset(mnist_path, 256)
    global_batch = 8 * all_devices.num_replicas_in_sync
    reference, mine, model = twin(mlp, all_devices)
    _compile_like_the_seed(reference)
    with all_devices.scope():
        _compile_like_the_seed(model)
    expected = reference.fit(x, y, batch_size=global_batch, epochs=3, shuffle=False, verbose=0)
    history = model.fit(x, y, batch_size=global_batch, epochs=3, shuffle=False, verbose=0)
    for key in ("loss", "train_accuracy"):
        np.testing.assert_allclose(history.history[key], expected.history[key], atol=1e-4)
    # The user's Keras object holds the trained weights.
    for a, b in zip(mine.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.parametrize(
    "optimizer", ["adam", "nadam", keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True)]
)
def test_string_names_and_objects_give_kerass_numbers(mnist_path, all_devices, optimizer):
    """Names phalanx knows ('adam', 'sparse_categorical_crossentropy', 'accuracy'), names
    only Keras knows ('nadam', 'sparse_categorical_crossentropy' as a metric), and Keras
    objects."""
    x, y = mnist_subset(mnist_path, 96)
    labels = y.argmax(1).astype(np.int32)
    reference, _, model = twin(lambda: mlp(hidden=16), all_devices)
    kwargs = dict(
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy", "sparse_categorical_crossentropy"],
    )
    reference.compile(optimizer=optimizer, **kwargs)
    model.compile(optimizer=optimizer, **kwargs)
    expected = reference.fit(x, labels, batch_size=32, epochs=2, shuffle=False, verbose=0)
    history = model.fit(x, labels, batch_size=32, epochs=2, shuffle=False, verbose=0)
    for key in ("loss", "accuracy", "sparse_categorical_crossentropy"):
        np.testing.assert_allclose(history.history[key], expected.history[key], atol=1e-4)


def test_keras_evaluate_sees_the_trained_weights(mnist_path, all_devices):
    x, y = mnist_subset(mnist_path, 64)
    _, mine, model = twin(mlp, all_devices)
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    mine.compile(loss="categorical_crossentropy")
    ours = model.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)
    theirs = mine.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)
    np.testing.assert_allclose(ours["loss"], theirs["loss"], rtol=1e-5)
    assert isinstance(model.module, keras.Model)
