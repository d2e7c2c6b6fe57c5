"""uint8 images to the device, normalised in the compiled step: same training, 4x fewer bytes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import phalanx
from phalanx.data import Dataset

ROWS, SIDE, BATCH = 96, 8, 16


class _Net(nnx.Module):
    """A small conv net; `scale` makes its first op the uint8 -> [0, 1] normalisation."""

    def __init__(self, scale: bool, rngs: nnx.Rngs) -> None:
        self.scale = scale
        self.conv = nnx.Conv(3, 4, (3, 3), rngs=rngs)
        self.out = nnx.Linear(SIDE * SIDE * 4, 3, rngs=rngs)

    def __call__(self, x):
        if self.scale:
            x = x.astype(jnp.float32) / 255.0  # on the device, fused into the first conv
        x = jax.nn.relu(self.conv(x))
        return self.out(x.reshape(x.shape[0], -1))


def _fit(pixels, labels, scale):
    strategy = phalanx.Strategy(devices=jax.devices()[:1])
    with strategy.scope():
        model = phalanx.Model(_Net(scale, nnx.Rngs(0)))
        model.compile(
            optimizer="sgd",
            loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    ds = Dataset.from_tensor_slices((pixels, labels)).batch(BATCH)
    history = model.fit(ds, epochs=2, verbose=0).history
    weights = nnx.state(model.module if hasattr(model, "module") else model, nnx.Param)
    return history, jax.tree.leaves(weights)


def test_fit_on_uint8_batches_equals_fit_on_float_batches_scaled_in_the_model():
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (ROWS, SIDE, SIDE, 3), dtype=np.uint8)
    labels = (pixels[:, 0, 0, 0] % 3).astype(np.int32)
    as_uint8, weights_uint8 = _fit(pixels, labels, scale=True)
    as_float, weights_float = _fit(pixels.astype(np.float32) / 255.0, labels, scale=False)
    np.testing.assert_allclose(as_uint8["loss"], as_float["loss"], rtol=1e-5)
    assert len(weights_uint8) == len(weights_float) > 0
    for a, b in zip(weights_uint8, weights_float, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # What crossed to the device: the images' bytes are 4x fewer as uint8.
    # (fit's transfer ledger; labels and the int32 masks are the same in both runs).
    sent_uint8 = sum(as_uint8["host_to_device_mib"])
    sent_float = sum(as_float["host_to_device_mib"])
    image_mib = pixels.nbytes / 2**20
    assert sent_float - sent_uint8 >= 2.9 * image_mib, (sent_uint8, sent_float, image_mib)
