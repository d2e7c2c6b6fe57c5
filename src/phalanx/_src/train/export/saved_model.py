"""A TF SavedModel of the inference function, through jax2tf, as Keras's `export` writes.

The module saved holds the weights as `tf.Variable`s (stored once, in `variables/`), a
`serve` endpoint taking the inputs as `predict` does, and a `serving_default` signature
(named inputs, named outputs) for TF Serving. The function is serialized as StableHLO in
an `XlaCallModule` op, lowered for every platform asked for (CPU, CUDA and TPU by default:
the same artifact serves on each), with the batch dimension symbolic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from phalanx._src.train.export import versions
from phalanx._src.train.export.function import Weight
from phalanx._src.train.export.signature import Inputs, output_names

PLATFORMS = ("cpu", "cuda", "tpu")


def write(
    folder: str,
    fn: Callable[[list[Any], Any], Any],
    weights: list[Weight],
    inputs: Inputs,
    platforms: Sequence[str],
) -> list[str]:
    """Writes the SavedModel into `folder` (which must not exist); returns the outputs'
    names."""
    tf = versions.tensorflow()
    from jax.experimental import jax2tf

    convention = versions.calling_convention(tf)
    module = tf.Module()
    module.weights = [
        tf.Variable(w.value, trainable=w.trainable, name=w.name.replace("/", "_")) for w in weights
    ]
    example = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), inputs.examples(1))
    names = output_names(jax.eval_shape(fn, [w.value for w in weights], example))
    with versions.convention(convention):
        converted = jax2tf.convert(
            fn,
            polymorphic_shapes=[None, inputs.polymorphic()],
            with_gradient=False,
            native_serialization_platforms=tuple(platforms),
        )
        structure = jax.tree.map(
            lambda spec, name: tf.TensorSpec(spec.shape, tf.as_dtype(spec.dtype), name=name),
            inputs.specs,
            jax.tree.unflatten(jax.tree.structure(inputs.specs), list(inputs.names)),
        )

        @tf.function(input_signature=[structure], autograph=False)
        def serve(batch: Any) -> Any:
            return converted(list(module.weights), batch)

        flat = [
            tf.TensorSpec(s.shape, s.dtype, name=n) for s, n in zip(
                jax.tree.leaves(structure), inputs.names, strict=True)
        ]  # fmt: skip

        @tf.function(input_signature=flat, autograph=False)
        def signature(*tensors: Any) -> dict[str, Any]:
            outputs = serve(jax.tree.unflatten(jax.tree.structure(inputs.specs), list(tensors)))
            return dict(zip(names, jax.tree.leaves(outputs), strict=True))

        module.serve = serve
        serve.get_concrete_function()  # traces: lowering errors surface here, nothing written
        tf.saved_model.save(
            module, folder, signatures={"serving_default": signature.get_concrete_function()}
        )
    return names


def run(folder: str, inputs: Inputs, names: list[str], batch: Any) -> list[np.ndarray]:
    """The SavedModel at `folder` on `batch` through its `serving_default` signature, as TF
    Serving runs it; the outputs in `names`' order."""
    tf = versions.tensorflow()
    serving = tf.saved_model.load(folder).signatures["serving_default"]
    flat = jax.tree.leaves(batch)
    outputs = serving(**{n: tf.constant(a) for n, a in zip(inputs.names, flat, strict=True)})
    return [np.asarray(outputs[name]) for name in names]
