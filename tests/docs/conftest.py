"""Fixtures for the documentation tests: the built site, served locally, and a headless browser.

The site is built once per session (mkdocs --strict, into a temporary folder) and served on
127.0.0.1 at an ephemeral port; the browser is a system Chromium driven by Playwright, and it
may load nothing but that server. `python3 dev.py test` installs Chromium when it can (as
root, with apt-get) and passes it as PHALANX_BROWSER. Without one the browser tests skip,
unless CI is set or PHALANX_BROWSER names a browser that is not there: then they fail.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 180
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
# Every wait in the browser is bounded (milliseconds, Playwright's unit).
BROWSER_TIMEOUT_MS = 15_000


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site, built with --strict from this checkout (or the one `dev.py
    test` has just built that way, named by PHALANX_SITE_DIR: one build, not two)."""
    built = os.environ.get("PHALANX_SITE_DIR")
    if built and (Path(built) / "index.html").is_file():
        return Path(built)
    site_dir = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site_dir)]
    result = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
    )
    assert result.returncode == 0, f"mkdocs build failed:\n{result.stdout}\n{result.stderr}"
    return site_dir


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="session")
def site_url(site: Path) -> Iterator[str]:
    """The built site served over HTTP on 127.0.0.1 (search fetches its index: no file://)."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="docs-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def find_browser() -> str | None:
    """PHALANX_BROWSER if set, else a Chromium or Chrome on PATH."""
    if named := os.environ.get("PHALANX_BROWSER"):
        return shutil.which(named) or (named if Path(named).is_file() else None)
    return next(filter(None, map(shutil.which, BROWSERS)), None)


def _no_browser(reason: str) -> None:
    if os.environ.get("CI", "").lower() not in ("", "0", "false") or os.environ.get(
        "PHALANX_BROWSER"
    ):
        pytest.fail(f"{reason}; the docs must be checked in a browser here")
    pytest.skip(f"{reason}; `python3 dev.py test` installs Chromium when run as root")


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """A headless Chromium (Playwright drives the system's browser; it downloads none)."""
    executable = find_browser()
    if executable is None:
        _no_browser(f"no browser found (PHALANX_BROWSER, or one of {', '.join(BROWSERS)})")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _no_browser("playwright is not installed (it comes with the `docs` extra)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, timeout=BROWSER_TIMEOUT_MS
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser, site_url: str) -> Iterator[object]:
    """A fresh page that can reach the local site and nothing else."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(BROWSER_TIMEOUT_MS)

    def local_only(route) -> None:
        if route.request.url.startswith(site_url):
            route.continue_()
        else:
            route.abort()

    context.route("**/*", local_only)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield page
        assert not errors, f"JavaScript errors on the site: {errors}"
    finally:
        context.close()
