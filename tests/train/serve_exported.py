"""Serves exported models as a serving stack does: TensorFlow or ONNX Runtime alone.

jax, jaxlib, flax, optax and phalanx are made unimportable before anything else is
imported (TensorFlow would import jax where it is installed, for its own converters): an
artifact that needed any of them fails here. For each job `(format, artifact, inputs.npz,
out.npz)` it feeds the arrays of `inputs.npz` (keys `<batch size>/<input name>`), batch size by
batch size, and saves the outputs as `<batch size>/<output name>` (a SavedModel's `serve`
endpoint's first output as `<batch size>/serve`).

    python tests/train/serve_exported.py JOBS.json
"""

from __future__ import annotations

import importlib.abc
import json
import sys

BLOCKED = ("jax", "jaxlib", "flax", "optax", "phalanx", "orbax")


class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not importable here: the artifact must serve without it")
        return None


def _saved_model(artifact: str, feeds: dict) -> dict:
    import tensorflow as tf

    loaded = tf.saved_model.load(artifact)
    serving = loaded.signatures["serving_default"]
    out = {}
    for batch, inputs in feeds.items():
        results = serving(**{k: tf.constant(v) for k, v in inputs.items()})
        served = loaded.serve(next(iter(inputs.values())) if len(inputs) == 1 else inputs)
        out.update({f"{batch}/{k}": v.numpy() for k, v in results.items()})
        out[f"{batch}/serve"] = tf.nest.flatten(served)[0].numpy()
    return out


def _onnx(artifact: str, feeds: dict) -> dict:
    import onnxruntime

    session = onnxruntime.InferenceSession(artifact, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    out = {}
    for batch, inputs in feeds.items():
        for name, value in zip(names, session.run(names, inputs), strict=True):
            out[f"{batch}/{name}"] = value
    return out


def main(jobs_file: str) -> None:
    sys.meta_path.insert(0, _Blocked())
    import numpy as np

    with open(jobs_file) as file:
        jobs = json.load(file)
    for fmt, artifact, inputs_file, out_file in jobs:
        arrays = dict(np.load(inputs_file))
        feeds: dict = {}
        for key, value in arrays.items():  # "<batch>/<input name>"
            batch, name = key.split("/", 1)
            feeds.setdefault(batch, {})[name] = value
        serve = _saved_model if fmt == "tf_saved_model" else _onnx
        np.savez(out_file, **serve(artifact, feeds))
    print("served", len(jobs), "blocked:", [m for m in sys.modules if m.split(".")[0] in BLOCKED])


if __name__ == "__main__":
    main(sys.argv[1])
