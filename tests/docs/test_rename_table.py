"""docs/migration.md's rename table: every name it gives a TF user exists.

The table maps each TF name of TensorFlow's five distribution tutorials to its phalanx (or
Keras 3, JAX, Flax) name, or says why there is none. A name that does not resolve (a
rename, a typo) fails here instead of in a user's program.
"""

import importlib
import os
import re
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")  # before keras's first import

import keras  # noqa: F401  (imported at collection: its import sets environment variables)
import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "migration.md"
TABLE = re.search(r"<!-- rename-table -->\n(.*?)<!-- /rename-table -->", DOC.read_text(), re.S)
ROOTS = ("phalanx", "keras", "jax", "flax")


def _rows():
    lines = [line for line in TABLE.group(1).splitlines() if line.startswith("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    return rows


def _names(cell):
    return [n for n in re.findall(r"`([A-Za-z_][\w.]*)`", cell) if n.split(".")[0] in ROOTS]


def _resolve(name):
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def test_the_table_is_found_and_complete():
    assert TABLE is not None, "docs/migration.md lost its <!-- rename-table --> markers"
    rows = _rows()
    assert len(rows) >= 40
    for tf_name, phalanx_name, note in rows:
        assert tf_name.startswith("`tf.") or "tf." in tf_name or "strategy." in tf_name, tf_name
        # A row names its counterpart, or says there is none and why.
        assert _names(phalanx_name) or (phalanx_name == "none" and note), (tf_name, phalanx_name)
    tf_names = " ".join(row[0] for row in rows)
    for wanted in ("tf.train.Checkpoint", "tf.keras.losses.Reduction", "HierarchicalCopyAllReduce"):
        assert wanted in tf_names


@pytest.mark.parametrize(
    "name", sorted({n for row in _rows() for cell in row[1:] for n in _names(cell)})
)
def test_every_listed_name_exists(name):
    assert _resolve(name) is not None


def test_a_missing_name_would_fail():
    with pytest.raises(AttributeError):
        _resolve("phalanx.train.NoSuchCheckpoint")
