"""The second seed program, ported: a custom training loop over a distributed dataset.

The seed's loop: a `tf.function` step run per replica with `strategy.run`, each replica
computing `tf.nn.compute_average_loss` over its share of the global batch, gradients
applied by the optimizer, a cross-replica accuracy metric, and the per-replica losses
summed with `strategy.reduce`. The phalanx program keeps every one of those names.

    python examples/custom_training_loop.py --epochs 1 --steps 20
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
import optax
from flax import nnx

import phalanx


class MLP(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(784, 128, rngs=rngs)
        self.out = nnx.Linear(128, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.relu(self.hidden(x)))  # logits


def train_step(model, optimizer, accuracy, inputs):
    """Runs once per replica, on that replica's share of the global batch."""
    features, labels = inputs

    def loss_fn(model):
        predictions = model(features)
        per_example_loss = optax.softmax_cross_entropy_with_integer_labels(predictions, labels)
        # Sum over this replica's examples / the global batch: summed over replicas, the mean.
        return phalanx.compute_average_loss(per_example_loss), predictions

    (loss, predictions), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    # tf.distribute's optimizer all-reduces the gradients; here it is explicit.
    grads = phalanx.get_replica_context().all_reduce("sum", grads)
    optimizer.update(model, grads)
    accuracy.update_state(labels, predictions)  # summed across replicas when read
    return loss


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=None, help="steps per epoch (default: all)")
    args = parser.parse_args(argv)

    phalanx.cluster.resolve()
    strategy = phalanx.Strategy()
    batch_size = 64 * strategy.num_replicas_in_sync  # global batch across all replicas

    (x_train, y_train), _ = phalanx.datasets.mnist.load_data()
    x_train = x_train.reshape(-1, 784).astype(np.float32) / 255.0
    dataset = phalanx.data.Dataset.from_tensor_slices((x_train, y_train.astype(np.int32)))
    dataset = dataset.shuffle(10000, seed=0).batch(batch_size)
    if args.steps:
        dataset = dataset.take(args.steps)
    distributed_train_dataset = strategy.experimental_distribute_dataset(dataset)

    with strategy.scope():
        model = MLP(rngs=nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
        accuracy_metric = phalanx.metrics.SparseCategoricalAccuracy()

    epoch_losses = []
    for epoch in range(args.epochs):
        total, batches = 0.0, 0
        for step, batch in enumerate(distributed_train_dataset):
            per_replica_loss = strategy.run(
                train_step, args=(model, optimizer, accuracy_metric, batch)
            )
            loss = strategy.reduce("sum", per_replica_loss, axis=None)
            total, batches = total + float(loss), batches + 1
            if step % 100 == 0:
                print(f"Epoch {epoch}, Step {step}: loss {float(loss):.4f}")
        epoch_losses.append(total / max(batches, 1))
        print(
            f"Epoch {epoch}: loss {epoch_losses[-1]:.4f}, "
            f"accuracy {float(accuracy_metric.result()):.4f}"
        )
        accuracy_metric.reset_state()
    return epoch_losses


if __name__ == "__main__":
    main()
