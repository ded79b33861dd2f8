"""Where the browser tests find Chromium, how they start it, where they leave screenshots."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
# Headless as root, and nothing that would reach for the network this machine does not have.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "screenshots"
# The window most browser tests look through (and a phone's), and how long their pages wait for
# anything.
VIEWPORT = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
WAIT_MS = 15_000


def close_context(context: Any) -> None:
    """Close a browser context after leaving its pages: the console's live script keeps asking
    for /ws/live/ (404 under the tests' WSGI live server), and a request still in the server
    while the test database is flushed fails the flush with "database table is locked"."""
    for page in context.pages:
        page.goto("about:blank")
        page.wait_for_load_state("networkidle")
    context.close()


def shot(page: Any, name: str) -> None:
    """A screenshot of the whole of ``page``, as ``name``.png in :data:`SCREENSHOTS`."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def log_in(page: Any, url: str, name: str, password: str) -> None:
    """Log ``name`` in through the login form of the live server at ``url`` and wait for the
    overview it lands on."""
    page.goto(f"{url}/login/")
    page.fill("#id_username", name)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/")


@contextmanager
def logged_in(
    browser: Any, url: str, name: str, password: str, *, wait_ms: int = WAIT_MS, **context_args: Any
) -> Iterator[Any]:
    """A page of a new browser context with ``name`` logged in at ``url`` (on the overview),
    the context closed by :func:`close_context` on the way out. ``context_args`` go to
    ``browser.new_context`` (the viewport is :data:`VIEWPORT` unless they name one);
    ``page.context`` opens more pages in the same session."""
    context = browser.new_context(**{"viewport": VIEWPORT, **context_args})
    try:
        page = context.new_page()
        page.set_default_timeout(wait_ms)
        log_in(page, url, name, password)
        yield page
    finally:
        close_context(context)
