"""TFRecord files over 2 processes x 2 CPU devices: sharded by file (8 shards) and by record
(1 shard) under AUTO, and globally shuffled, through `experimental_distribute_dataset`;
every epoch's global batches hold every record once, and a run resumed mid-epoch continues
bitwise. Then `fit` over the shards: globally shuffled on 2 processes it equals 1 process;
sharded by file it trains."""

from __future__ import annotations

import glob
import os

import jax
import numpy as np
import pytest
from jax.experimental import multihost_utils
from multiprocess_harness import run_multiprocess

import phalanx
from phalanx.data import TFRecordDataset, TFRecordWriter

pytestmark = pytest.mark.multiprocess
RECORDS, GLOBAL_BATCH = 48, 8


def _global_batches(iterator, count=None) -> list[list[int]]:
    out = []
    for batch in iterator:
        out.append(multihost_utils.process_allgather(batch, tiled=True).tolist())
        if count is not None and len(out) == count:
            break
    return out


def _body(folders: list[str]) -> None:
    assert jax.process_count() == 2
    strategy = phalanx.Strategy()
    for folder, shuffled in [(f, False) for f in folders] + [(folders[0], True)]:
        files = sorted(glob.glob(os.path.join(folder, "*.tfrecord")))
        ds = TFRecordDataset(files, num_parallel_reads=2)
        if shuffled:  # a global shuffle: indexed files, each process reading its rows
            ds = ds.shuffle(RECORDS, seed=5)
        ds = ds.map(lambda r: np.int64(int(r))).batch(GLOBAL_BATCH)
        mine = [int(r) for b in ds.process_split() for r in b]
        both = multihost_utils.process_allgather(np.asarray(mine), tiled=True).tolist()
        assert len(mine) == RECORDS // 2
        assert sorted(both) == list(range(RECORDS)), folder  # disjoint and complete
        if not shuffled:
            # 8 files: this process's files only (record i is in file i // 6); 1 file:
            # blocks of GLOBAL_BATCH / 2 records, alternating between the processes.
            unit = RECORDS // len(files) if len(files) >= 2 else GLOBAL_BATCH // 2
            assert {r // unit % 2 for r in mine} == {jax.process_index()}

        # Each distribute call splits anew, with its own epochs: all three walk epoch 0.
        whole = _global_batches(iter(strategy.experimental_distribute_dataset(ds)))
        assert sorted(r for b in whole for r in b) == list(range(RECORDS))
        first = iter(strategy.experimental_distribute_dataset(ds))
        head = _global_batches(first, 2)
        state = first.get_state()
        resumed = iter(strategy.experimental_distribute_dataset(ds))
        resumed.set_state(state)
        assert head + _global_batches(resumed) == whole


def test_record_files_are_sharded_over_processes_and_resume(tmp_path):
    folders = []
    for shards in (8, 1):
        folder = tmp_path / f"shards-{shards}"
        folder.mkdir()
        per = RECORDS // shards
        for s in range(shards):
            with TFRecordWriter(folder / f"train-{s:02d}.tfrecord") as writer:
                for i in range(s * per, (s + 1) * per):
                    writer.write(str(i).encode())
        folders.append(str(folder))
    run_multiprocess(_body, cpu_devices=2, timeout=120, kwargs={"folders": folders})


# ---- fit over TFRecord shards: 2 processes equal 1 --------------------------------------------
FEATURES = {
    "x": phalanx.data.FixedLenFeature([6], np.float32),
    "y": phalanx.data.FixedLenFeature([], np.int64),
}


def _parse(record):
    example = phalanx.data.parse_single_example(record, FEATURES)
    return example["x"], example["y"].astype(np.int32)


def _fit_losses(strategy, folder: str, shuffle: bool) -> list[float]:
    from flax import nnx

    files = sorted(glob.glob(os.path.join(folder, "*.tfrecord")))
    ds = TFRecordDataset(files)
    if shuffle:  # indexed: global batches as on one process, each process reading its rows
        ds = ds.shuffle(48, seed=7)
    ds = ds.map(_parse).batch(GLOBAL_BATCH)
    with strategy.scope():
        model = phalanx.Model(nnx.Linear(6, 3, rngs=nnx.Rngs(0)))
        model.compile(
            optimizer="sgd", loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    return model.fit(ds, epochs=2, verbose=0).history["loss"]


def _fit_body(folder: str, reference: list[float]) -> None:
    np.testing.assert_allclose(
        _fit_losses(phalanx.Strategy(), folder, shuffle=True), reference, rtol=1e-4
    )
    by_file = _fit_losses(phalanx.Strategy(), folder, shuffle=False)  # each reads its 4 files
    assert len(by_file) == 2 and np.isfinite(by_file).all()


def test_fit_over_record_shards_on_two_processes_equals_one_process(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(RECORDS, 6)).astype(np.float32)
    y = np.abs(x[:, :3]).argmax(1)
    for s in range(8):
        with TFRecordWriter(tmp_path / f"train-{s:02d}.tfrecord") as writer:
            for i in range(s, RECORDS, 8):
                writer.write(phalanx.data.make_example({"x": x[i], "y": int(y[i])}))
    reference = _fit_losses(
        phalanx.Strategy(devices=jax.devices()[:4]), str(tmp_path), shuffle=True
    )
    assert reference[-1] < reference[0]
    run_multiprocess(
        _fit_body,
        cpu_devices=2,
        timeout=120,
        kwargs={"folder": str(tmp_path), "reference": reference},
    )
