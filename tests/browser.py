"""Where the browser tests find Chromium, how they start it, where they leave screenshots."""

from pathlib import Path

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
