"""benchmarks/bench_model_parallel.py: its memory tables hold what each layout promises.

From shapes only (nothing allocated): data-only holds the whole state on every device,
`model_parallel=M` divides every annotated kernel's bytes (and its Adam moments') by M,
FSDP on top never adds, and the configurations have the sizes the docs quote.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_model_parallel
    import mp_transformer

    return bench_model_parallel, mp_transformer


def _bytes(leaf, divisor: int = 1) -> int:
    value = leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf
    return value.size * np.dtype(value.dtype).itemsize // divisor


def _leaves(tree) -> list:
    return jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _split_over_model(leaf, rules: dict) -> bool:
    names = leaf.get_metadata().get("out_sharding") if isinstance(leaf, nnx.Variable) else None
    return any(rules.get(name) == "model" for name in names or ())


def _rows(bench, devices: int) -> dict[str, dict]:
    module, transformer = bench
    return {r["layout"]: r for r in module.memory_rows(transformer.CONFIGS["tiny"], devices)}


def test_data_only_holds_the_whole_state(bench):
    _, transformer = bench
    state = transformer.abstract_state(transformer.CONFIGS["tiny"])
    for devices in (8, 64):
        row = _rows(bench, devices)["data-only"]
        assert row["mesh"] == f"{devices} x 1"
        assert row["params"] == 4 * transformer.CONFIGS["tiny"].parameters
        assert row["optimizer"] == sum(_bytes(leaf) for leaf in _leaves(state["opt"]))


@pytest.mark.parametrize("m", [2, 4, 8])
def test_model_parallel_divides_the_annotated_kernels_by_m(bench, m):
    _, transformer = bench
    rules, config = dict(transformer.AXIS_RULES), transformer.CONFIGS["tiny"]
    state = transformer.abstract_state(config)
    params = _leaves(state["params"])
    # Every weight but the RMSNorm scales (two a block, one at the end) is split over model.
    assert sum(not _split_over_model(leaf, rules) for leaf in params) == 2 * config.layers + 1

    def expected(tree) -> int:
        return sum(_bytes(leaf, m if _split_over_model(leaf, rules) else 1) for leaf in tree)

    row = _rows(bench, 8)[f"mp {m}"]
    assert row["mesh"] == f"{8 // m} x {m}"
    assert row["params"] == expected(params)
    assert row["optimizer"] == expected(_leaves(state["opt"]))


def test_fsdp_on_top_of_model_parallelism_never_adds(bench):
    for devices in (8, 64):
        rows = _rows(bench, devices)
        for m in (2, 8):
            for part in ("params", "optimizer", "total"):
                assert rows[f"fsdp + mp {m}"][part] <= rows[f"mp {m}"][part]
    # With data replicas to shard over, FSDP cuts what model parallelism leaves.
    rows = _rows(bench, 8)
    assert rows["fsdp + mp 2"]["total"] < rows["mp 2"]["total"] / 2


def test_the_configurations_have_the_documented_sizes(bench):
    _, transformer = bench
    # Llama 3 8B's published count, and the 1B configuration the docs quote.
    assert transformer.CONFIGS["8b"].parameters == 8_030_261_248
    assert transformer.CONFIGS["1b"].parameters == 1_104_218_112
    state = transformer.abstract_state(transformer.CONFIGS["tiny"])
    counted = sum(leaf.size for leaf in jax.tree.leaves(state["params"]))
    assert counted == transformer.CONFIGS["tiny"].parameters


def test_the_quick_memory_run_prints_its_table():
    script = BENCHMARKS / "bench_model_parallel.py"
    done = subprocess.run(
        [sys.executable, str(script), "--quick", "--memory-only", "--devices", "8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| 8 | mp 8 | 1 x 8 |" in done.stdout
    assert "step time" not in done.stdout
