"""`compile(extra_losses=fn)`: an NNX module's regularization, added once per global batch."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import MLP, make_data
from flax import nnx

import phalanx

LAMBDA = 0.05


def l2(module):
    """The documented example: an L2 penalty on both kernels."""
    return [
        LAMBDA * jnp.sum(module.l1.kernel[...] ** 2),
        LAMBDA * jnp.sum(module.l2.kernel[...] ** 2),
    ]


def _expected(x, y, batch, steps):
    """Plain JAX: SGD on mean cross-entropy + the L2 terms, over the same batches."""
    params = nnx.state(MLP(nnx.Rngs(0)), nnx.Param)
    graphdef = nnx.graphdef(MLP(nnx.Rngs(0)))

    def loss(params, xb, yb):
        module = nnx.merge(graphdef, params)
        ce = optax.softmax_cross_entropy_with_integer_labels(module(xb), yb).mean()
        return ce + sum(l2(module))

    @jax.jit  # op by op, each step compiled dozens of small programs (~10 s in all)
    def step(params, xb, yb):
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, jax.grad(loss)(params, xb, yb))

    for i in range(steps):
        params = step(params, x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch])
    return params, loss


def test_extra_losses_train_and_evaluate_as_one_device_with_the_penalty(all_devices):
    x, y = make_data(44)  # the last batch of 8 is a padded partial one (4 rows)
    with all_devices.scope():
        model = phalanx.Model(MLP(nnx.Rngs(0)))
        model.compile(
            optimizer=optax.sgd(0.01),
            loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
            extra_losses=l2,
        )
    assert len(model.losses) == 2
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    params, loss = _expected(x, y, 8, 6)
    ours = nnx.state(model.module, nnx.Param)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    scores = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    np.testing.assert_allclose(scores["loss"], loss(params, x, y), rtol=1e-5)
    np.testing.assert_allclose(
        sum(float(v) for v in model.losses), float(sum(l2(model.module))), rtol=1e-6
    )


def test_extra_losses_must_be_a_function():
    model = phalanx.Model(MLP(nnx.Rngs(0)))
    with pytest.raises(TypeError, match="extra_losses must be a function"):
        model.compile(optimizer="sgd", loss="mse", extra_losses=0.01)
