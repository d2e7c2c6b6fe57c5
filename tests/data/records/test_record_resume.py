"""Iterator states over record files (and interleaves) that survive a move: a restore
continues with exactly the records the saved run would have given, or raises an error
naming what differs, whether the map runs inline, in threads or in worker processes."""

from __future__ import annotations

import json
import shutil

import pytest
from record_files_helpers import write_shards

from phalanx._src.data import executors
from phalanx.data import AUTOTUNE, Dataset, TFRecordDataset, TFRecordWriter

MODES = {
    "inline": {},
    "thread": {"num_parallel_calls": 2},
    "process": {"num_parallel_calls": 2, "workers": "process"},
}


def tag(record):
    """The record itself (module level: picklable for worker processes)."""
    return record


def pipeline(paths, reads, mode):
    return TFRecordDataset(paths, num_parallel_reads=reads).map(tag, **MODES[mode])


def saved_after(ds, count):
    """The first `count` elements of an epoch of `ds`, and the state after them (as a
    checkpoint would carry it: through JSON)."""
    it = iter(ds)
    head = [next(it) for _ in range(count)]
    state = json.loads(json.dumps(it.get_state()))
    it.close()
    return head, state


def restored(ds, state):
    it = iter(ds)
    it.set_state(state)
    return list(it)


@pytest.mark.parametrize("mode", MODES)
def test_another_width_given_as_a_number_is_an_error_naming_both(tmp_path, mode):
    # The case: 8 shards of 25, saved after 30 records reading 4 files at a time.
    paths, _ = write_shards(tmp_path, 8, 25)
    _, state = saved_after(pipeline(paths, 4, mode), 30)
    with pytest.raises(ValueError, match=r"num_parallel_reads 4 -> 2\).*num_parallel_reads=4"):
        restored(pipeline(paths, 2, mode), state)
    reference = list(pipeline(paths, 4, mode))
    assert restored(pipeline(paths, 4, mode), state) == reference[30:]


@pytest.mark.parametrize("mode", MODES)
def test_autotune_continues_exactly_on_a_host_with_other_cpus(tmp_path, monkeypatch, mode):
    paths, contents = write_shards(tmp_path, 8, 25)
    monkeypatch.setattr(executors, "cpu_count", lambda: 4)
    saved = pipeline(paths, AUTOTUNE, mode)
    reference = list(saved)
    head, state = saved_after(saved, 30)
    assert head == reference[:30] and state["order"][0]["num_parallel_reads"] == 4
    monkeypatch.setattr(executors, "cpu_count", lambda: 2)  # the host it resumes on
    moved = pipeline(paths, AUTOTUNE, mode)
    assert restored(moved, state) == reference[30:]
    # Later epochs keep the saved width, as they keep the saved shuffle seeds.
    assert list(moved) == reference
    assert sorted(reference) == sorted(r for c in contents for r in c)


def test_a_width_wider_than_the_file_list_is_the_same_order(tmp_path):
    # 16 or 10 files at a time over 8 files: both read all 8 in turn.
    paths, _ = write_shards(tmp_path, 8, 5)
    head, state = saved_after(pipeline(paths, 16, "thread"), 7)
    assert head + restored(pipeline(paths, 10, "thread"), state) == list(
        pipeline(paths, 8, "inline")
    )


def test_a_shuffle_resumes_at_any_width(tmp_path):
    # A shuffle numbers the records file after file: the width does not decide its order.
    paths, _ = write_shards(tmp_path, 4, 6)

    def shuffled(reads):
        return TFRecordDataset(paths, num_parallel_reads=reads).shuffle(24, seed=3).batch(5)

    reference = [b.tolist() for b in shuffled(4)]
    head, state = saved_after(shuffled(4), 2)
    assert [b.tolist() for b in head] + [b.tolist() for b in restored(shuffled(1), state)] == (
        reference
    )


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_other_files_are_an_error_naming_what_differs(tmp_path, mode):
    (tmp_path / "a").mkdir()
    paths, _ = write_shards(tmp_path / "a", 4, 6)
    reference = list(pipeline(paths, 2, mode))
    _, state = saved_after(pipeline(paths, 2, mode), 5)
    with pytest.raises(ValueError, match=r"the number of record files \(4 -> 3\)"):
        restored(pipeline(paths[:3], 2, mode), state)
    with pytest.raises(ValueError, match=r"the files' names or their order"):
        restored(pipeline(paths[::-1], 2, mode), state)
    # The same shards in another folder (a checkpoint resumed on another machine): exact.
    moved = shutil.copytree(tmp_path / "a", tmp_path / "b")
    moved_paths = [str(moved / p.rsplit("/", 1)[1]) for p in paths]
    assert restored(pipeline(moved_paths, 2, mode), state) == reference[5:]
    with TFRecordWriter(tmp_path / "extra") as writer:
        writer.write(b"one more record")
    with open(moved_paths[1], "ab") as f:  # one shard rewritten (here: a record added)
        f.write((tmp_path / "extra").read_bytes())
    with pytest.raises(ValueError, match=r"the files' sizes .*start the epoch afresh"):
        restored(pipeline(moved_paths, 2, mode), state)


def test_a_state_saved_before_the_order_was_recorded_is_refused(tmp_path):
    paths, _ = write_shards(tmp_path, 2, 3)
    _, state = saved_after(pipeline(paths, 2, "inline"), 2)
    del state["order"]
    with pytest.raises(ValueError, match=r"with keys .*'order'"):
        restored(pipeline(paths, 2, "inline"), state)


def shard_of(i):
    return Dataset.range(int(i) * 10, int(i) * 10 + 3 + int(i) % 2)


def test_an_interleave_left_to_autotune_continues_at_the_saved_cycle_length(monkeypatch):
    def build(cycle):
        return Dataset.range(6).interleave(shard_of, cycle_length=cycle)

    monkeypatch.setattr(executors, "cpu_count", lambda: 4)
    reference = list(build(None))
    head, state = saved_after(build(None), 7)
    monkeypatch.setattr(executors, "cpu_count", lambda: 2)
    assert head + restored(build(None), state) == reference
    with pytest.raises(ValueError, match=r"cycle_length 4 -> 3.*interleave\(f, cycle_length=4"):
        restored(build(3), state)
