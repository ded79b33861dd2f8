"""The loopback servers of a chaos run: the depositors' files (with the hostile routes), the
address a depositor must never reach, the working folders as ``MRT_WORK_URL``, a storage
stand-in, and a TCP proxy that can be made a black hole."""

from __future__ import annotations

import contextlib
import hashlib
import select
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit
from xml.sax.saxutils import escape

import requests

from queues.steps.checkm import ManifestError, parse_checkm

VERSION_NS = "http://uc3.cdlib.org/ontology/mrt/store/version"
OBJECT_NS = "http://uc3.cdlib.org/ontology/mrt/store/object"
FILE_NS = "http://uc3.cdlib.org/ontology/mrt/store/file"


class QuietServer(ThreadingHTTPServer):
    """A client killed or paused mid-request (as the run does all along) is no error here."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


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
    keys (``Idempotency-Key``) it carried, and answered 200."""

    stop = threading.Event()
    callbacks: Counter[str] = Counter()
    keys: dict[str, set[str]] = {}  # job ID -> the delivery keys its posts carried ("" none)
    counting = threading.Lock()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        prefix = "/callback/mc/"
        if not self.path.startswith(prefix):
            self.send_error(404)
            return
        jid = self.path[len(prefix) :]
        with self.counting:
            self.callbacks[jid] += 1
            self.keys.setdefault(jid, set()).add(self.headers.get("Idempotency-Key", ""))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        if self.path.startswith("/trickle"):
            self._trickle_body()
        elif self.path.startswith("/slow-headers"):
            self._trickle_headers()
        else:
            super().do_GET()

    def do_HEAD(self) -> None:
        if self.path.startswith("/slow-headers"):
            self._trickle_headers()
        else:
            super().do_HEAD()

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


def depositor_server(folder: str, *, port: int = 0) -> Served:
    DepositorRoutes.stop.clear()
    DepositorRoutes.callbacks.clear()
    DepositorRoutes.keys.clear()
    return Served(partial(DepositorRoutes, directory=folder), port=port)


def sentinel_server() -> Served:
    Sentinel.hits = 0
    return Served(Sentinel, host="127.0.0.2")


# Storage ----------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class StoredFile:
    """A file of a version as storage keeps it, from the manifest it was added from."""

    name: str
    size: int
    algorithm: str
    digest: str


@dataclass
class StoredObject:
    """The files of each version of one object, and the manifest text each was added from."""

    versions: list[tuple[StoredFile, ...]] = field(default_factory=list)
    manifests: list[str] = field(default_factory=list)


class StorageStandIn:
    """Merritt's storage service as the queue meets it (docs/merritt-services.md), where it
    matters under faults: every ``POST add/{node}/{ark}`` makes a new version, whether or not
    its content is the latest one's, as mrt-store does.

    ``GET manifest/{node}/{ark}`` answers the latest version's manifest as checkm (what the
    local inventory reads), and the state documents ``GET state/{node}/{ark}[/{version}[/{file}]]``
    the object (``obj:numVersions``), a version (``ver:numFiles``; version 0 is the current
    one) and a file (``fil:size``, ``fil:messageDigest`` as ``algorithm=value``), so a claimer
    can tell whether the content it is about to add is already the latest.
    """

    def __init__(self, *, port: int = 0, add_seconds: float = 0.0) -> None:
        self.objects: dict[tuple[int, str], StoredObject] = {}
        self.adds = 0
        # An add is applied at once and answered after add_seconds, as a real add takes its
        # time: a client paused or cut off meanwhile has its version made without knowing it.
        self.add_seconds = add_seconds
        # The client ports of the adds being answered (the made version not yet told).
        self.answering: set[int] = set()
        self.lock = threading.Lock()
        self.served = Served(self._handler(), port=port)
        self.url = self.served.url

    def stop(self) -> None:
        self.served.stop()

    def versions(self) -> dict[str, list[str]]:
        """ARK -> a digest of each of its versions' files, oldest first."""
        with self.lock:
            return {
                ark: [_files_digest(files) for files in obj.versions]
                for (_node, ark), obj in self.objects.items()
            }

    def _add(self, node: int, ark: str, form: dict[str, str]) -> tuple[int, bytes]:
        manifest_url = form.get("url", "")
        text = form.get("manifest", "")
        if manifest_url:
            try:
                fetched = requests.get(manifest_url, timeout=30)
            except requests.RequestException as exc:
                return 503, _exception("EXTERNAL_SERVICE_UNAVAILABLE", 503, f"manifest: {exc}")
            if not fetched.ok:
                return 400, _exception(
                    "REQUEST_INVALID", 400, f"manifest not retrieved: {fetched.status_code}"
                )
            text = fetched.text
        try:
            rows = parse_checkm(text).rows
        except ManifestError as exc:
            return 400, _exception("REQUEST_INVALID", 400, f"manifest not valid: {exc}")
        files = tuple(
            StoredFile(r.filename, r.size or 0, r.hash_alg.lower(), r.hash_value.lower())
            for r in rows
        )
        with self.lock:
            stored = self.objects.setdefault((node, ark), StoredObject())
            stored.versions.append(files)
            stored.manifests.append(text)
            self.adds += 1
            version = len(stored.versions)
        base = f"{self.url}/state/{node}/{_quote(ark)}"
        return 200, _state(
            "ver:versionState",
            VERSION_NS,
            {"ver:objectID": ark, "ver:identifier": version, "ver:version": f"{base}/{version}",
             "ver:numFiles": len(files)},
        )  # fmt: skip

    def _state(self, node: int, ark: str, stored: StoredObject, below: list[str]) -> bytes | None:
        base = f"{self.url}/state/{node}/{_quote(ark)}"
        versions = stored.versions
        if not below:
            return _state(
                "obj:objectState",
                OBJECT_NS,
                {"obj:identifier": ark, "obj:numVersions": len(versions),
                 "obj:currentVersionState": f"{base}/{len(versions)}"},
            )  # fmt: skip
        number = int(below[0]) if below[0].isdigit() else -1
        number = len(versions) if number == 0 else number
        if not 1 <= number <= len(versions):
            return None
        files = versions[number - 1]
        if len(below) == 1:
            return _state(
                "ver:versionState",
                VERSION_NS,
                {"ver:identifier": number, "ver:current": str(number == len(versions)).lower(),
                 "ver:numFiles": len(files), "ver:totalSize": sum(f.size for f in files)},
            )  # fmt: skip
        found = next((f for f in files if f.name == below[1]), None)
        if found is None:
            return None
        return _state(
            "fil:fileState",
            FILE_NS,
            {"fil:identifier": found.name, "fil:size": found.size,
             "fil:messageDigest": f"{found.algorithm}={found.digest}"},
        )  # fmt: skip

    def answer(self, method: str, path: str, form: dict[str, str]) -> tuple[int, bytes, str]:
        xml = "text/xml; charset=UTF-8"
        segments = [unquote(s) for s in path.strip("/").split("/")]
        if len(segments) < 3 or not segments[1].isdigit():
            return 400, _exception("REQUEST_INVALID", 400, f"no such resource: {path}"), xml
        action, node, ark = segments[0], int(segments[1]), segments[2]
        if action == "add" and method == "POST" and len(segments) == 3:
            status, body = self._add(node, ark, form)
            return status, body, xml
        if method != "GET" or action not in ("manifest", "state"):
            return 400, _exception("REQUEST_INVALID", 400, f"{method} {path} not supported"), xml
        with self.lock:
            found = self.objects.get((node, ark))
            stored = StoredObject(list(found.versions), list(found.manifests)) if found else None
        if stored is None or not stored.versions:
            return 404, _exception("REQUESTED_ITEM_NOT_FOUND", 404, f"object not found: {ark}"), xml
        if action == "manifest":
            return 200, stored.manifests[-1].encode(), "text/plain; charset=UTF-8"
        state = self._state(node, ark, stored, segments[3:])
        if state is None:
            return 404, _exception("REQUESTED_ITEM_NOT_FOUND", 404, f"not found: {path}"), xml
        return 200, state, xml

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                form = {
                    k: v[0]
                    for k, v in parse_qs(
                        body.decode(errors="replace"), keep_blank_values=True
                    ).items()
                }
                status, answer, content_type = stand_in.answer(self.command, parts.path, form)
                if self.command == "POST" and status == 200 and stand_in.add_seconds:
                    port = int(self.client_address[1])
                    with stand_in.lock:
                        stand_in.answering.add(port)
                    time.sleep(stand_in.add_seconds)
                    with stand_in.lock:
                        stand_in.answering.discard(port)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST = _serve

        return Handler


def _files_digest(files: tuple[StoredFile, ...]) -> str:
    text = "\n".join(f"{f.name}\0{f.size}\0{f.algorithm}={f.digest}" for f in sorted(files))
    return hashlib.sha256(text.encode()).hexdigest()


def _state(root: str, namespace: str, fields: dict[str, object]) -> bytes:
    """A state document as Merritt's storage writes one in XML."""
    prefix = root.split(":", 1)[0]
    children = "".join(f"<{k}>{escape(str(v))}</{k}>" for k, v in fields.items())
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns:{prefix}="{namespace}">'
        f"{children}</{root}>"
    ).encode()


def _quote(ark: str) -> str:
    return quote(ark, safe="")


def _exception(kind: str, status: int, error: str) -> bytes:
    """Merritt's exception document (``exc:tException.KIND``)."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<exc:tException.{kind} xmlns:exc="http://uc3.cdlib.org/ontology/mrt/core/exc">'
        f"<exc:statusName>{kind}</exc:statusName><exc:httpResponse>{status}</exc:httpResponse>"
        f"<exc:error>{escape(error)}</exc:error><exc:description>{escape(error)}</exc:description>"
        f"</exc:tException.{kind}>"
    ).encode()


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
