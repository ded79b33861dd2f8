"""Raw loopback servers that misbehave below HTTP: trickled headers, silence, refusal.

http.server cannot send half a status line, so these speak to the socket themselves.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

# A response whose header block alone is about 600 bytes: at one byte every GAP seconds it
# takes half a minute to arrive, longer than any limit the tests set and short enough that a
# client without a whole-response deadline gets it in the end (and the test then fails).
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nX-Slow: "
    + b"a" * 540
    + b"\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
)
GAP = 0.05


class HeaderTrickle:
    """Answers every request with :data:`RESPONSE`, one byte every ``gap`` seconds.

    Counts the connections it took, those whose client hung up before the response was out
    (``hung_up``) and those it sent in full (``finished``). With ``tls`` it speaks HTTPS, its
    URL naming ``localhost`` (the name of tests/steps/tls_servers.py's certificate).
    """

    def __init__(
        self, host: str = "127.0.0.1", gap: float = GAP, tls: ssl.SSLContext | None = None
    ) -> None:
        self.gap = gap
        self.tls = tls
        self.lock = threading.Lock()
        self.connections = 0
        self.hung_up = 0
        self.finished = 0
        self.stop = threading.Event()
        self.listener = socket.create_server((host, 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"https://localhost:{self.port}" if tls else f"http://{host}:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _peer = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(10)
        with ExitStack() as held:
            held.enter_context(raw)
            request = b""
            try:
                conn = raw
                if self.tls is not None:  # the TLS socket takes the plain one's descriptor over
                    conn = held.enter_context(self.tls.wrap_socket(raw, server_side=True))
                while b"\r\n\r\n" not in request:
                    data = conn.recv(4096)
                    if not data:
                        return
                    request += data
                for byte in RESPONSE:
                    if self.stop.wait(self.gap):
                        return
                    conn.sendall(bytes([byte]))
            except OSError:
                # A send to a peer that has gone fails within a byte or two.
                with self.lock:
                    self.hung_up += 1
                return
            with self.lock:
                self.finished += 1

    def counts(self) -> tuple[int, int, int]:
        with self.lock:
            return self.connections, self.hung_up, self.finished

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


class Silent:
    """Accepts connections and never says a word."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _peer = self.listener.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()


@contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port nothing listens on: bound (so no one else takes it), never listening.

    A connection to it is refused at once.
    """
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()
