"""TensorFlow's tutorial "Distributed training with Keras" (tensorflow/docs,
site/en/tutorials/distribute/keras.ipynb), ported with renames only:
tf.distribute.MirroredStrategy -> phalanx.Strategy, tf.data -> phalanx.data, tf.keras ->
Keras 3 wrapped in phalanx.Model. Its code cells run in order on the suite's 8 fake devices,
in a temporary working directory (its relative paths stay as written); the asserts are ours.

Lines that still differ from the original beyond those renames, and why:
1. `tfds.load(name='mnist', with_info=True, as_supervised=True)` ->
   `phalanx.datasets.mnist.load_data(path=mnist_path)` (no download), as 1024 training and
   200 test images with a channel axis (TFDS's (28, 28, 1)); `info.splits[...].num_examples`
   -> the arrays' lengths; `tfds.disable_progress_bar()` and `print(tf.__version__)` ->
   `print(phalanx.__version__)`.
2. `tf.cast(image, tf.float32)` -> `image.astype(np.float32)`: `map` runs on the host.
3. `Conv2D(32, 3, ..., input_shape=(28, 28, 1))` -> `keras.Input((28, 28, 1))` first and
   `Conv2D(8, 3, ...)`, `Dense(64)` -> `Dense(32)`: Keras 3 warns about `input_shape` on a
   layer; the narrower layers keep the suite's time budget on CPU.
4. `epochs=12` -> 4 and `decay`'s epoch bounds 3 / 7 -> 1 / 2: the suite's time budget; the
   schedule keeps its three steps.
5. `"ckpt_{epoch}"` -> `"ckpt_{epoch}.weights.h5"`: Keras 3 writes weights only to
   `.weights.h5` files (TF's own Keras 3 refuses the original name the same way), and
   `tf.train.latest_checkpoint(checkpoint_dir)` (TF's checkpoint index) -> the newest
   file's name, `os.path.join(checkpoint_dir, "ckpt_4.weights.h5")`.
6. `model.optimizer.lr` -> `model.optimizer.learning_rate`: Keras 3 removed the `lr` alias.
7. `!ls {checkpoint_dir}` and `!ls -sh ./logs` (notebook shell lines) ->
   `print(sorted(os.listdir(...)))`.
8. `model.save(path, save_format='tf')` with `path = 'saved_model/'` -> `model.save(path)`
   with `path = 'saved_model.keras'`: Keras 3 saves `.keras` files (no SavedModel, no
   `save_format`); `tf.keras.models.load_model(path)` gives back a plain Keras model. Loaded
   outside the strategy it is evaluated by plain Keras on the phalanx dataset, as tf.keras
   evaluates a tf.data dataset; under `strategy.scope()` it is wrapped in `phalanx.Model`.

The test set's 200 images are one partial batch of `BATCH_SIZE` (512), which phalanx pads
and masks: every evaluate must equal Keras's own evaluate of the saved file.
"""

from __future__ import annotations

import os
import re

os.environ.setdefault("KERAS_BACKEND", "jax")  # before keras's first import, as tests/keras does

import keras
import numpy as np

import phalanx

N_TRAIN, N_TEST = 1024, 200


def test_distributed_training_with_keras(mnist_path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # Import dependencies
    print(phalanx.__version__)

    # Download the dataset
    (x_train, y_train), (x_test, y_test) = phalanx.datasets.mnist.load_data(path=mnist_path)
    datasets = {
        "train": phalanx.data.Dataset.from_tensor_slices(
            (x_train[:N_TRAIN, :, :, None], y_train[:N_TRAIN].astype(np.int32))
        ),
        "test": phalanx.data.Dataset.from_tensor_slices(
            (x_test[:N_TEST, :, :, None], y_test[:N_TEST].astype(np.int32))
        ),
    }
    mnist_train, mnist_test = datasets["train"], datasets["test"]

    # Define distribution strategy
    strategy = phalanx.Strategy()
    print("Number of devices: {}".format(strategy.num_replicas_in_sync))  # noqa: UP032

    # Setup input pipeline
    num_train_examples = N_TRAIN
    num_test_examples = N_TEST

    BUFFER_SIZE = 10000

    BATCH_SIZE_PER_REPLICA = 64
    BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync

    def scale(image, label):
        image = image.astype(np.float32)
        image /= 255

        return image, label

    train_dataset = mnist_train.map(scale).cache().shuffle(BUFFER_SIZE).batch(BATCH_SIZE)
    eval_dataset = mnist_test.map(scale).batch(BATCH_SIZE)

    # Create the model
    with strategy.scope():
        model = phalanx.Model(
            keras.Sequential(
                [
                    keras.Input((28, 28, 1)),
                    keras.layers.Conv2D(8, 3, activation="relu"),
                    keras.layers.MaxPooling2D(),
                    keras.layers.Flatten(),
                    keras.layers.Dense(32, activation="relu"),
                    keras.layers.Dense(10),
                ]
            )
        )

        model.compile(
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            optimizer=keras.optimizers.Adam(),
            metrics=["accuracy"],
        )

    # Define the callbacks
    # Define the checkpoint directory to store the checkpoints
    checkpoint_dir = "./training_checkpoints"
    # Name of the checkpoint files
    checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt_{epoch}.weights.h5")

    # Function for decaying the learning rate.
    # You can define any decay function you need.
    def decay(epoch):
        if epoch < 1:
            return 1e-3
        elif epoch >= 1 and epoch < 2:
            return 1e-4
        else:
            return 1e-5

    # Callback for printing the LR at the end of each epoch.
    class PrintLR(phalanx.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            print(
                "\nLearning rate for epoch {} is {}".format(  # noqa: UP032
                    epoch + 1, model.optimizer.learning_rate.numpy()
                )
            )

    callbacks = [
        phalanx.callbacks.TensorBoard(log_dir="./logs"),
        phalanx.callbacks.ModelCheckpoint(filepath=checkpoint_prefix, save_weights_only=True),
        phalanx.callbacks.LearningRateScheduler(decay),
        PrintLR(),
    ]

    # Train and evaluate
    model.fit(train_dataset, epochs=4, callbacks=callbacks)

    # check the checkpoint directory
    print(sorted(os.listdir(checkpoint_dir)))

    model.load_weights(os.path.join(checkpoint_dir, "ckpt_4.weights.h5"))

    eval_loss, eval_acc = model.evaluate(eval_dataset)

    print("Eval loss: {}, Eval Accuracy: {}".format(eval_loss, eval_acc))  # noqa: UP032

    print(sorted(os.listdir("./logs")))

    # Export to SavedModel
    path = "saved_model.keras"

    model.save(path)

    unreplicated_model = keras.models.load_model(path)

    unreplicated_model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.Adam(),
        metrics=["accuracy"],
    )

    eval_loss, eval_acc = unreplicated_model.evaluate(eval_dataset)

    print("Eval loss: {}, Eval Accuracy: {}".format(eval_loss, eval_acc))  # noqa: UP032

    with strategy.scope():
        replicated_model = phalanx.Model(keras.models.load_model(path))
        replicated_model.compile(
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            optimizer=keras.optimizers.Adam(),
            metrics=["accuracy"],
        )

        eval_loss, eval_acc = replicated_model.evaluate(eval_dataset)
        print("Eval loss: {}, Eval Accuracy: {}".format(eval_loss, eval_acc))  # noqa: UP032

    # Our checks: the files, the schedule, and one set of numbers everywhere.
    printed = capsys.readouterr().out
    assert sorted(os.listdir(checkpoint_dir)) == [f"ckpt_{e}.weights.h5" for e in (1, 2, 3, 4)]
    assert os.listdir("./logs")
    for epoch, rate in ((1, 1e-3), (2, 1e-4), (3, 1e-5), (4, 1e-5)):
        assert f"Learning rate for epoch {epoch} is {np.float32(rate)}" in printed
    assert num_train_examples // BATCH_SIZE == 2 and num_test_examples < BATCH_SIZE
    # Keras's own evaluate of the saved file, and both reloaded models, agree with the
    # trained model on every test image (one partial batch, padded).
    plain = keras.models.load_model(path)
    plain.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    x = x_test[:N_TEST, :, :, None].astype(np.float32) / 255
    keras_loss, keras_acc = plain.evaluate(x, y_test[:N_TEST], verbose=0)
    evaluations = re.findall(r"Eval loss: (\S+), Eval Accuracy: (\S+)", printed)
    assert len(evaluations) == 3
    for loss, accuracy in evaluations:
        np.testing.assert_allclose(float(loss), keras_loss, rtol=1e-5)
        np.testing.assert_allclose(float(accuracy), keras_acc, rtol=1e-6)
    assert not isinstance(unreplicated_model, phalanx.Model)  # plain Keras read the dataset
    assert replicated_model.strategy.num_replicas_in_sync == strategy.num_replicas_in_sync
