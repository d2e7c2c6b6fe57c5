"""Dataset.snapshot: computed on the first complete pass, read on later passes and runs,
invalidated by a change to the pipeline, never served half-written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import cloudpickle
import numpy as np
import pytest

from phalanx.data import Dataset, Options

REPO = Path(__file__).resolve().parents[2]
NO_COMPUTE = "PHALANX_TEST_SNAPSHOT_NO_COMPUTE"


def allowed():
    # Reads the environment at call time, so the fingerprint stays the same when a test
    # forbids computing (the environment is no global of the mapped functions).
    if os.environ.get(NO_COMPUTE):
        raise AssertionError("computed, although the snapshot is complete")


def expensive(x):
    allowed()
    return {"x": np.full(2, x, np.float32), "n": np.arange(x % 3)}  # "n" is ragged


def dense(x):
    allowed()
    return np.full(2, x, np.float32)


def pipeline(root, seed: int = 1) -> Dataset:
    return Dataset.range(11).shuffle(11, seed=seed).map(expensive).snapshot(root)


def values(ds) -> list:
    return [(e["x"].tolist(), e["n"].tolist()) for e in ds]


def published(root) -> list[str]:
    return sorted(p.name for p in Path(root).iterdir() if not p.name.endswith(".partial"))


def test_later_passes_and_runs_read_the_snapshot(tmp_path, monkeypatch):
    ds = pipeline(tmp_path)
    first = values(ds)
    assert len(published(tmp_path)) == 1
    monkeypatch.setenv(NO_COMPUTE, "1")
    assert values(ds) == first  # a later pass: the same elements, read
    assert values(pipeline(tmp_path)) == first  # a pipeline built again (a later run)
    shuffled = [b["x"][:, 0].tolist() for b in pipeline(tmp_path).shuffle(11, seed=9).batch(4)]
    assert sorted(v for b in shuffled for v in b) == sorted(v[0][0] for v in first)
    assert pipeline(tmp_path).cardinality == 11


def test_a_partial_pass_never_serves(tmp_path, monkeypatch):
    ds = pipeline(tmp_path)
    it = iter(ds)
    part = [next(it) for _ in range(4)]
    it.close()
    assert published(tmp_path) == []
    monkeypatch.setenv(NO_COMPUTE, "1")
    with pytest.raises(AssertionError, match="computed, although"):
        values(pipeline(tmp_path))
    monkeypatch.delenv(NO_COMPUTE)
    whole = values(pipeline(tmp_path))  # completes it: the 4 written are not written again
    assert [(e["x"].tolist(), e["n"].tolist()) for e in part] == whole[:4]
    assert len(published(tmp_path)) == 1
    monkeypatch.setenv(NO_COMPUTE, "1")
    assert values(ds) == whole


def test_a_changed_pipeline_gets_its_own_snapshot(tmp_path):
    values(pipeline(tmp_path))
    values(pipeline(tmp_path, seed=2))  # another shuffle seed
    values(Dataset.range(11).shuffle(11, seed=1).map(lambda x: {"x": x, "n": x}).snapshot(tmp_path))
    options = Options()
    options.autotune.enabled = False
    values(pipeline(tmp_path).with_options(options))  # options after the snapshot: the same
    values(
        Dataset.range(11)
        .shuffle(11, seed=1)
        .with_options(options)
        .map(expensive)
        .snapshot(tmp_path)
    )
    assert len(published(tmp_path)) == 4
    # How elements are computed is not what they are: threads keep the snapshot.
    threaded = Dataset.range(11).shuffle(11, seed=1).map(expensive, num_parallel_calls=3)
    values(threaded.snapshot(tmp_path))
    assert len(published(tmp_path)) == 4


SCALE = 2


def helper(x):
    return x * SCALE


def scaled(x):
    return np.float32(helper(x))


def test_the_fingerprint_follows_globals_and_helpers(tmp_path, monkeypatch):
    def run():
        return [float(v) for v in Dataset.range(5).map(scaled).snapshot(tmp_path)]

    assert run() == run() == [0, 2, 4, 6, 8]
    assert len(published(tmp_path)) == 1
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 3)  # a global the helper reads
    assert run() == [0, 3, 6, 9, 12]
    monkeypatch.setattr(sys.modules[__name__], "helper", lambda x: x + 1)  # the helper itself
    assert run() == [1, 2, 3, 4, 5]
    assert len(published(tmp_path)) == 3


def test_threads_above_a_snapshot_write_it_once(tmp_path, monkeypatch):
    ds = Dataset.range(11).map(dense).snapshot(tmp_path).batch(3)
    ds = ds.map(lambda x: x.sum(), num_parallel_calls=3)
    first = [float(v) for v in ds]
    assert len(published(tmp_path)) == 1
    monkeypatch.setenv(NO_COMPUTE, "1")
    assert [float(v) for v in ds] == first


def test_a_streaming_snapshot_resumes_across_its_publication(tmp_path, monkeypatch):
    def build():
        kept = Dataset.range(20).filter(lambda x: x % 3 != 0).map(expensive)
        return kept.snapshot(tmp_path, compression="GZIP").padded_batch(3)

    ds = build()
    it = iter(ds)
    next(it)
    writing_state = it.get_state()
    rest = [b["x"].tolist() for b in it]
    assert len(published(tmp_path)) == 1 and build().cardinality < 0  # it streams
    monkeypatch.setenv(NO_COMPUTE, "1")
    again = iter(build())
    again.set_state(writing_state)  # a state saved while writing, restored while reading
    assert [b["x"].tolist() for b in again] == rest
    reading = iter(build())
    next(reading)
    reading_state = reading.get_state()
    monkeypatch.delenv(NO_COMPUTE)
    for p in Path(tmp_path).iterdir():  # the snapshot is gone: the state replays
        if p.is_dir():
            for f in p.iterdir():
                f.unlink()
            p.rmdir()
    restored = iter(build())
    restored.set_state(reading_state)
    assert [b["x"].tolist() for b in restored] == rest


def test_worker_processes_warn_that_they_do_not_write(tmp_path):
    ds = pipeline(tmp_path).batch(2)
    with pytest.warns(RuntimeWarning, match="worker processes"):
        cloudpickle.dumps(ds)
    values(pipeline(tmp_path))
    complete = pipeline(tmp_path).batch(2)
    next(iter(complete))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cloudpickle.dumps(complete)  # complete: workers read it, nothing to warn about


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="infinite"):
        Dataset.range(3).repeat().snapshot(tmp_path)
    with pytest.raises(ValueError, match="compression must be"):
        Dataset.range(3).snapshot(tmp_path, compression="SNAPPY")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="needs a directory"):
        Dataset.range(3).snapshot(tmp_path / "file")


_KILLED_PASS = """
import json, os, sys
import numpy as np
from phalanx.data import Dataset
from phalanx._src.data.saved import snapshot

snapshot.CHECKPOINT_SECONDS = 0.0  # checkpoint after every element
calls = []

def crop(x):
    if x == 12 and os.environ.get("KILL_AT_12"):
        os.kill(os.getpid(), 9)
    calls.append(int(x))
    return np.full((2, 2), x, np.uint8)

ds = Dataset.range(20).map(crop).snapshot(sys.argv[1]).batch(5)
it = iter(ds)
if len(sys.argv) > 2:  # a training loop restored from its checkpoint
    it.set_state(json.loads(sys.argv[2]))
first = sum(int(b.sum()) for b in it)
second = sum(int(b.sum()) for b in ds)
print(first, second, len(calls))
"""


def test_a_killed_first_pass_is_continued_by_the_next_run(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(_KILLED_PASS))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "JAX_PLATFORMS": "cpu"}
    root = tmp_path / "snap"
    killed = subprocess.run(
        [sys.executable, str(script), str(root)], env={**env, "KILL_AT_12": "1"}
    )
    assert killed.returncode == -9
    assert published(root) == []
    # The next run resumes its loop at batch 2 (positions 10-19), as a checkpoint made
    # after batch 1 says: it computes only those, and the snapshot (0-9 kept from the
    # killed run) is complete at the end of that first epoch, so the second reads it.
    state = json.dumps({"epoch": 0, "step": 2, "seeds": []})
    done = subprocess.run(
        [sys.executable, str(script), str(root), state], env=env, capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    first, second, calls = (int(v) for v in done.stdout.split())
    assert (first, second, calls) == (4 * sum(range(10, 20)), 4 * sum(range(20)), 10)
    assert len(published(root)) == 1
