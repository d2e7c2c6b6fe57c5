"""Checkpoints that verify themselves, and folders that keep what phalanx did not write.

Every error test asserts the exception's class, that its message names the offending file,
folder or value, and that every checkpoint already present is byte-identical afterwards.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import phalanx
from phalanx._src.train.checkpoint import files as files_module
from phalanx._src.train.checkpoint import lock as lock_module
from phalanx._src.train.checkpoint.backup import MADE_HERE
from phalanx._src.train.checkpoint.checkpointer import TrainCheckpointer
from phalanx._src.train.checkpoint.files import RECORD, Files
from phalanx._src.train.checkpoint.lock import LOCK
from phalanx._src.train.checkpoint.record import CheckpointError, encode


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(6, 8, rngs=rngs)
        self.l2 = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def _model(seed: int = 0):
    with phalanx.Strategy(devices=jax.devices()[:1]).scope():
        model = phalanx.Model(MLP(nnx.Rngs(seed)))
        model.compile(
            optax.adam(1e-2),
            loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return model


def _data(n: int = 32):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    return x, np.abs(x[:, :3]).argmax(1).astype(np.int32)


def _fit(model, callbacks, epochs=2, **kwargs):
    x, y = _data()
    return model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, callbacks=callbacks, **kwargs)


def _hashes(folder: Path) -> dict[str, str]:
    """Every file under `folder`, by path, with the SHA-256 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _host(model):
    return jax.device_get(model.engine.state)


def _same(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(x, y)
        for x, y in zip(la, lb, strict=True)
    )


def _saved(folder: Path):
    """A trained model, and its state saved as checkpoint 1 in `folder`."""
    model = _model(0)
    _fit(model, [], epochs=1)
    ckpt = TrainCheckpointer(folder, asynchronous=False)
    ckpt.save(1, model.engine, {"epoch": 0})
    ckpt.close()
    return model


def _restore_into_fresh(folder: Path, step: int | None = 1):
    """Restores into a model with other weights; asserts it is untouched when that fails."""
    model = _model(5)
    before = _host(model)
    ckpt = TrainCheckpointer(folder)
    try:
        return ckpt.restore(model.engine, step), model
    except Exception:
        assert _same(_host(model), before), "a failed restore assigned something"
        raise
    finally:
        ckpt.close()


def _rewrite_record(folder: Path, edit) -> None:
    """Edits checkpoint 1's record with `edit(arrays, meta)` and writes it back with a valid
    checksum: a deliberate edit, which the record's checksum alone cannot catch."""
    path = folder / "1" / RECORD
    doc = json.loads(path.read_text())
    edit(doc["arrays"], doc["meta"])
    path.write_bytes(encode(doc["arrays"], doc["meta"]))


# ---- the reader: every byte checked -----------------------------------------------------


def test_a_saved_checkpoint_records_checksums_and_restores_exactly(tmp_path):
    model = _saved(tmp_path / "ck")
    doc = json.loads((tmp_path / "ck" / "1" / RECORD).read_text())
    assert doc["format"] == 2 and isinstance(doc["crc32"], int)
    assert all(isinstance(e["crc32"], int) for e in doc["arrays"].values())
    record, fresh = _restore_into_fresh(tmp_path / "ck")
    assert record == {"epoch": 0}
    assert _same(_host(fresh), _host(model))


def test_an_array_name_with_a_path_is_refused_and_nothing_outside_is_read(tmp_path):
    folder = tmp_path / "ck"
    _saved(folder)
    # The bytes a traversal would read sit outside the checkpoint, checksum and all.
    (tmp_path / "x.bin").write_bytes((folder / "1" / "p0.bin").read_bytes())
    _rewrite_record(folder, lambda arrays, meta: arrays.update({"../../x": arrays.pop("p0")}))
    before = _hashes(tmp_path)
    with pytest.raises(CheckpointError, match=r"names an array '\.\./\.\./x'.*no path separators"):
        _restore_into_fresh(folder)
    assert _hashes(tmp_path) == before
    with pytest.raises(CheckpointError, match=r"cannot save an array named 'a/b'"):
        Files(tmp_path / "other").write(1, {"a/b": np.zeros(2)}, {})
    assert not (tmp_path / "other" / "1").exists()


def _float_vector(folder: Path) -> str:
    """The name of checkpoint 1's packed float32 vector."""
    doc = json.loads((folder / "1" / RECORD).read_text())
    return next(n for n, e in doc["arrays"].items() if e["dtype"] == "float32")


def _entry_to_int32(arrays, meta, vector):
    arrays[vector]["dtype"] = "int32"  # the same size: only the checks can tell


def _layout_to_int32(arrays, meta, vector):
    meta["layout"]["dtypes"] = ["int32" if d == "float32" else d for d in meta["layout"]["dtypes"]]


def _both_to_int32(arrays, meta, vector):
    _entry_to_int32(arrays, meta, vector)
    _layout_to_int32(arrays, meta, vector)


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (_entry_to_int32, r"array '{vector}' is stored as int32\[\d+\].*want float32"),
        (_layout_to_int32, r"differ in dtype .*int32 vs float32"),
        (_both_to_int32, r"differ in dtype .*int32 vs float32"),
    ],
    ids=["array_entry", "layout", "both"],
)
def test_a_record_whose_dtype_was_changed_is_refused_before_anything_is_assigned(
    tmp_path, edit, named
):
    folder = tmp_path / "ck"
    _saved(folder)
    vector = _float_vector(folder)
    _rewrite_record(folder, lambda arrays, meta: edit(arrays, meta, vector))
    before = _hashes(folder)
    with pytest.raises(CheckpointError, match=named.format(vector=vector)) as info:
        _restore_into_fresh(folder)
    assert str(folder / "1" / RECORD) in str(info.value)
    assert _hashes(folder) == before


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-8]), r"holds \d+ bytes, but its record says"),
        (lambda p: p.write_bytes(p.read_bytes()[:3]), r"holds 3 bytes"),
        (lambda p: p.write_bytes(bytes([p.read_bytes()[0] ^ 4]) + p.read_bytes()[1:]),
         r"does not match its checksum"),
        (lambda p: p.unlink(), r"cannot read checkpoint array"),
    ],
    ids=["truncated", "cut_short", "flipped", "missing"],
)  # fmt: skip
def test_a_damaged_array_file_is_named(tmp_path, damage, named):
    folder = tmp_path / "ck"
    _saved(folder)
    path = folder / "1" / f"{_float_vector(folder)}.bin"
    damage(path)
    before = _hashes(folder)
    with pytest.raises(CheckpointError, match=named) as info:
        _restore_into_fresh(folder)
    assert str(path) in str(info.value)
    assert _hashes(folder) == before


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (b'{"format": 2, "arrays": {', r"is not valid JSON"),
        (b"", r"is not valid JSON"),
        (b'{"arrays": {}, "meta": {}}', r"older phalanx \(without checksums\)"),
    ],
    ids=["cut_short", "empty", "no_checksum"],
)
def test_a_bad_record_is_named(tmp_path, text, named):
    folder = tmp_path / "ck"
    _saved(folder)
    (folder / "1" / RECORD).write_bytes(text)
    before = _hashes(folder)
    with pytest.raises(CheckpointError, match=named) as info:
        _restore_into_fresh(folder)
    assert str(folder / "1" / RECORD) in str(info.value)
    assert _hashes(folder) == before


def test_a_record_edited_by_hand_fails_its_checksum(tmp_path):
    folder = tmp_path / "ck"
    _saved(folder)
    path = folder / "1" / RECORD
    path.write_text(path.read_text().replace('"epoch":0', '"epoch":7'))
    with pytest.raises(CheckpointError, match="does not match its checksum") as info:
        _restore_into_fresh(folder)
    assert str(path) in str(info.value)


# ---- the writer: never half-written, a full disk named ----------------------------------


def _failing_write(fails, error: OSError):
    """`files._write` that raises `error` for the paths `fails` picks."""
    real = files_module._write

    def write(path, data):
        if fails(path):
            raise error
        real(path, data)

    return write


_FULL = OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize(
    "fails",
    [lambda p: p.suffix == ".bin", lambda p: p.name.startswith("l") or p.name.startswith("p1"),
     lambda p: p.name == RECORD],
    ids=["first_array", "a_later_array", "record"],
)  # fmt: skip
def test_a_full_disk_leaves_the_previous_checkpoint_and_names_the_folder(
    tmp_path, monkeypatch, fails
):
    folder = tmp_path / "ck"
    model = _saved(folder)
    before = _hashes(folder)
    monkeypatch.setattr(files_module, "_write", _failing_write(fails, _FULL))
    ckpt = TrainCheckpointer(folder)
    try:
        ckpt.save(2, model.engine, {"epoch": 1})  # returns; the write fails in the background
        with pytest.raises(OSError, match="could not write checkpoint 2 into") as info:
            ckpt.wait_until_finished()
        ckpt.save(1, model.engine, {"epoch": 9})  # replacing 1 fails as well
        with pytest.raises(OSError, match="could not write checkpoint 1 into"):
            ckpt.wait_until_finished()
    finally:
        ckpt.close()
    assert info.value.errno == errno.ENOSPC and str(folder) in str(info.value)
    assert "No space left on device" in str(info.value)
    assert _hashes(folder) == before  # no step 2, no temporary folder, 1 untouched
    assert sorted(p.name for p in folder.iterdir()) == ["1"]
    monkeypatch.undo()
    assert _restore_into_fresh(folder)[0] == {"epoch": 0}


def test_a_full_disk_during_fit_raises_the_named_error_and_releases_the_folder(
    tmp_path, monkeypatch
):
    folder = tmp_path / "ck"
    model = _model(0)
    _fit(model, [phalanx.callbacks.ModelCheckpoint(folder, monitor="loss")], epochs=1)
    before = _hashes(folder)
    monkeypatch.setattr(files_module, "_write", _failing_write(lambda p: True, _FULL))
    with pytest.raises(
        OSError, match=f"could not write checkpoint 1 into {re.escape(str(folder))}"
    ) as info:
        _fit(model, [phalanx.callbacks.ModelCheckpoint(folder, monitor="loss")], epochs=3)
    assert info.value.errno == errno.ENOSPC
    assert _hashes(folder) == before  # checkpoint 1 as it was, and no lock left behind


# ---- one job, one callback per folder ----------------------------------------------------


def _lock_of(folder: Path, host: str, pid: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    holder = {"host": host, "pid": pid, "since": "2026-01-01 00:00:00 UTC"}
    (folder / LOCK).write_text(json.dumps(holder))


def test_a_second_job_is_refused_with_the_holder_named_until_it_dies(tmp_path):
    folder = tmp_path / "ck"
    _fit(_model(0), [phalanx.callbacks.ModelCheckpoint(folder, monitor="loss")], epochs=1)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _lock_of(folder, socket.gethostname(), other.pid)
        before = _hashes(folder)
        model = _model(0)
        for callback in (
            phalanx.callbacks.ModelCheckpoint(folder, monitor="loss"),
            phalanx.callbacks.BackupAndRestore(folder),
        ):
            with pytest.raises(CheckpointError, match="another job saves checkpoints into") as e:
                _fit(model, [callback])
            assert f"pid {other.pid}" in str(e.value) and socket.gethostname() in str(e.value)
            assert str(folder) in str(e.value)
            assert _hashes(folder) == before and model.train_step_count == 0
    finally:
        other.kill()
        other.wait()
    # Its process is gone: the lock is taken over, and released when fit ends.
    _fit(model, [phalanx.callbacks.ModelCheckpoint(folder, monitor="loss")])
    assert not (folder / LOCK).exists() and model.train_step_count == 8


def test_a_lock_from_another_host_is_refused_and_says_how_to_clear_it(tmp_path):
    folder = tmp_path / "ck"
    _lock_of(folder, "some-other-host", 4242)
    before = _hashes(folder)
    ckpt = TrainCheckpointer(folder)
    with pytest.raises(
        CheckpointError, match=rf"host some-other-host, pid 4242.*delete {re.escape(str(folder))}"
    ):
        ckpt.claim()
    ckpt.close()
    assert _hashes(folder) == before


def test_the_lock_names_this_process_while_held_and_goes_on_close(tmp_path):
    folder = tmp_path / "ck"
    ckpt = TrainCheckpointer(folder)
    ckpt.claim()
    holder = json.loads((folder / LOCK).read_text())
    assert (holder["host"], holder["pid"]) == (socket.gethostname(), os.getpid())
    reader = TrainCheckpointer(folder)  # reading needs no lock
    assert reader.latest_step() is None
    reader.close()
    ckpt.close()
    assert not (folder / LOCK).exists()


@pytest.mark.parametrize(
    "pair",
    [("ModelCheckpoint", "BackupAndRestore"), ("BackupAndRestore", "ModelCheckpoint"),
     ("ModelCheckpoint", "ModelCheckpoint"), ("BackupAndRestore", "BackupAndRestore")],
    ids=["mc_br", "br_mc", "mc_mc", "br_br"],
)  # fmt: skip
def test_two_checkpoint_callbacks_on_one_folder_are_refused_when_fit_starts(tmp_path, pair):
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "notes.txt").write_text("the user's")
    before = _hashes(folder)
    model = _model(0)
    made = {
        "ModelCheckpoint": lambda: phalanx.callbacks.ModelCheckpoint(folder, monitor="loss"),
        "BackupAndRestore": lambda: phalanx.callbacks.BackupAndRestore(str(folder) + "/"),
    }
    named = f"{pair[0]} and {pair[1]} both save into {os.path.realpath(folder)}"
    with pytest.raises(CheckpointError, match=re.escape(named)):
        _fit(model, [made[name]() for name in pair])
    assert _hashes(folder) == before and model.train_step_count == 0
    _fit(model, [made[pair[0]]()])  # one of them alone is fine, right after


def test_a_backup_folder_holding_other_checkpoints_is_refused(tmp_path):
    folder = tmp_path / "runs"
    _fit(_model(0), [phalanx.callbacks.ModelCheckpoint(folder, monitor="loss")])
    before = _hashes(folder)
    model = _model(0)
    named = f"{folder} holds checkpoints [1, 2] that are not backups"
    with pytest.raises(CheckpointError, match=re.escape(named)):
        _fit(model, [phalanx.callbacks.BackupAndRestore(folder)])
    assert _hashes(folder) == before and model.train_step_count == 0


# ---- nothing deleted that phalanx did not write ----------------------------------------


def test_backup_deletes_only_its_own_files(tmp_path):
    runs = tmp_path / "runs"
    (runs / "7").mkdir(parents=True)  # a numbered folder that is not a checkpoint
    (runs / "7" / "notes.txt").write_text("keep me")
    (runs / "tb").mkdir()
    (runs / "tb" / "events").write_bytes(b"\x00\x01")
    (runs / "config.json").write_text("{}")
    _fit(_model(0), [phalanx.callbacks.ModelCheckpoint(runs / "ckpt", monitor="loss")])
    before = _hashes(runs)
    _fit(_model(0), [phalanx.callbacks.BackupAndRestore(runs)], epochs=3)
    assert _hashes(runs) == before
    assert sorted(p.name for p in runs.iterdir()) == ["7", "ckpt", "config.json", "tb"]


def test_model_checkpoint_max_to_keep_deletes_only_checkpoints(tmp_path):
    folder = tmp_path / "ck"
    (folder / "5").mkdir(parents=True)
    (folder / "5" / "mine.txt").write_text("not a checkpoint")
    callback = phalanx.callbacks.ModelCheckpoint(folder, monitor="loss", max_to_keep=1)
    _fit(_model(0), [callback], epochs=3)
    assert (folder / "5" / "mine.txt").read_text() == "not a checkpoint"
    assert Files(folder).steps() == [3]


def test_a_numbered_folder_that_is_not_a_checkpoint_is_never_replaced(tmp_path):
    folder = tmp_path / "ck"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "mine.txt").write_text("not a checkpoint")
    before = _hashes(folder)
    with pytest.raises(CheckpointError, match=re.escape(f"{folder / '1'} exists and is not a")):
        _fit(_model(0), [phalanx.callbacks.ModelCheckpoint(folder, monitor="loss")], epochs=3)
    assert _hashes(folder) == before


@pytest.mark.parametrize("existed", [False, True], ids=["made_by_backup", "already_there"])
def test_backup_removes_its_folder_only_if_it_made_it_and_it_is_empty(tmp_path, existed):
    folder = tmp_path / "backup"
    if existed:
        folder.mkdir()
    backup = phalanx.callbacks.BackupAndRestore(folder)
    _fit(_model(0), [backup])
    assert folder.exists() == existed
    if existed:
        assert list(folder.iterdir()) == []


def test_backup_keeps_the_folder_it_made_when_something_else_is_written_there(tmp_path):
    folder = tmp_path / "backup"

    class Note(phalanx.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            (folder / "note.txt").write_text(str(epoch))

    _fit(_model(0), [phalanx.callbacks.BackupAndRestore(folder), Note()])
    assert sorted(p.name for p in folder.iterdir()) == ["note.txt"]


# ---- BackupAndRestore falls back to the previous good backup ----------------------------


class _Epochs(phalanx.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_begin(self, epoch, logs=None):
        self.seen.append(epoch)


def _two_backups(folder: Path) -> None:
    """Backups kept from a 3-epoch fit: 2 (end of epoch 1) and 3 (end of epoch 2)."""
    backup = phalanx.callbacks.BackupAndRestore(folder, delete_checkpoint=False)
    _fit(_model(0), [backup], epochs=3)
    assert Files(folder).steps() == [2, 3]
    assert (folder / MADE_HERE).is_file()  # it made the folder: said so, for later


def test_a_damaged_backup_falls_back_to_the_one_before_with_one_warning(tmp_path):
    folder = tmp_path / "backup"
    _two_backups(folder)
    damaged = next((folder / "3").glob("p*.bin"))
    damaged.write_bytes(damaged.read_bytes()[:-4])
    epochs = _Epochs()
    with pytest.warns(UserWarning) as warned:
        _fit(_model(3), [phalanx.callbacks.BackupAndRestore(folder), epochs], epochs=5)
    (warning,) = [w for w in warned if "BackupAndRestore" in str(w.message)]
    message = str(warning.message)
    assert "\n" not in message and str(damaged) in message and "step 2" in message
    assert epochs.seen == [2, 3, 4]  # backup 2 was taken at the end of epoch 1
    assert not folder.exists()  # it made the folder: gone with the backup


def test_backups_that_are_all_damaged_raise_and_stay_as_they_were(tmp_path):
    folder = tmp_path / "backup"
    _two_backups(folder)
    for step in ("2", "3"):
        (folder / step / RECORD).write_text("{")
    before = _hashes(folder)
    model = _model(3)
    named = f"no backup in {folder} can be restored"
    with pytest.raises(CheckpointError, match=re.escape(named)) as info:
        _fit(model, [phalanx.callbacks.BackupAndRestore(folder)], epochs=5)
    assert str(folder / "3" / RECORD) in str(info.value) and "delete the folder" in str(info.value)
    assert _hashes(folder) == before and model.train_step_count == 0


# ---- paths that are not writable folders, refused before a step -------------------------


@pytest.mark.parametrize("kind", ["ModelCheckpoint", "BackupAndRestore"])
def test_a_path_that_is_a_file_is_refused_when_fit_starts(tmp_path, kind):
    path = tmp_path / "weights.ckpt"
    path.write_bytes(b"the user's file")
    model = _model(0)
    callback = getattr(phalanx.callbacks, kind)(path)
    with pytest.raises(CheckpointError, match=re.escape(f"'{path}' is a file, not a folder")):
        _fit(model, [callback])
    assert path.read_bytes() == b"the user's file" and model.train_step_count == 0


def test_a_path_under_a_file_is_refused_when_fit_starts(tmp_path):
    (tmp_path / "file").write_text("x")
    model = _model(0)
    named = f"cannot create the checkpoint folder {tmp_path / 'file' / 'ck'}"
    with pytest.raises(NotADirectoryError, match=re.escape(named)):
        _fit(model, [phalanx.callbacks.ModelCheckpoint(tmp_path / "file" / "ck")])
    assert model.train_step_count == 0


def _refuse_writes(monkeypatch):
    def refuse(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(lock_module, "_open_exclusive", refuse)


@pytest.mark.parametrize("kind", ["ModelCheckpoint", "BackupAndRestore"])
def test_a_folder_that_cannot_be_written_is_refused_when_fit_starts(tmp_path, monkeypatch, kind):
    folder = tmp_path / "ck"
    _saved(folder)
    before = _hashes(folder)
    if os.geteuid() == 0:  # root writes anywhere: the file system's refusal, simulated
        _refuse_writes(monkeypatch)
    else:
        folder.chmod(0o555)
    model = _model(0)
    try:
        named = f"cannot write into the checkpoint folder {folder}"
        with pytest.raises(PermissionError, match=re.escape(named)):
            _fit(model, [getattr(phalanx.callbacks, kind)(folder)])
    finally:
        folder.chmod(0o755)
    assert _hashes(folder) == before and model.train_step_count == 0


def test_loading_from_a_missing_folder_creates_nothing(tmp_path):
    model = _model(0)
    with pytest.raises(FileNotFoundError, match=re.escape(f"no checkpoint in {tmp_path / 'typo'}")):
        model.load_checkpoint(tmp_path / "typo")
    assert not (tmp_path / "typo").exists()


# ---- fuzz: damaged or edited checkpoints never load silently ----------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A saved checkpoint's files (bytes by name), the saved state, and a model to restore
    into (other weights), its state kept to put back after an exact load."""
    folder = tmp_path_factory.mktemp("pristine")
    saved = _host(_saved(folder))
    files = {p.name: p.read_bytes() for p in (folder / "1").iterdir()}
    target = _model(5)
    return files, saved, target, _host(target)


def _record_positions(doc, prefix=()):
    """Every scalar's position in the record's arrays and layout (what an edit may hit)."""
    if isinstance(doc, dict):
        items = doc.items()
    elif isinstance(doc, list):
        items = enumerate(doc)
    else:
        return [prefix]
    return [pos for key, value in items for pos in _record_positions(value, (*prefix, key))]


def _set(doc, position, value):
    for key in position[:-1]:
        doc = doc[key]
    doc[position[-1]] = value


_VALUES = st.one_of(
    st.integers(-3, 2**33),
    st.sampled_from(["float32", "int32", "uint32", "float16", "bfloat16", "f4", "O", "p0", "l1"]),
    st.text(max_size=6),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
)
_NAMES = st.one_of(st.sampled_from(["../../x", "p0", "p1", "l0", "a/b", "..", ""]), st.text())


@st.composite
def _mutations(draw, names):
    kinds = ["none", "truncate", "flip", "append", "delete", "edit", "rename"]
    kind = draw(st.sampled_from(kinds))  # "none": the load path itself stays exact
    name = draw(st.sampled_from(names))
    if kind in ("edit", "rename"):
        return kind, draw(st.randoms(use_true_random=False)), draw(_VALUES), draw(_NAMES)
    return kind, name, draw(st.floats(0, 1, exclude_max=True)), draw(st.integers(1, 255))


def _mutate(folder: Path, files: dict[str, bytes], mutation) -> None:
    kind = mutation[0]
    if kind in ("edit", "rename"):  # the checksum made valid again: only the meaning changed
        _, rng, value, new_name = mutation
        doc = json.loads(files[RECORD])
        body = {"arrays": doc["arrays"], "meta": doc["meta"]}
        if kind == "rename":
            old = rng.choice(sorted(body["arrays"]))
            body["arrays"][new_name] = body["arrays"].pop(old)
        else:
            positions = _record_positions(
                {"arrays": body["arrays"], "layout": body["meta"]["layout"]}
            )
            position = rng.choice(positions)
            target = body if position[0] == "arrays" else body["meta"]
            _set(target, position, value)
        (folder / RECORD).write_bytes(encode(body["arrays"], body["meta"]))
        return
    _, name, where, mask = mutation
    path, data = folder / name, files[name]
    at = int(where * len(data)) if data else 0
    if kind == "truncate":
        path.write_bytes(data[:at])
    elif kind == "flip" and data:
        path.write_bytes(data[:at] + bytes([data[at] ^ mask]) + data[at + 1 :])
    elif kind == "append":
        path.write_bytes(data + bytes([mask]))
    elif kind == "delete":
        path.unlink()  # "none" leaves the files as they are


@settings(
    max_examples=150,
    deadline=None,
    database=None,  # hermetic: no example database written into the checkout
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_damaged_or_edited_checkpoints_never_load_silently(pristine, data):
    files, saved, target, original = pristine
    mutation = data.draw(_mutations(sorted(files)))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ck"
        (folder / "1").mkdir(parents=True)
        for name, content in files.items():
            (folder / "1" / name).write_bytes(content)
        _mutate(folder / "1", files, mutation)
        changed = {
            name: (folder / "1" / name).read_bytes() if (folder / "1" / name).exists() else None
            for name in files
        } != files
        ckpt = TrainCheckpointer(folder)
        try:
            ckpt.restore(target.engine, 1)
        except CheckpointError as error:
            event(f"{mutation[0]}: refused")
            assert str(folder / "1") in str(error), str(error)
            assert _same(_host(target), original), "a failed restore assigned something"
            return
        finally:
            ckpt.close()
    # It loaded: only ever exactly the saved values (an edit that changed nothing in
    # meaning, e.g. "f4" for "float32"); then the target gets its own state back.
    event(f"{mutation[0]}: loaded the saved values (changed={changed})")
    assert _same(_host(target), saved), f"{mutation[0]} loaded other values (changed={changed})"
    target.engine.state = jax.tree.map(
        lambda host, leaf: jax.device_put(host, leaf.sharding), original, target.engine.state
    )
