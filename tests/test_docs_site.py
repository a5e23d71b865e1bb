"""The documentation site as a reader's browser shows it: no request leaves the site (no web font, no CDN script),
names in tables never break mid-word and no code block is cut off (scrolls sideways) at 1280 px.

The static checks read mkdocs.yml and the site's stylesheets; the browser check builds a few pages with the
site's own theme, stylesheets and Markdown extensions (not the notebooks or the API pages, which take minutes) and
opens them in the headless Chromium of :mod:`browser` (skipped without it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from browser import browser, open_page  # noqa: F401  (browser: a fixture)

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = tuple(sorted(p.name for p in DOCS.glob("*.md")))  # every page but the notebooks and the API pages
# Code blocks that may scroll sideways at 1280 px: a table that a wrapped line would garble (page, first words)
WIDE = {("pretrained.md", "$")}  # `$ crate models --pretrained`: its table


def _config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def test_the_site_loads_no_web_font_and_no_remote_script_or_style() -> None:
    config = _config()
    assert config["theme"].get("font") is False  # else Material links Google Fonts on every page
    for asset in (*config.get("extra_css", []), *config.get("extra_javascript", [])):
        assert not re.match(r"\w+://|//", str(asset)), asset
        assert (DOCS / asset).is_file(), asset
    for css in DOCS.rglob("*.css"):
        assert not re.search(r"url\(\s*['\"]?(https?:)?//|@import\s+['\"]?(https?:)?//", css.read_text()), css
    jupyter = next(p["mkdocs-jupyter"] for p in config["plugins"] if isinstance(p, dict) and "mkdocs-jupyter" in p)
    assert not jupyter.get("include_requirejs") and not jupyter.get("custom_mathjax_url")  # no CDN script


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PAGES built with the site's theme, stylesheets and extensions."""
    root = tmp_path_factory.mktemp("site")
    docs = root / "docs"
    docs.mkdir()
    for page in PAGES:
        shutil.copy(DOCS / page, docs / page)
    for folder in ("images", "stylesheets"):
        shutil.copytree(DOCS / folder, docs / folder)
    config = _config()
    mini = {k: config[k] for k in ("site_name", "theme", "extra_css", "markdown_extensions")}
    mini.update(
        docs_dir=str(docs), site_dir=str(root / "site"), plugins=[], nav=list(PAGES)
    )  # no search: its worker cannot load from file:
    (root / "mkdocs.yml").write_text(yaml.safe_dump(mini))
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "-q", "-f", str(root / "mkdocs.yml")],
        capture_output=True,
        text=True,
        cwd=ROOT,  # pymdownx.snippets' base path
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "site"


def _open(browser, path: Path):  # noqa: F811
    page, blocked, errors = open_page(browser, path, ready="article")
    page.set_viewport_size({"width": 1280, "height": 900})
    page.wait_for_load_state("networkidle")
    return page, blocked, errors


def test_the_models_table_keeps_every_name_on_one_line(browser, site: Path) -> None:  # noqa: F811
    page, blocked, errors = _open(browser, site / "models" / "index.html")
    assert not blocked and not errors, (blocked, errors)
    lines = page.eval_on_selector_all(
        "article table td:first-child code",
        "els => els.map(e => [e.textContent, e.getClientRects().length])",
    )
    assert len(lines) >= 20 and any(name == "crate_mnist_p4" for name, _ in lines)
    broken = [name for name, rects in lines if rects != 1]
    assert not broken, f"names broken across lines at 1280 px: {broken}"
    page.close()


def test_the_speed_page_shows_its_figure_and_fetches_nothing_outside(browser, site: Path) -> None:  # noqa: F811
    page, blocked, errors = _open(browser, site / "speed" / "index.html")
    assert not blocked and not errors, (blocked, errors)
    first = page.eval_on_selector("article img", "e => [e.getAttribute('src'), e.naturalWidth]")
    assert first[0].endswith("images/speed.png") and first[1] > 0  # the figure comes first, and it loads
    page.close()


def test_no_code_block_is_cut_off_at_1280_px(browser, site: Path) -> None:  # noqa: F811
    """Every code block of every page shows its longest line whole at 1280 px (the page contents sit in the left
    sidebar, mkdocs.yml's ``toc.integrate``, which leaves the code column about 110 characters); output blocks
    wrap instead (extra.css).  Only the tables of :data:`WIDE` scroll."""
    cut, seen = [], 0
    for name in PAGES:
        stem = name[:-3]
        page, _, _ = _open(browser, site / ("index.html" if stem == "index" else f"{stem}/index.html"))
        blocks = page.eval_on_selector_all(
            "article pre > code", "els => els.map(e => [e.scrollWidth - e.clientWidth, e.textContent])"
        )
        page.close()
        seen += len(blocks)
        for overflow, text in blocks:
            words = text.split()[:1]
            if overflow > 1 and (name, words[0] if words else "") not in WIDE:
                cut.append(f"{name}: {max(text.splitlines(), key=len)[:60]}...")
    assert seen > 120, f"only {seen} code blocks rendered on {len(PAGES)} pages"
    assert not cut, f"{len(cut)} code blocks cut off at 1280 px: " + "; ".join(cut)
