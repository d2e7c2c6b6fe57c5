"""Griffe extension for the API reference (mkdocs.yml loads it; it never runs with phalanx).

It changes nothing in the code, only what the documentation site shows:

- Google-style `Example:` sections (`>>>` lines) become code examples, rendered as highlighted
  `pycon` blocks. Griffe only treats `Examples:` as such a section and renders `Example:` as an
  admonition of Markdown, where `>>>` reads as nested block quotes run into one paragraph.
- Names in signatures, annotations and bases point at their public path (`phalanx.Model`,
  `phalanx.callbacks.Callback`) rather than the private module that defines them
  (`phalanx._src...`); private helpers with no public path are shown by their bare name.
- A private base class with no public path (`DatasetOps`, `_ThresholdCounts`) is folded into
  the public classes built on it: its members (`__init__` included) are documented as theirs
  and its own bases take its place, as a reader of `phalanx.data.Dataset` expects.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import griffe

PACKAGE = "phalanx"
PRIVATE = f"{PACKAGE}._src."
# "Example:" alone on a line, indented as a section header: griffe's title syntax keeps the
# heading the reader sees ("Example:") while the section kind becomes "Examples".
_EXAMPLE_HEADER = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", re.MULTILINE)


def _objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    """Every object defined under `obj` (aliases are someone else's object: skipped)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)


def _public_modules(module: griffe.Module) -> Iterator[griffe.Module]:
    yield module
    for name, member in module.members.items():
        if not name.startswith("_") and not member.is_alias and member.is_module:
            yield from _public_modules(member)


def _final_path(modules: griffe.ModulesCollection, path: str) -> str | None:
    try:
        obj = modules.get_member(path)
        return obj.final_target.path if obj.is_alias else obj.path
    except Exception:  # unloaded (external) or unresolvable: not ours to rename
        return None


def _public_paths(package: griffe.Module) -> dict[str, str]:
    """Where each private object is exported: its defining path -> the public path.

    The first export found wins, the top level's first: `phalanx.Model`, not a re-export in
    a submodule.
    """
    modules = package.modules_collection
    public: dict[str, str] = {}
    for module in _public_modules(package):
        for name, member in module.members.items():
            if name.startswith("_") or not member.is_alias:
                continue
            target = _final_path(modules, member.target_path)
            if target and target.startswith(PRIVATE):
                public.setdefault(target, f"{module.path}.{name}")
    return public


def _private_class(
    modules: griffe.ModulesCollection, base: Any, public: dict[str, str]
) -> griffe.Class | None:
    """The class `base` names when it is private and exported nowhere, else None."""
    path = _final_path(modules, base if isinstance(base, str) else base.canonical_path)
    if path is None or not path.startswith(PRIVATE) or path in public:
        return None
    obj = modules.get_member(path)
    return obj if isinstance(obj, griffe.Class) else None


def _fold_private_bases(cls: griffe.Class, public: dict[str, str]) -> None:
    modules = cls.modules_collection
    bases: list[Any] = []
    for base in cls.bases:
        private = _private_class(modules, base, public)
        if private is None:
            bases.append(base)
            continue
        _fold_private_bases(private, public)
        for name, member in private.members.items():
            if name not in cls.members:
                cls.set_member(name, griffe.Alias(name, member, parent=cls))
        bases += private.bases
    cls.bases = bases


def _expressions(obj: griffe.Object) -> Iterator[Any]:
    values: list[Any] = []
    if isinstance(obj, griffe.Function):
        values.append(obj.returns)
        for parameter in obj.parameters:
            values += [parameter.annotation, parameter.default]
    if isinstance(obj, griffe.Attribute):
        values += [obj.annotation, obj.value]
    if isinstance(obj, griffe.Class):
        values += obj.bases
    if isinstance(obj, griffe.TypeAlias):
        values.append(obj.value)
    values += [decorator.value for decorator in getattr(obj, "decorators", ())]
    for value in values:
        if isinstance(value, griffe.Expr):
            yield from value.iterate(flat=True)


def _publish(name: griffe.ExprName, public: dict[str, str]) -> None:
    """Points `name` at its public path, or at nothing (a bare name) when it has none."""
    if isinstance(name.parent, (str, griffe.ExprName)) or name.parent is None:
        return  # already explicit (or an attribute chain, whose head is renamed on its own)
    canonical = name.canonical_path
    if not canonical.startswith(PRIVATE):
        return
    modules = name.parent.modules_collection
    target = _final_path(modules, canonical) or canonical
    path = public.get(target)
    if path is None:  # maybe a member of a public class: phalanx.Model.fit
        owner, _, rest = target.rpartition(".")
        path = public.get(owner) and f"{public[owner]}.{rest}"
    if path and path.rpartition(".")[2] == name.name:
        name.parent, name.member = path.rpartition(".")[0], None
    else:
        name.parent, name.member = None, None  # private helper: shown, not linked


class _PublicDocstring(griffe.Docstring):
    """A docstring whose parsed types (`Raises:`, `Returns:`...) name public paths too.

    Those types are parsed when a page renders them, not when the package loads.
    """

    public: dict[str, str]

    def parse(self, parser: Any = None, **options: Any) -> list[griffe.DocstringSection]:
        sections = super().parse(parser, **options)
        for section in sections:
            for item in section.value if isinstance(section.value, list) else ():
                for expr in (getattr(item, "annotation", None), getattr(item, "default", None)):
                    for name in expr.iterate(flat=True) if isinstance(expr, griffe.Expr) else ():
                        if isinstance(name, griffe.ExprName):
                            _publish(name, self.public)
        return sections


def _public_docstring(docstring: griffe.Docstring, public: dict[str, str]) -> griffe.Docstring:
    new = _PublicDocstring(
        "",
        lineno=docstring.lineno,
        endlineno=docstring.endlineno,
        parent=docstring.parent,
        parser=docstring.parser,
        parser_options=docstring.parser_options,
    )
    new.value = _EXAMPLE_HEADER.sub(r"\g<indent>Examples: Example:", docstring.value)
    new.public = public
    return new


class PhalanxDocs(griffe.Extension):
    """Loaded by mkdocstrings (mkdocs.yml: plugins.mkdocstrings...options.extensions)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path != PACKAGE:
            return
        public = _public_paths(pkg)
        objects = list(_objects(pkg))
        for obj in objects:
            if obj.docstring is not None:
                obj.docstring = _public_docstring(obj.docstring, public)
            if isinstance(obj, griffe.Class):
                _fold_private_bases(obj, public)
        for obj in objects:
            for name in list(_expressions(obj)):
                if isinstance(name, griffe.ExprName):
                    _publish(name, public)
