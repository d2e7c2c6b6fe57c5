"""The converters `export` needs, imported on demand, with their versions checked.

TensorFlow runs a jax2tf SavedModel through its `XlaCallModule` op, which reads the
serialized module up to a calling-convention version (`call_module_maximum_supported_
version`); jax writes versions from `jax.export.minimum_supported_calling_convention_
version` up. A TensorFlow older than that window cannot run what this jax writes, and the
usual symptom is a serialization-version traceback at serving time; here it is an error
naming both versions before anything is written. Within the window the newest version
both support is written.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import jax

EXTRA = "pip install 'phalanx[export]'"
MIN_ONNX = (1, 16)  # ModelProto with opset 17 (LayerNormalization-era operators)


class ExportDependencyError(ImportError):
    """A converter `export` needs is missing, or its version cannot work with this jax."""


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def tensorflow() -> Any:
    """TensorFlow, or ExportDependencyError saying how to install it."""
    try:
        return importlib.import_module("tensorflow")
    except ImportError as error:
        raise ExportDependencyError(
            f"format='tf_saved_model' needs TensorFlow at export time (serving needs only "
            f"TensorFlow or TF Serving), and it is not installed ({error}); {EXTRA}, or "
            "export with format='onnx'"
        ) from None


def calling_convention(tf: Any) -> int:
    """The XlaCallModule version to write: the newest both jax and TensorFlow support."""
    from tensorflow.compiler.tf2xla.python import xla as tfxla

    tf_max = int(tfxla.call_module_maximum_supported_version())
    low = jax.export.minimum_supported_calling_convention_version
    high = jax.export.maximum_supported_calling_convention_version
    if tf_max < low:
        raise ExportDependencyError(
            f"TensorFlow {tf.__version__} runs XlaCallModule versions up to {tf_max}, but jax "
            f"{jax.__version__} writes versions {low} to {high}: a SavedModel written now "
            "would not load in it. Install a newer TensorFlow (pip install -U "
            "tensorflow-cpu), or an older jax"
        )
    return min(high, tf_max, jax.config.jax_export_calling_convention_version)


@contextlib.contextmanager
def convention(version: int) -> Iterator[None]:
    """jax writes calling-convention `version` within the block."""
    before = jax.config.jax_export_calling_convention_version
    jax.config.update("jax_export_calling_convention_version", version)
    try:
        yield
    finally:
        jax.config.update("jax_export_calling_convention_version", before)


def onnx() -> Any:
    """The `onnx` package, or ExportDependencyError naming the version needed."""
    try:
        module = importlib.import_module("onnx")
    except ImportError as error:
        raise ExportDependencyError(
            f"format='onnx' needs the onnx package at export time (serving needs only ONNX "
            f"Runtime), and it is not installed ({error}); {EXTRA}"
        ) from None
    if _version(module.__version__) < MIN_ONNX:
        raise ExportDependencyError(
            f"format='onnx' needs onnx >= {'.'.join(map(str, MIN_ONNX))}, found "
            f"{module.__version__}; pip install -U onnx"
        )
    return module


def onnxruntime() -> Any:
    """ONNX Runtime, which checks the ONNX file before it is moved into place."""
    try:
        return importlib.import_module("onnxruntime")
    except ImportError as error:
        raise ExportDependencyError(
            f"format='onnx' runs the file once in ONNX Runtime before keeping it, and "
            f"onnxruntime is not installed ({error}); {EXTRA}"
        ) from None
