"""A real HTTP server on 127.0.0.1 for the steps' network clients to talk to."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    # Send fewer body bytes than Content-Length announces, then hang up.
    truncate_to: int | None = None


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def form(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(self.body.decode()).items()}


Responder = Reply | Callable[[Seen], Reply]


class Loopback:
    """Routes (method, path) to a list of replies given in turn; the last one repeats."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], list[Responder]] = {}
        self.requests: list[Seen] = []
        self.lock = threading.Lock()
        self.url = ""

    def add(self, method: str, path: str, *replies: Responder) -> None:
        self.routes[(method.upper(), path)] = list(replies)

    def file(self, path: str, body: bytes, **headers: str) -> str:
        """Serve ``body`` for GET and HEAD at ``path``; return its URL."""
        self.add("GET", path, Reply(body=body, headers=dict(headers)))
        self.add("HEAD", path, Reply(body=body, headers=dict(headers)))
        return self.url + path

    def seen(self, method: str, path: str) -> list[Seen]:
        with self.lock:
            return [r for r in self.requests if r.method == method and r.path == path]

    def respond(self, seen: Seen) -> Reply:
        with self.lock:
            self.requests.append(seen)
            replies = self.routes.get((seen.method, seen.path))
            if not replies:
                return Reply(status=404, body=b"not found")
            responder = replies.pop(0) if len(replies) > 1 else replies[0]
        return responder(seen) if callable(responder) else responder


def _handler(loopback: Loopback) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            seen = Seen(self.command, self.path, dict(self.headers.items()), body)
            reply = loopback.respond(seen)
            if reply.delay:
                time.sleep(reply.delay)
            self.send_response(reply.status)
            headers = {"Content-Length": str(len(reply.body)), **reply.headers}
            for name, value in headers.items():
                self.send_header(name, value)
            if reply.truncate_to is not None:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if self.command != "HEAD":
                end = reply.truncate_to if reply.truncate_to is not None else len(reply.body)
                self.wfile.write(reply.body[:end])

        do_GET = do_POST = do_HEAD = do_PUT = _serve

    return Handler


@pytest.fixture
def http_server() -> Iterator[Loopback]:
    loopback = Loopback()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(loopback))
    server.daemon_threads = True
    loopback.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield loopback
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)
