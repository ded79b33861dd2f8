"""Where the browser tests find Chromium, how they start it, where they leave screenshots."""

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


def close_context(context: Any) -> None:
    """Close a browser context after leaving its pages: the console's live script keeps asking
    for /ws/live/ (404 under the tests' WSGI live server), and a request still in the server
    while the test database is flushed fails the flush with "database table is locked"."""
    for page in context.pages:
        page.goto("about:blank")
        page.wait_for_load_state("networkidle")
    context.close()


def log_in(page: Any, url: str, name: str, password: str) -> None:
    """Log ``name`` in through the login form of the live server at ``url`` and wait for the
    overview it lands on."""
    page.goto(f"{url}/login/")
    page.fill("#id_username", name)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/")
