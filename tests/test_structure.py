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
TRAIN_ROOMS = (
    "model", "summary", "loops", "checkpoint", "feeding", "engine", "export", "adapters", "api"
)  # fmt: skip

# data/'s layers, highest first. The Dataset builder (`dataset`) imports its mixins, which
# import the plan's nodes, which import the base checks and options; never the other way
# (a Dataset is known below the builder by its `_node`, not by its class). Modules not
# listed (readers, adapters, prefetch, images) sit above `dataset` and may import any layer.
DATA_LAYERS = (
    ("dataset",),
    (
        "dataset_ops",
        "dataset_batches",
        "dataset_tf",
        "dataset_map",
        "dataset_sequence",
        "dataset_windows",
        "dataset_mix",
        "iterator",
    ),
    (
        "plan",
        "index_ops",
        "combine_ops",
        "element_ops",
        "stream",
        "stream_combine",
        "stream_nested",
        "stream_scan",
        "stream_checks",
        "stream_cache",
        "window_ops",
        "mix_ops",
        "executors",
        "workers",
        "packing",
    ),
    (
        "validation",
        "options",
        "autotune",
        "seeds",
        "files",
        "wait",
        "cache_files",
        "tree_state",
        "recycle",
    ),
)


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


def _without_faces() -> dict[str, set[str]]:
    """The import graph with packages' faces (`__init__`) left out as targets."""
    modules = _modules()
    return {
        name: {t for t in targets if modules[t].name != "__init__.py"}
        for name, targets in import_graph().items()
    }


def test_no_import_circle_runs_through_the_data_room():
    through_data = [c for c in circles(_without_faces()) if any("._src.data." in m for m in c)]
    assert through_data == []


def _data_layer(module: str) -> int | None:
    """The index in DATA_LAYERS of a phalanx._src.data module (None: not listed)."""
    parts = module.split(".")
    if parts[:3] != ["phalanx", "_src", "data"] or len(parts) != 4:
        return None
    return next((i for i, layer in enumerate(DATA_LAYERS) if parts[3] in layer), None)


def test_data_layers_import_only_down():
    upward = []
    for name, targets in import_graph().items():
        layer = _data_layer(name)
        if layer is None or layer == 0:  # not listed, or the builder: any layer below
            continue
        for target in targets:
            if not target.startswith("phalanx._src.data.") or target == "phalanx._src.data":
                continue
            other = _data_layer(target)
            # An unlisted data module (a reader, an adapter) sits above the builder.
            if other is None or other < layer:
                upward.append(f"{name} -> {target}")
    assert upward == []


def test_every_data_layer_module_exists():
    # A renamed module would silently leave the layer check.
    data = PACKAGE / "_src" / "data"
    missing = [m for layer in DATA_LAYERS for m in layer if not (data / f"{m}.py").exists()]
    assert missing == []


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
    # The circle finder, the data layers and the private-attribute pattern on known answers.
    assert _data_layer("phalanx._src.data.dataset") == 0
    assert _data_layer("phalanx._src.data.stream_nested") == 2
    assert _data_layer("phalanx._src.data.records.sharding") is None
    assert _data_layer("phalanx._src.train.loops.fit") is None
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert _PRIVATE.search("x = self.model._state")
    assert _PRIVATE.search('getattr(model, "_step_hooks", None)')
    assert not _PRIVATE.search("model.engine.state")


def test_strategy_room_imports_go_one_way():
    # `strategy.py` (the `Strategy` class) is the room's top: the modules it builds on
    # (run, reduce, distribution, replica context, state) know a strategy by the protocol
    # in `base.py`, never by importing it back, even for annotations.
    room = "phalanx._src.strategy."
    graph = {
        name: {t for t in targets if t.startswith(room)}
        for name, targets in _without_faces().items()
        if name.startswith(room)
    }
    assert len(graph) > 10, "the strategy room moved: update this check"
    assert circles(graph) == []
    top = room + "strategy"
    assert sorted(name for name, targets in graph.items() if top in targets) == []


# phalanx._src's layers (DESIGN.md), highest first: a module imports only its own layer and
# the layers above it. `image` (NumPy image ops) sits above `data`, whose `map` opens their
# random streams; `strategy` owns what may cross to the devices, which `data` checks.
LAYERS = (
    ("compilation_cache", "shutdown"),
    ("cluster",),
    ("strategy",),
    ("image",),
    ("data",),
    ("datasets", "report"),
    ("train",),
    ("tune",),
    ("launch",),
    ("cli",),
)


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["phalanx", "_src"] or len(parts) < 3:
        return None
    return next((i for i, layer in enumerate(LAYERS) if parts[2] in layer), None)


def test_layers_import_only_down():
    listed = {name for layer in LAYERS for name in layer}
    present = {p.stem for p in (PACKAGE / "_src").iterdir() if p.name != "__init__.py"}
    present.discard("__pycache__")
    assert present == listed, "a layer was added or removed: place it in LAYERS"
    upward = sorted(
        f"{name} -> {target}"
        for name, targets in import_graph().items()
        for target in targets
        if (mine := _layer(name)) is not None
        and (theirs := _layer(target)) is not None
        and theirs > mine
    )
    assert upward == []
