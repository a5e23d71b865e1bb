"""A headless Chromium for the tests of the HTML explorer (Playwright driving the system's /usr/bin/chromium).

Playwright's own browser download needs the internet; the Debian package ``chromium`` does not (CI installs it,
see .ci/run).  The flags keep Chromium off the network: no background services, no QUIC, no updates.
Without it the browser tests are skipped, and the session's last lines say so (``conftest.py``).
Usage in a test module: ``from browser import browser`` (a module-scoped fixture: one launch per module) and
:func:`open_page`, which refuses every request that is not ``file:`` or ``data:`` and records it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# the Debian package's path; CRATE_CHROMIUM names another (e.g. /usr/bin/chromium-browser)
CHROMIUM = Path(os.environ.get("CRATE_CHROMIUM", "/usr/bin/chromium"))
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser():
    """A Chromium browser context with a fresh profile, closed after the module's tests."""
    if not CHROMIUM.exists():
        pytest.skip(
            f"browser tests: {CHROMIUM} is absent; install the Debian package chromium (apt-get install -y chromium) "
            "or name your Chromium in CRATE_CHROMIUM"
        )
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="crate-chromium-")
    try:
        with sync_playwright() as pw:
            context = pw.chromium.launch_persistent_context(
                profile,
                executable_path=str(CHROMIUM),
                args=FLAGS,
                headless=True,
                viewport={"width": 1000, "height": 760},
            )
            try:
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def open_page(context, path: str | Path, ready: str = "#xp-explorer[data-ready='1']"):
    """Open ``path`` via file:// in a new page; returns ``(page, blocked, errors)``: the URLs of every request that
    left the file (aborted) and the page's JavaScript errors, both lists filled as the page runs."""
    page = context.new_page()
    blocked: list[str] = []
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))

    def route(r):
        if r.request.url.startswith(("file:", "data:")):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("request", lambda req: None if req.url.startswith(("file:", "data:")) else blocked.append(req.url))
    page.goto(Path(path).resolve().as_uri())
    page.wait_for_selector(ready, timeout=10_000)
    return page, blocked, errors
