"""`Model.export(filepath, format=...)`: see the package docstring.

The artifact is written beside its destination under a temporary name, run once on a
small batch by the runtime that will serve it (TensorFlow, ONNX Runtime) and compared with
the exported function computed by jax, then moved into place: a failed or interrupted
export leaves no artifact, and one that would serve other numbers is never written. With
several processes every process calls `export` (gathering model-parallel weights is a
collective); process 0 writes.
"""

from __future__ import annotations

import gc
import os
import shutil
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from phalanx._src.train.export import function, signature, versions

FORMATS = ("tf_saved_model", "onnx")
_CHECK_ROWS = 3
_TOLERANCE = 1e-4  # of the outputs' scale: a converter's float32 rounding, not a wrong graph


def _check_format(format: Any) -> str:
    if format not in FORMATS:
        raise ValueError(
            f"export format={format!r} is not one phalanx writes; the formats: {list(FORMATS)} "
            "(Keras's names), e.g. model.export('served/model', format='tf_saved_model')"
        )
    return format


def _temporary(path: str) -> str:
    """A fresh hidden folder beside `path`, to write the artifact in under its own name."""
    folder, name = os.path.split(path)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{name}.phalanx-tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    return tmp


def _move_into_place(tmp: str, path: str) -> None:
    """Moves the checked artifact from `tmp` to `path` (an ONNX file's weights file first,
    so the model never names a missing one)."""
    name = os.path.basename(path)
    for part in sorted(os.listdir(tmp), key=lambda n: n == name):
        target = os.path.join(os.path.dirname(path), part)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)  # an earlier SavedModel: replaced, as Keras's export does
        os.replace(os.path.join(tmp, part), target)


def _compare(got: list[np.ndarray], want: list[Any], what: str) -> None:
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        b = np.asarray(b)
        scale = max(1.0, float(np.max(np.abs(b)))) if b.size else 1.0
        if a.shape != b.shape or not np.allclose(a, b, rtol=0, atol=_TOLERANCE * scale):
            error = np.max(np.abs(a - b)) if a.shape == b.shape else f"shape {a.shape}"
            raise RuntimeError(
                f"the exported {what} computes output {index} differently from the model "
                f"(largest difference {error}, expected shape {b.shape}); nothing was written. "
                "Please report this with the model; format='tf_saved_model' runs jax's own "
                "program"
            )


def export(
    model: Any,
    filepath: str | os.PathLike,
    format: str = "tf_saved_model",
    *,
    input_signature: Any = None,
    verbose: bool = True,
    platforms: Sequence[str] | None = None,
) -> None:
    """Writes `model` (a `phalanx.Model`) for serving; see `Model.export`."""
    _check_format(format)
    if not isinstance(filepath, str | os.PathLike) or not os.fspath(filepath):
        raise TypeError(f"export needs a path (str or os.PathLike), got {filepath!r}")
    path = os.path.abspath(os.fspath(filepath))
    module = versions.tensorflow() if format == "tf_saved_model" else versions.onnx()
    if format == "onnx" and platforms is not None:
        raise TypeError("platforms= is for format='tf_saved_model' (ONNX graphs are portable)")
    policy = getattr(model, "policy", None)
    if format == "onnx" and policy is not None and policy.compute_dtype != np.float32:
        raise ValueError(
            f"format='onnx' exports models computing in float32 (ONNX Runtime has no "
            f"{np.dtype(policy.compute_dtype).name} CPU kernels, and Keras's ONNX export asks "
            f"the same); this one was compiled with precision={policy.name!r}. Compile it "
            "again with precision='float32' (the trained weights stay) before exporting, or "
            "use format='tf_saved_model', which keeps the policy"
        )
    inputs = signature.resolve(model, input_signature)
    fn, weights, on_devices = function.serving(model)
    batch = inputs.examples(_CHECK_ROWS)
    try:
        want = jax.tree.leaves(jax.jit(fn)(on_devices, batch))
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"the model does not take inputs of the exported signature {inputs.specs} "
            f"({error}); pass input_signature= with the shapes it takes, e.g. "
            "phalanx.data.TensorSpec((None, 784), 'float32')"
        ) from error
    if jax.process_index() == 0:
        tmp = _temporary(path)
        try:
            artifact = os.path.join(tmp, os.path.basename(path))
            got = _write(module, format, artifact, fn, weights, inputs, platforms, batch)
            _compare(got, want, "SavedModel" if format == "tf_saved_model" else "ONNX graph")
            _move_into_place(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if verbose:
            shapes = {
                name: spec.shape for name, spec in zip(inputs.names, inputs.leaves, strict=True)
            }
            print(f"Saved the model for serving at '{path}' ({format}); inputs {shapes}")
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("phalanx-export")


def _write(
    module: Any,
    format: str,
    artifact: str,
    fn: Any,
    weights: list[function.Weight],
    inputs: signature.Inputs,
    platforms: Sequence[str] | None,
    batch: Any,
) -> list[np.ndarray]:
    """Writes the artifact at `artifact`; returns its outputs on `batch`, computed by the
    runtime that serves it."""
    if format == "tf_saved_model":
        from phalanx._src.train.export import saved_model

        names = saved_model.write(artifact, fn, weights, inputs, platforms or saved_model.PLATFORMS)
        gc.collect()  # the written module's variables (a copy of every weight) go first
        return saved_model.run(artifact, inputs, names, batch)
    from phalanx._src.train.export import onnx_export

    proto, names = onnx_export.to_onnx(module, fn, weights, inputs)
    onnx_export.save(module, proto, artifact)
    del proto  # its copy of every weight, before ONNX Runtime loads the file's
    gc.collect()
    try:
        return onnx_export.run(artifact, inputs, names, batch)
    except Exception as error:  # ONNX Runtime's own errors: a kernel it lacks, mostly
        raise RuntimeError(
            f"ONNX Runtime cannot run the exported graph ({error}); nothing was written. A "
            "layer computing in bfloat16 or float16 has no CPU kernels there: give it "
            "dtype='float32', or export with format='tf_saved_model'"
        ) from error


class Exportable:
    """`Model.export`, kept beside the converters (`phalanx.Model` inherits it)."""

    def export(
        self,
        filepath: str | os.PathLike,
        format: str = "tf_saved_model",
        *,
        input_signature: Any = None,
        verbose: bool = True,
        platforms: Sequence[str] | None = None,
    ) -> None:
        """Writes the model for serving, as `keras.Model.export`: a TF SavedModel or ONNX.

        The exported function is the model's inference: BatchNorm's moving statistics, no
        Dropout, the precision policy's compute dtype, float32 outputs (what `predict`
        returns), any batch size. Its weights are stored once, as variables (SavedModel)
        or initializers (ONNX). It needs neither jax nor phalanx to serve.

        - `format="tf_saved_model"` (Keras's default): a SavedModel folder with a `serve`
          endpoint (`loaded.serve(x)`, inputs as `predict` takes them) and a
          `serving_default` signature for TF Serving (inputs by name, outputs `output_0`...,
          as Keras names them). Written through jax2tf, lowered for every platform in
          `platforms`. Needs TensorFlow at export time.
        - `format="onnx"`: one `.onnx` file (weights over 2 GiB in `<file>.data` beside
          it) that ONNX Runtime runs, opset 18. Translated from the jaxpr by phalanx: an
          operation it does not cover is named in the error. Needs `onnx` and
          `onnxruntime` at export time.

        The artifact is run once by its runtime and compared with the model before it is
        moved into place; an existing one at `filepath` is replaced.

        Args:
          filepath: the SavedModel folder, or the `.onnx` file.
          format: `"tf_saved_model"` or `"onnx"`.
          input_signature: the inputs, where fit / evaluate / predict has not shown them
            (and the model is not a functional Keras model): a `phalanx.data.TensorSpec`,
            or a tuple, list or dict of them as `predict` takes the inputs; each shape
            starts with the batch dimension (None: any size).
          verbose: print where the artifact went and its inputs.
          platforms: the SavedModel's platforms (default `("cpu", "cuda", "tpu")`).

        Raises:
          ValueError: an unknown format, or no known input signature, or one the model
            does not take.
          ImportError: TensorFlow (or onnx / onnxruntime) missing, or a TensorFlow too old
            for the serialization this jax writes; the message names the versions and the
            install command (`pip install 'phalanx[export]'`).
          RuntimeError: the artifact computes other numbers than the model (nothing is
            written).

        Example:
          >>> model.export("served/mnist")                         # TF Serving
          >>> model.export("mnist.onnx", format="onnx",
          ...              input_signature=phalanx.data.TensorSpec((None, 784), "float32"))
        """
        export(
            self,
            filepath,
            format,
            input_signature=input_signature,
            verbose=verbose,
            platforms=platforms,
        )
