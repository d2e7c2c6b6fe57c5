"""The `checkpoint` state file TF writes beside its checkpoints, naming the newest.

`tf.train.CheckpointManager` and `Checkpoint.save` keep it as a text-format
`CheckpointState` proto:

    model_checkpoint_path: "ckpt-3"
    all_model_checkpoint_paths: "ckpt-2"
    all_model_checkpoint_paths: "ckpt-3"

Paths are relative to the folder (or absolute), C-escaped as text protos write strings.
"""

from __future__ import annotations

import os
import re

STATE_FILE = "checkpoint"
_FIELD = re.compile(r'^\s*(model_checkpoint_path|all_model_checkpoint_paths)\s*:\s*"(.*)"\s*$')


def _unescape(text: str) -> str:
    """A text-proto string's value (C escapes: \\n, \\", \\\\, octal bytes)."""
    raw = text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    return raw.encode("latin-1").decode("utf-8", "surrogateescape")


def is_tf_checkpoint(prefix: str | os.PathLike) -> bool:
    """Whether `prefix` names a TF checkpoint (its `.index` file exists)."""
    return os.path.isfile(os.fspath(prefix) + ".index")


def read_state(folder: str | os.PathLike) -> tuple[str | None, list[str]]:
    """(the newest checkpoint's prefix, all listed prefixes) from `folder`'s state file,
    as absolute paths; (None, []) without a state file."""
    path = os.path.join(os.fspath(folder), STATE_FILE)
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as file:
            lines = file.read().splitlines()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None, []
    latest, listed = None, []
    for line in lines:
        found = _FIELD.match(line)
        if found is None:
            continue
        prefix = os.path.join(os.fspath(folder), _unescape(found.group(2)))
        if found.group(1) == "model_checkpoint_path":
            latest = os.path.abspath(prefix)
        else:
            listed.append(os.path.abspath(prefix))
    return latest, listed


def tf_latest(folder: str | os.PathLike) -> str | None:
    """The prefix of the newest TF checkpoint in `folder` by its state file, as
    `tf.train.latest_checkpoint` finds it; None without one (or when its files are gone)."""
    latest, _ = read_state(folder)
    return latest if latest is not None and is_tf_checkpoint(latest) else None
