"""The loopback servers of a chaos run: the depositors' files (with the hostile routes and the
callback receiver), the address a depositor must never reach, the working folders as
``MRT_WORK_URL``, stand-ins of storage, inventory and EZID, a TCP proxy that can be made a black
hole, and ``Flapping``, which makes the services outside answer badly for a spell."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import select
import socket
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from functools import partial
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from random import Random
from typing import Any
from urllib.parse import parse_qs, quote, unquote, unquote_plus, urlsplit
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


# Flapping ---------------------------------------------------------------------------------------

# How a flapping service answers, one kind a phase of a spell: every request of the phase.
UNAVAILABLE = "503"
UNAVAILABLE_RETRY_AFTER = "503 with Retry-After"
RESET = "reset"  # half of them before anything is done, half after, in the middle of the answer
SLOW = "slow"
FLAP_KINDS = (UNAVAILABLE, UNAVAILABLE_RETRY_AFTER, RESET, SLOW)
# A slow answer waits this long (seconds) before it is made: well inside every deadline of the
# run (MRT_HTTP_TIMEOUT 30 s, MRT_DOWNLOAD_DEADLINE 20 s).
SLOW_SECONDS = (0.5, 3.0)
# What a 503 asks for with Retry-After (seconds).
RETRY_AFTER_SECONDS = (1, 2)


# The services that flap, by the names ``Flapping`` is asked with.
FLAPPING_SERVICES = ("storage", "inventory", "EZID", "depositor", "callback")


class Flapping:
    """The services outside of a chaos run answering badly for a spell, then well again.

    While a spell is on (``set`` by the flap fault, for every service at once or each its own),
    every request to a flapping server (storage, inventory, EZID, the depositors' good files and
    the callback receiver) is answered by its service's kind: 503 without or with
    ``Retry-After``; the connection reset (RST), either before anything is done or after the
    request was carried out, halfway through the answer (a storage version made, an ARK minted,
    a callback counted, the client never told); or the right answer after a pause. ``spoiled``
    counts what was done, per service and kind."""

    def __init__(self, seed: int) -> None:
        self.lock = threading.Lock()
        self.rng = Random(seed)
        self.kind: str | None = None
        self.kinds: dict[str, str | None] = {}
        self.spoiled: Counter[tuple[str, str]] = Counter()

    def set(self, kind: str | None, **kinds: str | None) -> None:
        """Every service answers as ``kind`` (None: well), but those named in ``kinds``."""
        with self.lock:
            self.kind = kind
            self.kinds = dict(kinds)

    def misbehave(self, service: str) -> tuple[str, float] | None:
        """What this request meets: (kind, a number for it), counted; None: a good answer.
        The number is the Retry-After, the pause of a slow answer, or for a reset 0 (before
        anything is done) or 1 (halfway through the answer)."""
        with self.lock:
            kind = self.kinds.get(service, self.kind)
            if kind is None:
                return None
            if kind == UNAVAILABLE_RETRY_AFTER:
                number = float(self.rng.choice(RETRY_AFTER_SECONDS))
            elif kind == SLOW:
                number = self.rng.uniform(*SLOW_SECONDS)
            elif kind == RESET:
                number = float(self.rng.random() < 0.5)
            else:
                number = 0.0
            shown = kind if kind != RESET else ("reset mid-answer" if number else "reset at once")
            self.spoiled[(service, shown)] += 1
            return kind, number

    def figures(self) -> dict[str, Counter[str]]:
        """Service -> spoiled answers per kind."""
        found: dict[str, Counter[str]] = {}
        with self.lock:
            for (service, kind), count in self.spoiled.items():
                found.setdefault(service, Counter())[kind] += count
        return found


def reset(handler: BaseHTTPRequestHandler) -> None:
    """Reset the handler's connection (RST, not FIN), as a crashing server or a balancer does."""
    with contextlib.suppress(OSError):
        handler.wfile.flush()
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        handler.connection.close()
    handler.close_connection = True


def answer_flapping(
    handler: BaseHTTPRequestHandler,
    flapping: Flapping | None,
    service: str,
    make: Callable[[], tuple[int, bytes, str]],
    unavailable: tuple[bytes, str],
) -> None:
    """Answer with ``make()`` (status, body, content type), or as the spell of ``flapping``
    says; ``unavailable``: the service's body and content type of a 503."""
    bad = flapping.misbehave(service) if flapping is not None else None
    kind, number = bad or ("", 0.0)
    if kind in (UNAVAILABLE, UNAVAILABLE_RETRY_AFTER):
        body, content_type = unavailable
        handler.send_response(503)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        if kind == UNAVAILABLE_RETRY_AFTER:
            handler.send_header("Retry-After", f"{number:g}")
        handler.end_headers()
        handler.wfile.write(body)
        return
    if kind == RESET and not number:
        reset(handler)
        return
    if kind == SLOW:
        time.sleep(number)
    status, body, content_type = make()
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if kind == RESET:
        with contextlib.suppress(OSError):
            handler.wfile.write(body[: len(body) // 2])
        reset(handler)
        return
    handler.wfile.write(body)


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
    """The ``jobStatus`` a callback's JSON job state tells ("?" when it tells none)."""
    try:
        state = json.loads(body)
    except ValueError:
        return "?"
    fields: Any = next(iter(state.values()), {}) if isinstance(state, dict) and state else {}
    if not isinstance(fields, dict):
        return "?"
    found = next((v for k, v in fields.items() if k.rsplit(":", 1)[-1] == "jobStatus"), "?")
    return str(found)


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

    def __init__(
        self, *, port: int = 0, add_seconds: float = 0.0, flapping: Flapping | None = None
    ) -> None:
        self.flapping = flapping
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

                def make() -> tuple[int, bytes, str]:
                    status, answer, content_type = stand_in.answer(self.command, parts.path, form)
                    if self.command == "POST" and status == 200 and stand_in.add_seconds:
                        port = int(self.client_address[1])
                        with stand_in.lock:
                            stand_in.answering.add(port)
                        time.sleep(stand_in.add_seconds)
                        with stand_in.lock:
                            stand_in.answering.discard(port)
                    return status, answer, content_type

                unavailable = _exception("EXTERNAL_SERVICE_UNAVAILABLE", 503, "flapping")
                answer_flapping(self, stand_in.flapping, "storage", make, (unavailable, "text/xml"))

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


# Inventory and EZID ----------------------------------------------------------------------------


class ServiceStandIn:
    """A loopback service answering ``answer(method, path, query, headers, body)`` with
    (status, body, content type), flapping with ``flapping``."""

    service = "service"
    unavailable: tuple[bytes, str] = (b"unavailable", "text/plain")

    def __init__(self, *, flapping: Flapping | None = None) -> None:
        self.flapping = flapping
        self.lock = threading.Lock()
        self.served = Served(self._handler())
        self.url = self.served.url

    def stop(self) -> None:
        self.served.stop()

    def answer(
        self, method: str, path: str, query: dict[str, str], headers: Any, body: bytes
    ) -> tuple[int, bytes, str]:
        raise NotImplementedError

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
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}

                def make() -> tuple[int, bytes, str]:
                    return stand_in.answer(self.command, parts.path, query, self.headers, body)

                answer_flapping(
                    self, stand_in.flapping, stand_in.service, make, stand_in.unavailable
                )

            do_GET = do_POST = do_PUT = _serve

        return Handler


class InventoryStandIn(ServiceStandIn):
    """Merritt's inventory where the queue meets it (docs/merritt-services.md): ``POST add``
    (multipart, the storage manifest's ``url``) records a version, ``GET primary/{owner}/{local
    id}?t=json`` answers the local-container state, ``POST primary/{ark}/{owner}/{local id}``
    records a local id. Adding again changes nothing, as in mrt-inventory."""

    service = "inventory"
    unavailable = (_exception("EXTERNAL_SERVICE_UNAVAILABLE", 503, "flapping"), "text/xml")

    def __init__(self, *, flapping: Flapping | None = None) -> None:
        self.added: set[str] = set()
        self.local_ids: dict[tuple[str, str], str] = {}  # (owner, local id) -> ARK
        super().__init__(flapping=flapping)

    def answer(
        self, method: str, path: str, query: dict[str, str], headers: Any, body: bytes
    ) -> tuple[int, bytes, str]:
        xml = "text/xml; charset=UTF-8"
        segments = [unquote_plus(s) for s in path.strip("/").split("/")]
        if segments == ["add"] and method == "POST":
            url = _multipart_field(headers.get("Content-Type", ""), body, "url")
            if not url.startswith(("http://", "https://")):
                return 400, _exception("REQUEST_INVALID", 400, f"manifest URL: {url!r}"), xml
            with self.lock:
                self.added.add(url)
            made = (
                f"<invp:invProcessState><invp:url>{escape(url)}</invp:url></invp:invProcessState>"
            )
            return 200, made.encode(), xml
        if segments[:1] == ["primary"] and len(segments) == 3 and method == "GET":
            with self.lock:
                ark = self.local_ids.get((segments[1], segments[2]))
            state: dict[str, Any] = {"invloc:exists": ark is not None}
            if ark:
                state["invloc:primaryIdentifier"] = ark
            body = json.dumps({"invloc:localContainerState": state}).encode()
            return 200, body, "application/json"
        if segments[:1] == ["primary"] and len(segments) == 4 and method == "POST":
            ark, owner, local_id = segments[1:]
            if not ark.startswith("ark:/"):
                return 400, _exception("REQUEST_INVALID", 400, f"objectID: {ark}"), xml
            with self.lock:
                self.local_ids[(owner, local_id)] = ark
            return 200, b"<invloc:localContainerState/>", xml
        return 400, _exception("REQUEST_INVALID", 400, f"no such resource: {path}"), xml


class EzidStandIn(ServiceStandIn):
    """EZID's API where the queue meets it: ``POST /shoulder/{shoulder}`` mints (every mint a
    new identifier, as EZID's), ``POST /id/{identifier}`` updates one it holds, ``PUT
    /id/{identifier}?update_if_exists=yes`` creates or updates; ``success: ...`` or ``error:
    ...`` lines, HTTP Basic auth with ``user``/``password``."""

    service = "EZID"
    unavailable = (b"error: service unavailable\n", "text/plain; charset=UTF-8")

    def __init__(self, user: str, password: str, *, flapping: Flapping | None = None) -> None:
        self.expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.minted = 0
        self.identifiers: set[str] = set()
        super().__init__(flapping=flapping)

    def answer(
        self, method: str, path: str, query: dict[str, str], headers: Any, body: bytes
    ) -> tuple[int, bytes, str]:
        def said(status: int, line: str) -> tuple[int, bytes, str]:
            return status, f"{line}\n".encode(), "text/plain; charset=UTF-8"

        if headers.get("Authorization", "") != self.expected:
            return said(401, "error: unauthorized")
        path = unquote(path)
        if method == "POST" and path.startswith("/shoulder/"):
            shoulder = path.removeprefix("/shoulder/")
            if not shoulder.startswith("ark:/"):
                return said(400, f"error: bad request - unrecognized shoulder: {shoulder}")
            with self.lock:
                self.minted += 1
                identifier = f"{shoulder}c{self.minted:06d}"
                self.identifiers.add(identifier)
            return said(201, f"success: {identifier}")
        if path.startswith("/id/") and method in ("POST", "PUT"):
            identifier = path.removeprefix("/id/")
            with self.lock:
                held = identifier in self.identifiers
                if method == "PUT" and query.get("update_if_exists") == "yes":
                    self.identifiers.add(identifier)
                    return said(200 if held else 201, f"success: {identifier}")
            if not held:
                return said(400, "error: bad request - no such identifier")
            return said(200, f"success: {identifier}")
        return said(404, "error: not found")


def _multipart_field(content_type: str, body: bytes, name: str) -> str:
    """A field of a multipart/form-data body ("" when absent)."""
    head = f"Content-Type: {content_type}\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    if not message.is_multipart():
        return ""
    for part in message.iter_parts():
        if part.get_param("name", header="content-disposition") == name:
            return str(part.get_content()).strip()
    return ""


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
