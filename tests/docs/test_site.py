"""The built documentation site reads well: checked in the HTML, then in a headless browser.

- every docstring `Example:` section is a highlighted code block, not a run-on paragraph;
- every code block on every page is highlighted;
- no page shows a private path (`phalanx._src...`): headings, signatures, bases, tooltips;
- search works, and the architecture page is in the navigation.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
PRIVATE = "phalanx._src"


def _nav_pages(nav) -> list[str]:
    pages = []
    for item in nav:
        for value in item.values():
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def _url(page: str) -> str:
    """mkdocs' directory URL of a page: api/data.md -> api/data/, index.md -> ''."""
    return "" if page == "index.md" else page.removesuffix(".md") + "/"


PAGES = [
    _url(page) for page in _nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
]
API_PAGES = [url for url in PAGES if url.startswith("api/")]


# ---- the built HTML (no browser needed) ---------------------------------------------------


def test_the_built_site_names_no_private_module(site: Path):
    leaks = {}
    for path in [*site.rglob("*.html"), site / "search" / "search_index.json"]:
        found = sorted(set(re.findall(r"phalanx\._src[\w.]*", path.read_text())))
        if found:
            leaks[str(path.relative_to(site))] = found
    assert not leaks, f"private paths in the site: {leaks}"


def test_example_sections_are_highlighted_code_in_the_html(site: Path):
    examples = 0
    for url in API_PAGES:
        html = (site / url / "index.html").read_text()
        # The doctest prompt as Markdown (nested block quotes) means the section was not parsed.
        assert "<blockquote>" not in html, url
        assert not re.search(r"<p>\s*&gt;&gt;&gt;", html), url
        for section in re.split(r'<span class="doc-section-title">', html)[1:]:
            if section.startswith("Example"):
                examples += 1
                block = section[: section.find("</pre>")]
                assert '<div class="language-pycon highlight"><pre>' in block, (url, section[:300])
                assert '<span class="gp">&gt;&gt;&gt; </span>' in block, (url, section[:300])
    assert examples >= 50, f"only {examples} Example sections in the API pages"


# ---- in the browser ------------------------------------------------------------------------

# Visible text, link targets and tooltips of the rendered page (the search index is checked
# above).
_PAGE_TEXT = """() => [
    document.body.innerText,
    ...Array.from(document.querySelectorAll('[title]'), e => e.getAttribute('title')),
    ...Array.from(document.querySelectorAll('a[href]'), e => e.getAttribute('href')),
].join('\\n')"""

# Every code block: whether it is highlighted (Pygments wraps it in .highlight and splits it
# into token spans), or declared plain text (a diagram: ```text), and its first line, to name
# it in a failure.
_CODE_BLOCKS = """() => Array.from(document.querySelectorAll('pre > code'), code => ({
    highlighted: code.closest('.language-text') !== null || (code.closest('.highlight') !== null
        && code.querySelector('span[class]:not(.filename)') !== null),
    text: code.innerText.split('\\n')[0],
}))"""

# The block after each "Example:" section title of the API page, as the reader sees it.
_EXAMPLE_SECTIONS = """() => Array.from(document.querySelectorAll('.doc-section-title'))
    .filter(title => title.innerText.trim() === 'Example:')
    .map(title => {
        const block = title.closest('p').nextElementSibling;
        return {
            tag: block ? block.tagName : null,
            highlight: block !== null && block.classList.contains('highlight'),
            prompts: block ? block.querySelectorAll('pre code span.gp').length : 0,
            tokens: block ? block.querySelectorAll('pre code span[class]').length : 0,
            text: block ? block.innerText : '',
            visible: block !== null && block.getBoundingClientRect().height > 0,
        };
    })"""


# Material says "Initializing search" in the results' header until its index is ready.
_SEARCH_READY = """() => {
    const meta = document.querySelector('.md-search-result__meta');
    return meta !== null && meta.textContent.trim() !== ''
        && !/initializing/i.test(meta.textContent);
}"""


def _heading(page) -> str:
    return page.locator("h1").first.inner_text().removesuffix("¶").strip()


def test_every_page_loads_without_private_paths_or_plain_code(page, site_url):
    for url in PAGES:
        response = page.goto(site_url + url)
        assert response is not None and response.ok, url
        assert page.locator("h1").first.is_visible(), url
        text = page.evaluate(_PAGE_TEXT)
        assert PRIVATE not in text, (url, [line for line in text.splitlines() if PRIVATE in line])
        plain = [block["text"] for block in page.evaluate(_CODE_BLOCKS) if not block["highlighted"]]
        assert not plain, f"{url}: code blocks without highlighting: {plain}"


def test_api_example_sections_render_as_highlighted_code(page, site_url):
    page.goto(site_url + "api/phalanx/")
    sections = page.evaluate(_EXAMPLE_SECTIONS)
    assert len(sections) >= 10, sections
    for section in sections:
        assert section["tag"] == "DIV" and section["highlight"], section
        assert section["prompts"] >= 1 and section["tokens"] > section["prompts"], section
        assert section["visible"] and section["text"].startswith(">>> "), section
    # The one the issue quotes: a line per statement, its output on a line of its own.
    strategy = next(s["text"] for s in sections if "phalanx.Strategy()" in s["text"])
    lines = strategy.splitlines()
    assert lines[:3] == [
        ">>> strategy = phalanx.Strategy()",
        ">>> print(strategy.num_replicas_in_sync)",
        "8",
    ], lines


def test_architecture_page_is_in_the_navigation(page, site_url):
    page.goto(site_url)
    link = page.locator("nav.md-nav--primary a.md-nav__link", has_text="Architecture").first
    link.click()
    page.wait_for_url(f"{site_url}architecture/")
    assert _heading(page) == "Architecture"


def test_search_finds_an_api_object(page, site_url):
    page.goto(site_url)
    search = page.locator("input.md-search__input")
    search.click()
    # The index is built in a worker; a query typed before it is ready can be lost, so wait
    # for the worker first (slow on a busy machine).
    page.wait_for_function(_SEARCH_READY, timeout=60_000)
    search.press_sequentially("ModelCheckpoint")  # key events, as a reader types
    result = page.locator(".md-search-result__item a").first
    result.wait_for()
    assert "api/callbacks/" in result.get_attribute("href")
    result.click()
    page.wait_for_url(re.compile(re.escape(f"{site_url}api/callbacks/")))
    assert _heading(page) == "phalanx.callbacks"
