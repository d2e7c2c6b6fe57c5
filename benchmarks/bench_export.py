"""Export time and artifact size: `Model.export` of the seeds' models (a script).

    python benchmarks/bench_export.py --model resnet50 --preset full --format tf_saved_model
    python benchmarks/bench_export.py --preset cpu          # both models, both formats, small

Models: `bench_models.py`'s ResNet-50 (25.6M parameters at the full preset) and decoder LM
(738M at the full preset), built as `fit` builds them (float32 policy), never trained: the
weights' values do not change what export does. Each export runs in its own process, so
that its peak memory (`ru_maxrss`) is its own.

Columns: parameters (count and float32 bytes), export seconds (everything `export` does:
trace, convert, write, run the artifact once in its runtime and compare it with the model on
a small batch, move it into place; the import of TensorFlow or ONNX included), artifact
bytes (every file), artifact / parameter bytes, the process's peak resident memory.

The LM exports with a symbolic sequence length (`TensorSpec((None, None), int32)`) so that
the artifact serves any prompt length, and its check runs on one token per row.

Results, 2-core shared CPU host (23 GiB), each under the exclusive lock, jax 0.10.2,
TensorFlow 2.21.0, onnx 1.23.2, onnxruntime 1.32.0, 2026-11-28. Times include importing
TensorFlow (~3 s) or ONNX, and running the artifact once in its runtime.

`python benchmarks/bench_export.py --preset full --model resnet50`, and
`... --preset full --model lm --format tf_saved_model` / `--format onnx` (one run each):

    model     format                params  export s  artifact MB  x params  peak GiB
    resnet50  tf_saved_model    25,610,152       5.4        103.4     1.010      1.61
    resnet50  onnx              25,610,152       1.1        102.5     1.001      1.14
    lm        tf_saved_model   738,248,704      20.9       2953.4     1.000      6.76
    lm        onnx             738,248,704      42.2       2953.1     1.000     11.67

Every artifact holds its weights once (1.000-1.010x the float32 parameter bytes, the rest is
the program): the issue's bound, 2x the parameter bytes plus 2 MiB, holds with room. The
LM's ONNX weights (2.95 GB, past protobuf's 2 GiB) are in `lm.onnx.data` beside the graph;
its peak memory is the weights four times over (the model's, the host copy, the ONNX
initializers, ONNX Runtime's session for the check). `--preset cpu` (0.5M parameters) exports
in 3-4 s (SavedModel) and 0.3 s (ONNX).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_models beside it


def _size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path) + (
            os.path.getsize(path + ".data") if os.path.exists(path + ".data") else 0
        )
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _measure(name: str, preset: str, fmt: str, folder: str) -> dict:
    import bench_models
    import jax
    import jax.numpy as jnp
    import numpy as np

    import phalanx

    cfg = bench_models.PRESETS[preset][name]
    build = bench_models._resnet if name == "resnet50" else bench_models._lm
    model = phalanx.Model(build(cfg, jnp.float32))
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    state = model.engine.abstract_state()  # shapes only: no host copy of 3 GB of weights
    variables = jax.tree.leaves((state["params"], state["rest"]))
    params = sum(int(np.prod(a.shape)) for a in variables if jnp.issubdtype(a.dtype, jnp.floating))
    if name == "resnet50":
        spec = phalanx.data.TensorSpec((None, cfg["image"], cfg["image"], 3), np.float32)
    else:
        spec = phalanx.data.TensorSpec((None, None), np.int32, name="tokens")
    path = os.path.join(folder, f"{name}{'.onnx' if fmt == 'onnx' else ''}")
    start = time.perf_counter()
    model.export(path, format=fmt, input_signature=spec, verbose=False)
    seconds = time.perf_counter() - start
    size = _size(path)
    return {
        "model": name,
        "format": fmt,
        "params": params,
        "param_bytes": 4 * params,
        "export_s": seconds,
        "artifact_bytes": size,
        "ratio": size / (4 * params),
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["resnet50", "lm", "both"], default="both")
    parser.add_argument("--preset", choices=["full", "cpu"], default="cpu")
    parser.add_argument("--format", choices=["tf_saved_model", "onnx", "both"], default="both")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, fmt, folder = args.child.split(",")
        print(json.dumps(_measure(name, args.preset, fmt, folder)))
        return
    models = ["resnet50", "lm"] if args.model == "both" else [args.model]
    formats = ["tf_saved_model", "onnx"] if args.format == "both" else [args.format]
    print(f"{'model':9} {'format':15} {'params':>12} {'export s':>9} {'artifact MB':>12} "
          f"{'x params':>9} {'peak GiB':>9}")  # fmt: skip
    for name in models:
        for fmt in formats:
            folder = tempfile.mkdtemp(prefix="phalanx-bench-export-")
            try:
                done = subprocess.run(
                    [sys.executable, __file__, "--preset", args.preset,
                     "--child", f"{name},{fmt},{folder}"],
                    capture_output=True, text=True,
                )  # fmt: skip
                if done.returncode:
                    print(f"{name:9} {fmt:15} failed: {done.stderr.strip().splitlines()[-1]}")
                    continue
                row = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"{name:9} {fmt:15} {row['params']:>12,} {row['export_s']:>9.1f} "
                      f"{row['artifact_bytes'] / 1e6:>12.1f} {row['ratio']:>9.3f} "
                      f"{row['peak_rss_gib']:>9.2f}")  # fmt: skip
            finally:
                shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
