"""From TensorFlow to phalanx and on to serving: a TF run's checkpoint restored, the run
continued, the model exported for TF Serving and ONNX Runtime.

1. The TensorFlow job (only so that there is one to bring in; in real life it is your
   run's checkpoint folder, pass it with --tf-dir): a Keras 3 model on the 8x8 digits,
   trained in TF's custom loop, saved by `tf.train.CheckpointManager`. It runs in a child
   process with KERAS_BACKEND=tensorflow.
2. phalanx, without TensorFlow: the same Keras model on JAX, `phalanx.Checkpoint` restores
   TF's newest checkpoint (weights, BatchNorm statistics, Adam's slots and step count),
   and `phalanx.Model` continues from the restored optimizer, under BackupAndRestore.
3. `model.export`: a SavedModel for TF Serving, an ONNX file for ONNX Runtime, each
   checked against `predict` by its own runtime before it is kept.

    python examples/from_tensorflow.py --tf-steps 30 --epochs 2 --out runs/from_tf
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import numpy as np


def build_model():
    """The model, in Keras 3: the same code builds it on TensorFlow and on JAX."""
    import keras

    inputs = keras.Input((64,), name="pixels")
    h = keras.layers.Dense(64, activation="relu")(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Dropout(0.2)(h)
    return keras.Model(inputs, keras.layers.Dense(10)(h))


def digits():
    from phalanx.datasets import digits

    (x, y), (x_test, y_test) = digits.load_data()
    scale = lambda a: (a.reshape(len(a), -1) / 16.0).astype(np.float32)  # noqa: E731
    return scale(x), y.astype(np.int32), scale(x_test), y_test.astype(np.int32)


def tensorflow_job(folder: str, steps: int) -> None:
    """Part 1, under KERAS_BACKEND=tensorflow: TF's custom loop and CheckpointManager."""
    import keras
    import tensorflow as tf

    x, y, _, _ = digits()
    model, optimizer = build_model(), keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, folder, max_to_keep=3)
    for step in range(steps):
        rows = slice(step * 64 % (len(x) - 64), step * 64 % (len(x) - 64) + 64)
        with tf.GradientTape() as tape:
            loss = loss_fn(y[rows], model(x[rows], training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        if (step + 1) % 10 == 0:
            manager.save()
    print(f"TensorFlow: {steps} steps, loss {float(loss):.4f}, saved {manager.latest_checkpoint}")


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tf-dir", help="a TF run's checkpoint folder (default: make one)")
    parser.add_argument("--tf-steps", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default=os.path.join("runs", "from_tf"))
    parser.add_argument("--tf-job", help=argparse.SUPPRESS)  # the child process of part 1
    args = parser.parse_args(argv)
    if args.tf_job:
        tensorflow_job(args.tf_job, args.tf_steps)
        return {}

    folder = args.tf_dir or os.path.join(args.out, "checkpoints")
    if args.tf_dir is None:  # part 1: a TF job to bring in
        env = {**os.environ, "KERAS_BACKEND": "tensorflow"}
        cmd = [sys.executable, __file__, "--tf-job", folder, "--tf-steps", str(args.tf_steps)]
        subprocess.run(cmd, check=True, env=env)

    # Part 2: phalanx, on JAX. Keras's backend is chosen at its first import.
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    import phalanx

    x, y, x_test, y_test = digits()
    model, optimizer = build_model(), keras.optimizers.Adam(1e-3)
    checkpoint = phalanx.Checkpoint(model=model, optimizer=optimizer)
    restored = phalanx.latest_checkpoint(folder)  # reads TF's `checkpoint` state file
    checkpoint.restore(restored).assert_consumed()
    print(f"phalanx: restored {restored} at step {int(optimizer.iterations.value)}")

    # phalanx.Model takes the restored optimizer's state as its own (as Keras's compile
    # keeps a built optimizer's). From here phalanx's checkpoints carry the run: they hold
    # the whole training state, and BackupAndRestore resumes an interrupted fit.
    trainer = phalanx.Model(model, strategy=phalanx.Strategy())
    trainer.compile(
        optimizer=optimizer,
        loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    before = trainer.evaluate(x_test, y_test, verbose=0, return_dict=True)
    backup = phalanx.callbacks.BackupAndRestore(os.path.join(args.out, "backup"))
    trainer.fit(x, y, batch_size=64, epochs=args.epochs, verbose=2, callbacks=[backup])
    after = trainer.evaluate(x_test, y_test, verbose=0, return_dict=True)
    print(f"test accuracy: {before['accuracy']:.4f} restored, {after['accuracy']:.4f} continued")

    # Part 3: serving artifacts, each checked by its runtime against predict.
    served = os.path.join(args.out, "served")
    trainer.export(os.path.join(served, "digits"))  # TF Serving: serving_default
    trainer.export(os.path.join(served, "digits.onnx"), format="onnx")
    print("Exported for TF Serving and ONNX Runtime.")
    return {"restored_accuracy": before["accuracy"], "accuracy": after["accuracy"]}


if __name__ == "__main__":
    main()
