"""The code blocks of docs/migration.md marked as tested run, and their asserts hold."""

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "migration.md"
MARK = "<!-- tested: tests/strategy/test_migration_docs.py -->"
BLOCKS = re.findall(re.escape(MARK) + r"\s*```python\n(.*?)```", DOC.read_text(), re.S)

pytestmark = pytest.mark.multidevice


def test_the_marked_blocks_are_found():
    assert len(BLOCKS) == 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_migration_example_runs(index):
    exec(compile(BLOCKS[index], f"{DOC}:block{index}", "exec"), {})  # our own doc's code
