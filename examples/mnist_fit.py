"""The first seed program, ported: the MNIST MLP built in `strategy.scope()` and trained with fit.

TensorFlow's version resolves a TPU (falling back to the default strategy), builds a Keras
Sequential 784-128-10 softmax model in the strategy's scope, and fits it for 5 epochs on a
shuffled, repeated tf.data pipeline batched at 128 per replica x replicas. Here the same
program runs on JAX, on every device `phalanx.cluster.resolve()` finds (TPU > GPU > CPU).

    python examples/mnist_fit.py                   # 5 epochs, as the seed
    python examples/mnist_fit.py --epochs 1 --steps-per-epoch 10
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
from flax import nnx

import phalanx


class MLP(nnx.Module):
    """Dense(128, relu) -> Dense(10, softmax), as the seed's Sequential model."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(784, 128, rngs=rngs)
        self.out = nnx.Linear(128, 10, rngs=rngs)

    def __call__(self, x):
        return jax.nn.softmax(self.out(jax.nn.relu(self.hidden(x))))


def create_dataset(global_batch_size: int) -> phalanx.data.Dataset:
    """The seed's pipeline: scale, flatten, one-hot, then shuffle, repeat and batch."""
    (x_train, y_train), _ = phalanx.datasets.mnist.load_data()
    x_train = x_train.reshape(-1, 784).astype(np.float32) / 255.0
    y_train = np.eye(10, dtype=np.float32)[y_train]
    dataset = phalanx.data.Dataset.from_tensor_slices((x_train, y_train))
    # Important: shuffle, repeat, and batch *before* distributing.
    dataset = dataset.shuffle(60000, seed=0).repeat().batch(global_batch_size)
    return dataset.prefetch(2)


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps-per-epoch", type=int, default=None)
    args = parser.parse_args(argv)

    topology = phalanx.cluster.resolve()  # no accelerator: falls back and says so
    print(topology.summary())
    strategy = phalanx.Strategy()
    print(f"Number of accelerators: {strategy.num_replicas_in_sync}")

    per_replica_batch_size = 128
    global_batch_size = per_replica_batch_size * strategy.num_replicas_in_sync
    print(f"Global batch size: {global_batch_size}")
    train_dataset = create_dataset(global_batch_size)

    with strategy.scope():
        model = phalanx.Model(MLP(rngs=nnx.Rngs(0)))
        model.compile(
            optimizer="adam",
            loss=phalanx.losses.CategoricalCrossentropy(),
            metrics=[phalanx.metrics.CategoricalAccuracy(name="train_accuracy")],
        )

    steps_per_epoch = args.steps_per_epoch or 60000 // global_batch_size
    print("Starting training...")
    history = model.fit(train_dataset, epochs=args.epochs, steps_per_epoch=steps_per_epoch)
    print("Training finished.")
    return history.history


if __name__ == "__main__":
    main()
