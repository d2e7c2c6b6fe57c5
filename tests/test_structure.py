"""The house's shape: small files, no import circles, imports that only go down, one owner.

These read the source, not the running code: every `import` statement counts, at module
level, inside functions, and under `TYPE_CHECKING` alike, since a reader follows them all.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "phalanx"
MAX_LINES = 450

# train/'s rooms, highest first: a module may import its own room and the rooms below it.
TRAIN_ROOMS = ("model", "summary", "loops", "checkpoint", "feeding", "engine", "adapters", "api")


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The phalanx modules `name` imports (`from pkg import module` counts as the module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith("phalanx"):
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    """`{module: the phalanx modules it imports}`, packages' faces (`__init__`) left out as
    targets when a deeper module is named."""
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_source_file_is_longer_than_the_limit():
    long = {
        str(path.relative_to(SRC)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"split these by concept (limit {MAX_LINES} lines): {long}"


def test_no_import_circle_runs_through_the_training_code():
    modules = _modules()
    graph = {
        name: {t for t in targets if modules[t].name != "__init__.py"}
        for name, targets in import_graph().items()
    }
    through_train = [c for c in circles(graph) if any(".train." in m for m in c)]
    assert through_train == []


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[:3] != ["phalanx", "_src", "train"] or len(parts) < 4:
        return None
    return parts[3]


def test_train_rooms_import_only_down():
    upward = []
    for name, targets in import_graph().items():
        room = _room(name)
        if room not in TRAIN_ROOMS:
            continue
        for target in targets:
            other = _room(target)
            if other in TRAIN_ROOMS and TRAIN_ROOMS.index(other) < TRAIN_ROOMS.index(room):
                upward.append(f"{name} -> {target}")
    assert upward == []


def test_every_train_room_says_what_lives_there():
    for room in TRAIN_ROOMS:
        init = PACKAGE / "_src" / "train" / room / "__init__.py"
        if not init.exists():
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "import" in doc and len(doc.split()) > 20, f"{init}: say what lives here"


# A model's private attributes, reached from outside `model.py` (`model._x`, `self.model._x`,
# or by name through getattr).
_PRIVATE = re.compile(r"\bmodel\._[a-z]\w*|getattr\(\s*(?:self\.)?model\s*,\s*['\"]_")


@pytest.mark.parametrize("root", ["src", "benchmarks", "examples"])
def test_only_model_py_touches_a_models_private_attributes(root):
    base = SRC.parent / root
    owner = PACKAGE / "_src" / "train" / "model.py"
    reaches = [
        f"{path.relative_to(SRC.parent)}:{number}: {line.strip()}"
        for path in base.rglob("*.py")
        if path != owner
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _PRIVATE.search(line)
    ]
    assert reaches == []


def test_the_checks_see_what_they_look_for(tmp_path):
    # The circle finder and the private-attribute pattern on known answers.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert _PRIVATE.search("x = self.model._state")
    assert _PRIVATE.search('getattr(model, "_step_hooks", None)')
    assert not _PRIVATE.search("model.engine.state")
