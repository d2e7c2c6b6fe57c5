"""Child side of `run_multiprocess`: join the job, load the test file, call the body.

Usage (by the harness): python mp_body_runner.py TEST_FILE QUALNAME JSON_KWARGS
"""

from __future__ import annotations

import ast
import json
import os
import sys
import traceback
import types
from pathlib import Path


def _load(path: Path) -> types.ModuleType:
    """Import the test file as pytest would, with its assertion rewriting when available."""
    sys.path.insert(0, str(path.parent))  # like pytest's rootdir "prepend" import mode
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    try:
        from _pytest.assertion.rewrite import rewrite_asserts  # private, hence the fallback

        rewrite_asserts(tree, source.encode(), str(path), None)
    except Exception:
        tree = ast.parse(source, filename=str(path))
    module = types.ModuleType(f"mp_body_{path.stem}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    exec(compile(tree, str(path), "exec"), module.__dict__)
    return module


def main() -> None:
    path, qualname, kwargs = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    try:
        import phalanx.cluster

        topology = phalanx.cluster.resolve()
        print(f"[mp_body_runner] {topology.summary()}", flush=True)
        target: object = _load(path)
        for part in qualname.split("."):
            target = getattr(target, part)
        target(**kwargs)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip jax.distributed's exit barrier: it would wait for peers that may be stuck
        # waiting for us. The launcher sees the failure and kills them.
        os._exit(1)
    print(f"[mp_body_runner] {qualname} passed", flush=True)


if __name__ == "__main__":
    main()
