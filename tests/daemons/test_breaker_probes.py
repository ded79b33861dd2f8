"""What a breaker's probe asks, and of whom: only the root of the server the held service
names, under the depositor policy for a depositor's or callback receiver's server.

The probe's URL is kept in the hold node (``/mrt-console/holds/services/...``), which any client
of the ensemble may write; and a depositor's root is the depositor's to answer as it likes. A
probe that followed a redirect, or asked whatever URL the node named, was a request into the
machine's own network that the depositor policy forbids (and its answer released the hold).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from queues.daemons.breakers import _answers, probe_url


class Counted(ThreadingHTTPServer):
    """A loopback server answering every GET with ``status`` (and ``location``), counting
    the requests it took."""

    def __init__(self, status: int, location: str = "") -> None:
        self.status, self.location, self.asked = status, location, 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.asked += 1
                self.send_response(outer.status)
                if outer.location:
                    self.send_header("Location", outer.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/"
        self.name = f"127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.fixture
def internal() -> Iterator[Counted]:
    server = Counted(200)
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def redirecting(internal: Counted) -> Iterator[Counted]:
    server = Counted(302, internal.url + "internal-admin")
    yield server
    server.shutdown()
    server.server_close()


def test_the_probe_is_the_root_of_the_server_the_service_names_and_nothing_else() -> None:
    name = "depositor example.org:443"
    assert probe_url(name, "https://example.org/") == "https://example.org/"
    assert probe_url(name, "https://example.org:443/") == "https://example.org:443/"
    assert probe_url(name, "https://example.org/admin") == ""  # not its root
    assert probe_url(name, "http://127.0.0.1:8080/") == ""  # another server
    assert probe_url(name, "https://example.org:8443/") == ""  # another port
    assert probe_url(name, "file:///etc/passwd") == ""
    assert probe_url("callback hooks.example.org:8443", "https://hooks.example.org:8443/") != ""
    assert probe_url(name, "") == ""


def test_a_depositors_redirect_is_its_answer_and_is_not_followed(
    redirecting: Counted, internal: Counted
) -> None:
    assert _answers(f"depositor {redirecting.name}", redirecting.url)
    assert redirecting.asked == 1
    assert internal.asked == 0  # the address it pointed to was never asked


def test_a_depositor_server_at_a_forbidden_address_is_not_asked(
    redirecting: Counted, settings: Any
) -> None:
    settings.MRT_FETCH_ALLOW = ""  # loopback is the machine's own network again
    assert not _answers(f"depositor {redirecting.name}", redirecting.url)
    assert redirecting.asked == 0
