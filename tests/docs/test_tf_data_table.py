"""docs/migration.md's tf.data table: every `tf.data.Dataset` name has a row, and every
phalanx name in it exists on `phalanx.data.Dataset` (a row without one says why)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from phalanx.data import Dataset

DOC = Path(__file__).resolve().parents[2] / "docs" / "migration.md"
TABLE = re.search(r"<!-- tf-data-table -->\n(.*?)<!-- /tf-data-table -->", DOC.read_text(), re.S)


def _rows() -> list[list[str]]:
    lines = [line for line in TABLE.group(1).splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def test_every_phalanx_name_exists_and_every_missing_one_says_why():
    assert TABLE is not None, "docs/migration.md lost its <!-- tf-data-table --> markers"
    for tf_name, ours, note in _rows():
        if ours.startswith("none"):
            assert note, f"{tf_name} has no phalanx counterpart and no reason"
        else:
            assert hasattr(Dataset, ours.strip("`")), ours


def test_the_table_lists_every_tf_data_dataset_name():
    tf = pytest.importorskip("tensorflow", reason="the table is checked against tf.data's names")
    wanted = {n for n in dir(tf.data.Dataset) if not n.startswith("_")}
    listed = {tf_name.strip("`") for tf_name, _, _ in _rows()}
    assert wanted - listed == set()
    assert listed - wanted == set()
