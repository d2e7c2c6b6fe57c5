"""An NNX module's `losses` property plays `model.losses`'s role in a custom loop: read
inside the `loss_fn(model)` that `nnx.value_and_grad` differentiates, its terms are
computed from the parameters being differentiated, so their gradient is in the step (as
docs/migration.md says), on 1 and N replicas."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import phalanx

pytestmark = pytest.mark.multidevice

N = jax.device_count()
GLOBAL_BATCH_SIZE = 2 * N
X = np.random.RandomState(1).randn(GLOBAL_BATCH_SIZE, 3).astype(np.float32)
Y = X @ np.array([[1.0], [-2.0], [0.5]], np.float32)
L2, RATE = 0.1, 0.05


class Regression(nnx.Module):
    def __init__(self):
        self.dense = nnx.Linear(3, 1, rngs=nnx.Rngs(0))

    @property
    def losses(self):
        return [L2 * jnp.sum(self.dense.kernel[...] ** 2)]

    def __call__(self, x):
        return self.dense(x)


@pytest.mark.parametrize("replicas", sorted({1, N}))
def test_a_losses_property_carries_its_gradient(replicas):
    strategy = phalanx.Strategy(devices=jax.devices()[:replicas])
    with strategy.scope():
        model = Regression()
        optimizer = nnx.Optimizer(model, optax.sgd(RATE), wrt=nnx.Param)
    w0 = np.asarray(model.dense.kernel[...], np.float64)
    b0 = np.asarray(model.dense.bias[...], np.float64)

    def train_step(inputs):
        features, labels = inputs

        def loss_fn(model):
            per_example = jnp.mean((model(features) - labels) ** 2, axis=-1)
            loss = phalanx.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH_SIZE)
            return loss + phalanx.scale_regularization_loss(sum(model.losses))

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    @phalanx.function
    def distributed_train_step(inputs):
        return strategy.reduce("sum", strategy.run(train_step, args=(inputs,)), axis=None)

    dataset = phalanx.data.Dataset.from_tensor_slices((X, Y)).batch(GLOBAL_BATCH_SIZE)
    for batch in strategy.experimental_distribute_dataset(dataset):
        distributed_train_step(batch)

    error = X @ w0 + b0 - Y
    gradient = 2 * X.T @ error / GLOBAL_BATCH_SIZE + 2 * L2 * w0
    np.testing.assert_allclose(model.dense.kernel[...], w0 - RATE * gradient, rtol=1e-5)
