"""The documentation site covers every public module (the build itself runs in dev.py test)."""

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _nav_files(nav):
    for item in nav:
        for value in item.values():
            yield from _nav_files(value) if isinstance(value, list) else [value]


def test_every_public_module_has_an_api_page_in_the_nav():
    public = {p.stem for p in (REPO / "src" / "phalanx").glob("*.py") if p.stem != "__init__"}
    public |= {p.name for p in (REPO / "src" / "phalanx").iterdir() if (p / "__init__.py").exists()}
    public.discard("_src")
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    pages = set(_nav_files(config["nav"]))
    assert {f"api/{name}.md" for name in public} <= pages
    for page in pages:
        assert (REPO / "docs" / page).is_file(), page
    for name in public:
        assert f"::: phalanx.{name}" in (REPO / "docs" / "api" / f"{name}.md").read_text()
    assert {"migration.md", "getting-started.md", "architecture.md"} <= pages
