"""The loopback servers of a chaos run: the depositors' files (with the hostile routes and the
callback receiver), the address a depositor must never reach, the working folders as
``MRT_WORK_URL`` and a TCP proxy that can be made a black hole. The stand-ins of storage,
inventory and EZID, and ``Flapping``, which makes the services outside answer badly for a
spell, are ``queues.chaos.standins`` (the tests' too)."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler
from pathlib import Path
from typing import Any

from queues.chaos.flapping import (
    RESET,
    UNAVAILABLE,
    UNAVAILABLE_RETRY_AFTER,
    Flapping,
    answer_flapping,
    reset,
)
from queues.chaos.standins import QuietServer
from queues.steps.merritt_wire import local_name, parse_xml

VERSION_NS = "http://uc3.cdlib.org/ontology/mrt/store/version"
OBJECT_NS = "http://uc3.cdlib.org/ontology/mrt/store/object"
FILE_NS = "http://uc3.cdlib.org/ontology/mrt/store/file"


class Served:
    """A ThreadingHTTPServer on a loopback address, served from a daemon thread."""

    def __init__(
        self,
        handler: Callable[..., BaseHTTPRequestHandler],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.server = QuietServer((host, port), handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.1,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


class QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class DepositorRoutes(QuietFiles):
    """The good depositors' files, plus two slow servers: ``/trickle`` sends its body one byte a
    second and ``/slow-headers`` its response headers one byte a second, neither ever finishing
    (until ``stop`` is set at the end of the run); and the profile's callback receiver:
    ``POST /callback/mc/<jobID>`` (Merritt ingest's form) is counted per job, with the delivery
    keys (``Idempotency-Key``) it carried and the ``jobStatus`` each post told, and answered 200.

    With ``flapping`` set, the good files (the batch manifests and their files) and the callback
    receiver flap with it; the hostile routes do not (their depositors must fail for their own
    reasons, not ours)."""

    stop = threading.Event()
    callbacks: Counter[str] = Counter()
    keys: dict[str, set[str]] = {}  # job ID -> the delivery keys its posts carried ("" none)
    told: dict[str, list[str]] = {}  # job ID -> the jobStatus of each post received
    counting = threading.Lock()
    flapping: Flapping | None = None

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        prefix = "/callback/mc/"
        if not self.path.startswith(prefix):
            self.send_error(404)
            return
        jid = self.path[len(prefix) :]

        def receive() -> tuple[int, bytes, str]:
            with self.counting:
                self.callbacks[jid] += 1
                self.keys.setdefault(jid, set()).add(self.headers.get("Idempotency-Key", ""))
                self.told.setdefault(jid, []).append(_job_status(body))
            return 200, b"", "text/plain"

        answer_flapping(self, self.flapping, "callback", receive, (b"unavailable", "text/plain"))

    def _good(self) -> bool:
        return not self.path.startswith(("/trickle", "/slow-headers", "/hostile"))

    def do_GET(self) -> None:
        if self.path.startswith("/trickle"):
            self._trickle_body()
        elif self.path.startswith("/slow-headers"):
            self._trickle_headers()
        elif self.flapping is not None and self._good():
            self._flapping_file()
        else:
            super().do_GET()

    def do_HEAD(self) -> None:
        if self.path.startswith("/slow-headers"):
            self._trickle_headers()
        elif self.flapping is not None and self._good():
            self._flapping_file()
        else:
            super().do_HEAD()

    def _flapping_file(self) -> None:
        """A good file (or its head) as the spell says; a missing one 404 as ever."""
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return

        def make() -> tuple[int, bytes, str]:
            return 200, path.read_bytes(), self.guess_type(str(path))

        if self.command == "HEAD":
            bad = self.flapping.misbehave("depositor") if self.flapping else None
            kind, number = bad or ("", 0.0)
            if kind == RESET:
                reset(self)
            elif kind in (UNAVAILABLE, UNAVAILABLE_RETRY_AFTER):
                self.send_response(503)
                self.send_header("Content-Length", "0")
                if kind == UNAVAILABLE_RETRY_AFTER:
                    self.send_header("Retry-After", f"{number:g}")
                self.end_headers()
            else:
                time.sleep(number)
                super().do_HEAD()
            return
        answer_flapping(self, self.flapping, "depositor", make, (b"unavailable", "text/plain"))

    def _trickle_body(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "1000000")
        self.end_headers()
        with contextlib.suppress(OSError):
            while not self.stop.wait(1.0):
                self.wfile.write(b"x")
                self.wfile.flush()

    def _trickle_headers(self) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Padding: " + b"x" * 100_000
        self.close_connection = True
        with contextlib.suppress(OSError):
            for byte in head:
                if self.stop.wait(1.0):
                    return
                self.wfile.write(bytes([byte]))
                self.wfile.flush()


class Sentinel(BaseHTTPRequestHandler):
    """Stands where a depositor must never make us go (127.0.0.2); counts who came anyway."""

    hits = 0

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        type(self).hits += 1
        self.send_response(200)
        self.send_header("Content-Length", "7")
        self.end_headers()
        self.wfile.write(b"private")

    do_HEAD = do_GET


def files_server(folder: str, *, port: int = 0) -> Served:
    return Served(partial(QuietFiles, directory=folder), port=port)


def depositor_server(folder: str, *, port: int = 0, flapping: Flapping | None = None) -> Served:
    DepositorRoutes.stop.clear()
    DepositorRoutes.callbacks.clear()
    DepositorRoutes.keys.clear()
    DepositorRoutes.told.clear()
    DepositorRoutes.flapping = flapping
    return Served(partial(DepositorRoutes, directory=folder), port=port)


def _job_status(body: bytes) -> str:
    """The ``jobStatus`` a callback's job state tells, in whichever of Merritt's formats it came
    (JSON, XML, ANVL; ``queues.steps.notify.job_state_body``); "?" when it tells none."""
    try:
        state = json.loads(body)
    except ValueError:
        return _xml_or_anvl_status(body.decode("utf-8", "replace"))
    fields: Any = next(iter(state.values()), {}) if isinstance(state, dict) and state else {}
    if not isinstance(fields, dict):
        return "?"
    found = next((v for k, v in fields.items() if k.rsplit(":", 1)[-1] == "jobStatus"), "?")
    return str(found)


def _xml_or_anvl_status(text: str) -> str:
    if text.startswith("<?xml"):
        root = parse_xml(text)
        fields = [] if root is None else list(root)
        return next((e.text or "?" for e in fields if local_name(e.tag) == "jobStatus"), "?")
    for line in text.splitlines():
        name, sep, value = line.partition(": ")
        if sep and name == "jobStatus":
            return value
    return "?"


def sentinel_server() -> Served:
    Sentinel.hits = 0
    return Served(Sentinel, host="127.0.0.2")


# The black hole ---------------------------------------------------------------------------------


class BlackHoleProxy:
    """A TCP forwarder from a loopback port to ``upstream``, which ``hole()`` turns into a black
    hole: bytes stop moving both ways and nothing is closed, as when a network path dies
    without a reset. New connections are accepted and held; ``heal()`` lets everything flow
    again, so the client meets whatever the server decided meanwhile (its session expired)."""

    def __init__(self, upstream: tuple[str, int], *, port: int = 0) -> None:
        self.upstream = upstream
        self.open = threading.Event()
        self.open.set()
        self.closing = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = int(self.listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def hole(self) -> None:
        self.open.clear()

    def heal(self) -> None:
        self.open.set()

    def close(self) -> None:
        self.closing.set()
        self.open.set()
        with contextlib.suppress(OSError):
            self.listener.close()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                client, _address = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self.open.wait()
        try:
            server = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            client.close()
            return
        server.settimeout(None)
        self._pump(client, server)

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peers = {client: server, server: client}
        try:
            while not self.closing.is_set():
                if not self.open.is_set():
                    time.sleep(0.1)
                    continue
                readable, _w, _x = select.select(list(peers), [], [], 0.2)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except OSError:
            return
        finally:
            for sock in peers:
                with contextlib.suppress(OSError):
                    sock.close()
