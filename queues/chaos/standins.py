"""Stand-ins for Merritt's services on loopback ports, answering as the real ones are documented
to (docs/merritt-services.md): storage, inventory, EZID, a depositor's callback receiver and
ingest's poster door. The one set the project has: ``manage.py chaosrun`` runs its storage,
inventory and EZID against them (made to flap, ``Flapping``), and the tests import them.

Each is a small ``http.server`` that records what it was sent (unless told not to: a chaos run
sends thousands of requests), keeps the little state its answers need, and refuses the way the
real service refuses: Merritt's Java services with their exception document
(``exc:tException.<KIND>``) under the exception's HTTP status, EZID with a ``error: reason``
line. ``refuse_next(...)`` makes the next request fail on purpose; a ``Flapping`` makes every
request of a spell answer badly (503, a reset connection, a slow answer).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import socket
import struct
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from random import Random
from typing import Any, Self
from urllib.parse import parse_qs, unquote, unquote_plus, urlsplit
from xml.sax.saxutils import escape, quoteattr

import requests

from queues.steps.checkm import ManifestError, parse_checkm

EXC_NS = "http://uc3.cdlib.org/ontology/mrt/core/exc"
VERSION_NS = "http://uc3.cdlib.org/ontology/mrt/store/version"
OBJECT_NS = "http://uc3.cdlib.org/ontology/mrt/store/object"
FILE_NS = "http://uc3.cdlib.org/ontology/mrt/store/file"
# The TException kinds these stand-ins use, with the HTTP status Merritt gives each
# (mrt-core2 core/.../utility/TExceptionEnum.java).
EXCEPTION_STATUS = {
    "REQUEST_INVALID": 400,
    "INVALID_OR_MISSING_PARM": 500,
    "REQUESTED_ITEM_NOT_FOUND": 404,
    "GENERAL_EXCEPTION": 500,
    "EXTERNAL_SERVICE_UNAVAILABLE": 503,
}


class QuietServer(ThreadingHTTPServer):
    """A client killed or paused mid-request (as the run does all along) is no error here."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


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


@dataclass
class Request:
    method: str
    path: str  # raw, still percent-encoded
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    client_port: int = 0

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()

    def form(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(self.body.decode(), keep_blank_values=True).items()}

    def multipart(self) -> dict[str, str]:
        head = f"Content-Type: {self.headers.get('Content-Type', '')}\r\n\r\n".encode()
        message = BytesParser(policy=HTTP).parsebytes(head + self.body)
        fields: dict[str, str] = {}
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            if name:
                fields[str(name)] = part.get_content().strip() if part.get_content() else ""
        return fields


@dataclass
class Answer:
    status: int
    body: bytes
    content_type: str = "text/xml; charset=UTF-8"
    headers: dict[str, str] = field(default_factory=dict)
    # Seconds between the bytes of the status line and headers: a service that trickles them.
    trickle: float = 0.0


def exception_document(kind: str, error: str, *, form: str = "xml") -> Answer:
    """Merritt's exception document for a TException of ``kind``, in XML or JSON."""
    status = EXCEPTION_STATUS[kind]
    if form == "json":
        body = {
            f"exc:tException.{kind}": {
                "xmlns:exc": EXC_NS,
                "exc:statusName": kind,
                "exc:httpResponse": status,
                "exc:error": error,
                "exc:description": error,
            }
        }
        return Answer(status, json.dumps(body).encode(), "application/json")
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<exc:tException.{kind} xmlns:exc="{EXC_NS}">'
        f"<exc:statusName>{kind}</exc:statusName>"
        f"<exc:httpResponse>{status}</exc:httpResponse>"
        f"<exc:error>{escape(error)}</exc:error>"
        f"<exc:description>{escape(error)}</exc:description>"
        f"</exc:tException.{kind}>"
    )
    return Answer(status, xml.encode())


class StandIn:
    """A loopback HTTP server; subclasses answer in ``handle``. ``start`` serves (``running``
    for a ``with``). ``port``: a fixed one (0: any free one); ``flapping``: answer badly while
    its spell is on, as the service ``name``; ``record``: keep every request (``seen``)."""

    name = "stand-in"

    def __init__(
        self, *, port: int = 0, flapping: Flapping | None = None, record: bool = True
    ) -> None:
        self.requests: list[Request] = []
        self.record = record
        self.flapping = flapping
        self.lock = threading.Lock()
        self._refusals: list[tuple[str | None, Answer]] = []
        self.server = QuietServer(("127.0.0.1", port), self._handler())
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def unavailable(self) -> Answer:
        """What a flapping spell of 503s answers."""
        return exception_document("EXTERNAL_SERVICE_UNAVAILABLE", "flapping")

    def refuse_next(self, answer: Answer, method: str | None = None) -> None:
        """Answer the next request (of ``method``, if given) with ``answer``."""
        with self.lock:
            self._refusals.append((method, answer))

    def stop_refusing(self) -> None:
        with self.lock:
            self._refusals.clear()

    def seen(self, method: str | None = None) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if method is None or r.method == method]

    def handle(self, request: Request) -> Answer:
        raise NotImplementedError

    def _dispatch(self, request: Request) -> Answer:
        with self.lock:
            if self.record:
                self.requests.append(request)
            refusal = None
            for index, (method, answer) in enumerate(self._refusals):
                if method is None or method == request.method:
                    refusal = answer
                    del self._refusals[index]
                    break
        return refusal or self.handle(request)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                request = Request(
                    self.command,
                    parts.path,
                    query,
                    dict(self.headers),
                    body,
                    int(self.client_address[1]),
                )
                flapping = stand_in.flapping
                bad = flapping.misbehave(stand_in.name) if flapping is not None else None
                kind, number = bad or ("", 0.0)
                if kind in (UNAVAILABLE, UNAVAILABLE_RETRY_AFTER):
                    answer = stand_in.unavailable()
                    if kind == UNAVAILABLE_RETRY_AFTER:
                        answer = replace(
                            answer, headers={**answer.headers, "Retry-After": f"{number:g}"}
                        )
                    self._answer(answer)
                    return
                if kind == RESET and not number:
                    reset(self)
                    return
                if kind == SLOW:
                    time.sleep(number)
                answer = stand_in._dispatch(request)
                if kind == RESET:  # done, and the connection reset halfway through the answer
                    self._answer(answer, cut=True)
                elif answer.trickle:
                    self._trickle(answer)
                else:
                    self._answer(answer)

            def _answer(self, answer: Answer, *, cut: bool = False) -> None:
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.content_type)
                self.send_header("Content-Length", str(len(answer.body)))
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                if cut:
                    with contextlib.suppress(OSError):
                        self.wfile.write(answer.body[: len(answer.body) // 2])
                    reset(self)
                    return
                self.wfile.write(answer.body)

            def _trickle(self, answer: Answer) -> None:
                head = [f"HTTP/1.1 {answer.status} OK", f"Content-Type: {answer.content_type}"]
                head.append(f"Content-Length: {len(answer.body)}")
                head += [f"{name}: {value}" for name, value in answer.headers.items()]
                try:
                    for byte in ("\r\n".join(head) + "\r\n\r\n").encode():
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(answer.trickle)
                    self.wfile.write(answer.body)
                except OSError:  # the client gave up
                    pass
                self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = _serve

        return Handler

    def start(self) -> Self:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def _files_digest(files: list[StoredFile]) -> str:
    rows = sorted((f.name, f.size, f.algorithm, f.digest) for f in files)
    text = "\n".join(
        f"{name}\0{size}\0{algorithm}={digest}" for name, size, algorithm, digest in rows
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _segments(path: str) -> list[str]:
    """Path segments, each URL-decoded once as JAX-RS decodes a @PathParam."""
    return [unquote(s) for s in path.strip("/").split("/")]


@dataclass(frozen=True)
class StoredFile:
    """A file of a version as storage keeps it: its name, size and digest (and its bytes, for
    an object a test put in with ``put_object``)."""

    name: str
    size: int
    algorithm: str
    digest: str
    content: bytes | None = field(default=None, compare=False, repr=False)


@dataclass
class StoredObject:
    versions: list[int] = field(default_factory=list)
    manifests: list[str] = field(default_factory=list)
    files: list[list[StoredFile]] = field(default_factory=list)  # per version


class StorageStandIn(StandIn):
    """mrt-store's entry points ingest and the Storing step use: ``POST add/{node}/{ark}``
    (url-encoded form, or multipart), ``GET manifest/{node}/{ark}`` and the state documents
    ``GET state/{node}/{ark}[/{version}[/{file}]]``.

    ``GET manifest/{node}/{ark}`` answers the object's manifest as Merritt's storage streams it
    (the cloud library's ``objectInfo`` document, as its ``ManifestSAX`` reads it: ``object``
    with its ``id``, each ``version`` with its ``manifest`` of ``file`` elements and their
    ``size``, ``digestType``, ``digest``, ``creationDate``, ``key``; the object's ``current``
    and counts after them), and ``GET content/{node}/{ark}/{version}/{file}`` a file's bytes
    (for objects put in with ``put_object``).

    An add needs ``url`` (the manifest's URL, fetched here and read as checkm) or ``manifest``
    (its text); like Merritt's storage it makes a new version for EVERY add, identical content
    or not, and answers the version state in the form ``t`` names (``xhtml`` by default, read as
    XML here). The state documents answer the object (``obj:objectState``: its number of
    versions), a version (``ver:versionState``: its number of files and total size, links to
    its file states; version 0 is the current one) and a file (``fil:fileState``: its name,
    size and ``messageDigest`` as ``algorithm=value``), in XML or, with ``t=json``, JSON.
    Unknown nodes, objects, versions and files are REQUESTED_ITEM_NOT_FOUND (404), a missing
    manifest REQUEST_INVALID.
    """

    name = "storage"

    def __init__(
        self,
        nodes: tuple[int, ...] | None = (9501,),
        *,
        add_seconds: float = 0.0,
        port: int = 0,
        flapping: Flapping | None = None,
        record: bool = True,
    ) -> None:
        super().__init__(port=port, flapping=flapping, record=record)
        self.nodes = None if nodes is None else set(nodes)  # None: every node
        self.objects: dict[tuple[int, str], StoredObject] = {}
        self.adds = 0
        # Called with the ARK and the new version number once an add has made its version and
        # before it is answered: where a test makes the adding client lose its session.
        self.on_add: Callable[[str, int], None] | None = None
        # An add is made at once and answered after add_seconds, as a real add takes its time:
        # a client paused or cut off meanwhile has its version made without knowing it (a chaos
        # run's faults aim at the client ports in ``answering``, the adds not yet told).
        self.add_seconds = add_seconds
        self.answering: set[int] = set()

    def versions(self) -> dict[str, list[str]]:
        """ARK -> a digest of each of its versions' files, oldest first."""
        with self.lock:
            return {
                ark: [_files_digest(files) for files in stored.files]
                for (_node, ark), stored in self.objects.items()
            }

    def handle(self, request: Request) -> Answer:
        segments = _segments(request.path)
        known = (
            (segments[0] == "state" and 3 <= len(segments) <= 5)
            or (len(segments) == 3 and segments[0] in ("add", "manifest"))
            or (len(segments) == 5 and segments[0] == "content")
        )
        if not known:
            return exception_document("REQUEST_INVALID", f"no such resource: {request.path}")
        action, node_text, ark = segments[:3]
        if not node_text.isdigit():
            return exception_document("REQUEST_INVALID", f"nodeID not numeric: {node_text}")
        node = int(node_text)
        if self.nodes is not None and node not in self.nodes:
            return exception_document("REQUESTED_ITEM_NOT_FOUND", f"node not found: {node}")
        if action == "manifest" and request.method == "GET":
            return self._manifest(node, ark)
        if action == "content" and request.method == "GET":
            return self._content(node, ark, segments[3], segments[4])
        if action == "state" and request.method == "GET":
            return self._state(node, ark, segments[3:], request.query.get("t", "xhtml"))
        if action == "add" and request.method == "POST":
            return self._add(request, node, ark)
        return exception_document("REQUEST_INVALID", f"{request.method} not supported here")

    def _add(self, request: Request, node: int, ark: str) -> Answer:
        if request.content_type == "application/x-www-form-urlencoded":
            form = request.form()
            response_form = form.get("t", "xhtml")
        elif request.content_type == "multipart/form-data":
            form = request.multipart()
            response_form = form.get("responseForm", "xhtml")
        else:
            return Answer(415, b"Unsupported Media Type", "text/plain")
        if not ark.startswith("ark:/"):
            return exception_document("REQUEST_INVALID", f"objectID not valid: {ark}")
        manifest_url, manifest_text = form.get("url", ""), form.get("manifest", "")
        if not manifest_url and not manifest_text:
            return exception_document("REQUEST_INVALID", "manifest or url required")
        if manifest_url:
            try:
                fetched = requests.get(manifest_url, timeout=10)
            except requests.RequestException as exc:
                return exception_document("EXTERNAL_SERVICE_UNAVAILABLE", f"manifest: {exc}")
            if not fetched.ok:
                return exception_document(
                    "REQUEST_INVALID", f"manifest not retrieved: {fetched.status_code}"
                )
            manifest_text = fetched.text
        try:
            rows = parse_checkm(manifest_text).rows
        except ManifestError as exc:
            return exception_document("REQUEST_INVALID", f"manifest not valid: {exc}")
        files = [
            StoredFile(r.filename, r.size or 0, r.hash_alg.lower(), r.hash_value.lower())
            for r in rows
        ]
        with self.lock:
            stored = self.objects.setdefault((node, ark), StoredObject())
            version = len(stored.versions) + 1
            stored.versions.append(version)
            stored.manifests.append(manifest_url)
            stored.files.append(files)
            self.adds += 1
        if self.on_add is not None:
            self.on_add(ark, version)
        if self.add_seconds:
            with self.lock:
                self.answering.add(request.client_port)
            time.sleep(self.add_seconds)
            with self.lock:
                self.answering.discard(request.client_port)
        link = f"{self.url}/state/{node}/{quote_ark(ark)}/{version}"
        if response_form == "json":
            state = {
                "ver:versionState": {
                    "xmlns:ver": VERSION_NS,
                    "ver:objectID": ark,
                    "ver:identifier": version,
                    "ver:version": link,
                    "ver:numFiles": len(files),
                }
            }
            return Answer(200, json.dumps(state).encode(), "application/json")
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<ver:versionState xmlns:ver="{VERSION_NS}">'
            f"<ver:objectID>{escape(ark)}</ver:objectID>"
            f"<ver:identifier>{version}</ver:identifier>"
            f"<ver:version>{escape(link)}</ver:version>"
            f"<ver:numFiles>{len(files)}</ver:numFiles>"
            "</ver:versionState>"
        )
        return Answer(200, xml.encode())

    def put_object(self, node: int, ark: str, versions: list[dict[str, bytes]]) -> None:
        """Put an object in directly, one dict of file name -> bytes per version."""
        stored = StoredObject()
        for number, files in enumerate(versions, start=1):
            stored.versions.append(number)
            stored.manifests.append("")
            stored.files.append(
                [
                    StoredFile(name, len(data), "sha-256", hashlib.sha256(data).hexdigest(), data)
                    for name, data in files.items()
                ]
            )
        with self.lock:
            self.objects[(node, ark)] = stored

    def _manifest(self, node: int, ark: str) -> Answer:
        with self.lock:
            stored = self.objects.get((node, ark))
            versions = list(zip(stored.versions, stored.files, strict=True)) if stored else []
        if not versions:
            return exception_document("REQUESTED_ITEM_NOT_FOUND", f"object not found: {ark}")
        parts = [f"<objectInfo><object id={quoteattr(ark)}>"]
        for number, files in versions:
            size = sum(f.size for f in files)
            parts.append(
                f'<version id="{number}"><manifest count="{len(files)}" size="{size}" '
                'created="2026-11-21T10:02:03-08:00">'
            )
            for f in files:
                parts.append(
                    f"<file id={quoteattr(f.name)}><size>{f.size}</size>"
                    f"<digestType>{escape(f.algorithm)}</digestType>"
                    f"<digest>{escape(f.digest)}</digest>"
                    "<creationDate>2026-11-21T10:02:03-08:00</creationDate>"
                    f"<key>{escape(f'{ark}|{number}|{f.name}')}</key></file>"
                )
            parts.append("</manifest></version>")
        current = versions[-1][1]
        parts.append(
            f"<current>{versions[-1][0]}</current><fileCount>{len(current)}</fileCount>"
            f"<totalSize>{sum(f.size for f in current)}</totalSize></object></objectInfo>"
        )
        return Answer(200, ('<?xml version="1.0" encoding="UTF-8"?>\n' + "".join(parts)).encode())

    def _content(self, node: int, ark: str, version: str, name: str) -> Answer:
        with self.lock:
            stored = self.objects.get((node, ark))
            files = (
                stored.files[int(version) - 1]
                if stored and version.isdigit() and 0 < int(version) <= len(stored.files)
                else []
            )
        found = next((f for f in files if f.name == name and f.content is not None), None)
        if found is None or found.content is None:
            return exception_document("REQUESTED_ITEM_NOT_FOUND", f"file not found: {name}")
        return Answer(200, found.content, "application/octet-stream")

    def _state(self, node: int, ark: str, below: list[str], form: str) -> Answer:
        with self.lock:
            stored = self.objects.get((node, ark))
            versions = list(stored.files) if stored is not None else []
        if not versions:
            return _not_found(f"object not found: {ark}", form)
        base = f"{self.url}/state/{node}/{quote_ark(ark)}"
        if not below:
            return _state_document(
                "obj:objectState",
                OBJECT_NS,
                {
                    "obj:identifier": ark,
                    "obj:numVersions": len(versions),
                    "obj:numFiles": sum(len(v) for v in versions),
                    "obj:currentVersionState": f"{base}/{len(versions)}",
                },
                form,
            )
        number = int(below[0]) if below[0].isdigit() else -1
        number = len(versions) if number == 0 else number
        if not 1 <= number <= len(versions):
            return _not_found(f"versionID not found: {below[0]}", form)
        files = versions[number - 1]
        if len(below) == 1:
            links = [f"{base}/{number}/{quote_ark(f.name)}" for f in files]
            return _state_document(
                "ver:versionState",
                VERSION_NS,
                {
                    "ver:identifier": number,
                    "ver:current": number == len(versions),
                    "ver:numFiles": len(files),
                    "ver:totalSize": sum(f.size for f in files),
                    "ver:objectState": base,
                    "ver:fileStates": {"ver:fileState": links},
                },
                form,
            )
        found = next((f for f in files if f.name == below[1]), None)
        if found is None:
            return _not_found(f"component not found: {below[1]}", form)
        return _state_document(
            "fil:fileState",
            FILE_NS,
            {
                "fil:identifier": found.name,
                "fil:size": found.size,
                "fil:messageDigest": f"{found.algorithm}={found.digest}",
                "fil:versionState": f"{base}/{number}",
            },
            form,
        )


def _not_found(error: str, form: str) -> Answer:
    return exception_document("REQUESTED_ITEM_NOT_FOUND", error, form=form)


def _state_document(root: str, namespace: str, fields: dict[str, Any], form: str) -> Answer:
    """A state document as Merritt's formatter writes one: XML elements (a list repeats its
    element inside its wrapper), or one JSON object keyed by the root's name."""
    prefix = root.split(":", 1)[0]
    if form == "json":
        body = {root: {f"xmlns:{prefix}": namespace, **fields}}
        return Answer(200, json.dumps(body).encode(), "application/json")

    def element(name: str, value: Any) -> str:
        if isinstance(value, dict):
            inner = "".join(
                "".join(element(k, item) for item in v) if isinstance(v, list) else element(k, v)
                for k, v in value.items()
            )
            return f"<{name}>{inner}</{name}>"
        text = str(value).lower() if isinstance(value, bool) else str(value)
        return f"<{name}>{escape(text)}</{name}>"

    children = "".join(element(k, v) for k, v in fields.items())
    head = f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns:{prefix}="{namespace}">'
    xml = f"{head}{children}</{root}>"
    return Answer(200, xml.encode())


def quote_ark(ark: str) -> str:
    from urllib.parse import quote

    return quote(ark, safe="")


class InventoryStandIn(StandIn):
    """mrt-inventory's entry points ingest uses: ``POST add`` (multipart form data only:
    ``url``, ``responseForm``), ``GET primary/{owner}/{local id}?t=json`` and
    ``POST primary/{ark}/{owner}/{local ids}``."""

    name = "inventory"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.added: list[str] = []
        self.local_ids: dict[tuple[str, str], str] = {}  # (owner, local id) -> ark

    def handle(self, request: Request) -> Answer:
        segments = _segments(request.path)
        form = request.query.get("t", "xhtml")
        if segments == ["state"] and request.method == "GET":
            # JerseyInv's ``GET state``: the service's state document (only its status is read
            # here: the breaker's probe asks whether the service answers).
            return Answer(
                200,
                b"<invs:invServiceState><invs:name>inventory</invs:name></invs:invServiceState>",
            )
        if segments == ["add"] and request.method == "POST":
            if request.content_type != "multipart/form-data":
                # The add resource consumes multipart/form-data only.
                return Answer(415, b"Unsupported Media Type", "text/plain")
            fields = request.multipart()
            url = fields.get("url", "")
            if not url.startswith(("http://", "https://")):
                return exception_document("REQUEST_INVALID", f"manifest URL required: {url!r}")
            with self.lock:
                self.added.append(url)
            xml = f"<invp:invProcessState><invp:url>{escape(url)}</invp:url></invp:invProcessState>"
            return Answer(200, xml.encode())
        if segments[:1] == ["primary"] and len(segments) == 3 and request.method == "GET":
            owner, local_id = segments[1], segments[2]
            with self.lock:
                ark = self.local_ids.get((owner, local_id))
            return self._local_state(owner, local_id, ark, form)
        if segments[:1] == ["primary"] and len(segments) == 4 and request.method == "POST":
            ark, owner, local_ids = segments[1], segments[2], segments[3]
            if not ark.startswith("ark:/"):
                return exception_document("REQUEST_INVALID", f"objectID not valid: {ark}")
            with self.lock:
                for local_id in local_ids.split(";"):
                    if local_id.strip():
                        self.local_ids[(owner, local_id.strip())] = ark
            return self._local_state(owner, local_ids, ark, form)
        return exception_document("REQUEST_INVALID", f"no such resource: {request.path}")

    def _local_state(self, owner: str, local_id: str, ark: str | None, form: str) -> Answer:
        state: dict[str, Any] = {
            "xmlns:invloc": "http://uc3.cdlib.org/ontology/mrt/inventory/localcontainer",
            "invloc:ownerID": owner,
            "invloc:localIDs": local_id,
            "invloc:exists": ark is not None,
            "invloc:countLocalIDs": 1 if ark else 0,
        }
        if ark:
            state["invloc:primaryIdentifier"] = ark
            state["invloc:local"] = {
                "invloc:primaryLocalState": {
                    "invloc:primaryID": ark,
                    "invloc:ownerID": owner,
                    "invloc:localID": local_id,
                }
            }
        if form == "json":
            body = json.dumps({"invloc:localContainerState": state}).encode()
            return Answer(200, body, "application/json")
        items = "".join(
            f"<{k}>{escape(str(v).lower() if isinstance(v, bool) else str(v))}</{k}>"
            for k, v in state.items()
            if not k.startswith("xmlns") and not isinstance(v, dict)
        )
        return Answer(
            200, f"<invloc:localContainerState>{items}</invloc:localContainerState>".encode()
        )


class EzidStandIn(StandIn):
    """EZID's API as Merritt's ingest uses it: ``POST /shoulder/{shoulder}`` mints,
    ``POST /id/{identifier}`` updates (``error: bad request - no such identifier`` when EZID
    does not hold it), ``PUT /id/{identifier}`` creates (``update_if_exists=yes``: or updates
    one that exists; without it an existing one is refused); ANVL ``text/plain`` both ways,
    HTTP Basic auth."""

    name = "EZID"

    def __init__(self, user: str, password: str, **options: Any) -> None:
        super().__init__(**options)
        self.credentials = (user, password)
        self.counter = 0
        self.identifiers: dict[str, dict[str, str]] = {}

    @staticmethod
    def parse_anvl(body: bytes) -> dict[str, str]:
        metadata: dict[str, str] = {}
        for line in body.decode("utf-8").splitlines():
            if not line.strip():
                continue
            key, _, value = line.partition(":")
            metadata[unquote(key.strip())] = unquote(value.strip())
        return metadata

    def _text(self, status: int, line: str) -> Answer:
        return Answer(status, (line + "\n").encode(), "text/plain; charset=UTF-8")

    def unavailable(self) -> Answer:
        return self._text(503, "error: service unavailable")

    def handle(self, request: Request) -> Answer:
        if request.method == "GET" and request.path == "/status":
            # EZID's API documents a server status check that needs no credentials.
            return self._text(200, "success: EZID is up")
        auth = request.headers.get("Authorization", "")
        expected = "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()
        if auth != expected:
            return self._text(401, "error: unauthorized")
        if request.method not in ("POST", "PUT"):
            return self._text(405, "error: method not allowed")
        if not request.content_type.startswith("text/plain"):
            return self._text(400, "error: bad request - unsupported content type")
        try:
            metadata = self.parse_anvl(request.body)
        except UnicodeDecodeError:
            return self._text(400, "error: bad request - ANVL parse error (not UTF-8)")
        path = unquote(request.path)
        if request.method == "PUT":
            if not path.startswith("/id/"):
                return self._text(405, "error: method not allowed")
            identifier = path.removeprefix("/id/")
            with self.lock:
                exists = identifier in self.identifiers
                if exists and request.query.get("update_if_exists") != "yes":
                    return self._text(400, "error: bad request - identifier already exists")
                self.identifiers.setdefault(identifier, {}).update(metadata)
            return self._text(200 if exists else 201, f"success: {identifier}")
        if path.startswith("/shoulder/"):
            shoulder = path.removeprefix("/shoulder/")
            if not shoulder.startswith("ark:/"):
                return self._text(400, f"error: bad request - unrecognized shoulder: {shoulder}")
            with self.lock:
                self.counter += 1
                identifier = f"{shoulder}{self.counter:04d}"
                self.identifiers[identifier] = dict(metadata)
            return self._text(201, f"success: {identifier}")
        if path.startswith("/id/"):
            identifier = path.removeprefix("/id/")
            with self.lock:
                if identifier not in self.identifiers:
                    return self._text(400, "error: bad request - no such identifier")
                self.identifiers[identifier].update(metadata)
            return self._text(200, f"success: {identifier}")
        return self._text(404, "error: not found")


class CallbackReceiver(StandIn):
    """A depositor's endpoint behind a profile's CallbackURL: takes ``POST .../mc/{jobID}``
    with a JSON job state and answers ``status`` (200 unless told)."""

    name = "callback receiver"

    def __init__(self, status: int = 200) -> None:
        super().__init__()
        self.status = status
        self.received: dict[str, Any] = {}

    def handle(self, request: Request) -> Answer:
        if request.method != "POST" or "/mc/" not in request.path:
            return Answer(404, b"not found", "text/plain")
        job_id = unquote_plus(request.path.rsplit("/mc/", 1)[1])
        try:
            state = json.loads(request.body)
        except ValueError:
            return Answer(400, b"not JSON", "text/plain")
        with self.lock:
            self.received[job_id] = state
        return Answer(self.status, b"thanks", "text/plain")


@contextmanager
def running(stand_in: StandIn) -> Iterator[Any]:
    stand_in.start()
    try:
        yield stand_in
    finally:
        stand_in.stop()


def unused_url() -> str:
    """A loopback URL nothing listens on (the port was free a moment ago)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


BATCH_NS = "http://uc3.cdlib.org/ontology/mrt/ingest/batch"


# The form fields Merritt's ingest door reads (mrt-ingest JerseyBase.getFormData, ccc78fe2),
# and ``retainTargetURL``, which the current one reads too (Merritt's UI forwards it to
# ``poster/submit``; ``IngestRequest.setRetainTargetURL``). Any other field is logged as not
# supported and ignored. docs/merritt-poster.md has the sources.
INGEST_FIELDS = frozenset(
    {
        "submitter",
        "object",
        "profile",
        "filename",
        "type",
        "size",
        "digestType",
        "digestValue",
        "creator",
        "title",
        "date",
        "localIdentifier",
        "primaryIdentifier",
        "note",
        "erc",
        "notification",
        "responseForm",
        "notificationFormat",
        "DataCite.resourceType",
        "synchronousMode",
        "retainTargetURL",
        *(
            f"DC.{name}"
            for name in (
                "contributor",
                "coverage",
                "creator",
                "date",
                "description",
                "format",
                "identifier",
                "language",
                "publisher",
                "relation",
                "rights",
                "source",
                "subject",
                "title",
                "type",
            )
        ),
    }
)
# Ingest's form ``type`` names (JerseyBase maps the hyphenated ones onto PackageTypeEnum).
INGEST_TYPES = {
    "file": "file",
    "container": "container",
    "manifest": "manifest",
    "batchManifest": "batchManifest",
    "batchManifestFile": "batchManifestFile",
    "batchManifestContainer": "batchManifestContainer",
    "object-manifest": "manifest",
    "single-file-batch-manifest": "batchManifestFile",
    "container-batch-manifest": "batchManifestContainer",
    "batch-manifest": "batchManifest",
}
JAVA_INT_MAX = 2**31 - 1


def java_url_file(url: str) -> str:
    """``java.net.URL.getFile()``: the path and the query, as written in the URL."""
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


@dataclass
class PosterUpload:
    """One ``POST /poster/submit`` as Merritt's ingest read it: its form fields, the uploaded
    file's name and bytes, the batch ID ingest minted for it, and the fields it ignored."""

    batch_id: str
    fields: dict[str, str]
    filename: str
    content: bytes
    ignored: list[str] = field(default_factory=list)

    def stored_names(self) -> list[str]:
        """The names ingest gives the files a manifest upload lists: a row's ``fileName``, else
        one made of its URL, as each of ingest's handlers makes it. An object manifest
        (``manifest``): ``download/HandlerRetrieve`` downloads to ``url.getFile()`` without its
        leading ``/`` (folders and query included). A batch manifest:
        ``queue/HandlerDisaggregate.unpack`` takes ``url.getFile()`` with every ``/`` removed."""
        kind = INGEST_TYPES.get(self.fields.get("type", ""), "")
        if kind not in ("manifest", "batchManifest", "batchManifestFile", "batchManifestContainer"):
            return [self.filename]
        names = []
        for row in parse_checkm(self.content).rows:
            if row.filename:
                names.append(row.filename)
            elif kind == "manifest":
                names.append(java_url_file(row.url).removeprefix("/"))
            else:
                names.append(java_url_file(row.url).replace("/", ""))
        return names


class IngestPosterStandIn(StandIn):
    """Merritt's ingest service's depositor door (docs/merritt-poster.md, mrt-ingest
    ``JerseyBase``): a multipart ``POST <context>/poster/submit`` (or ``update``) with one
    uploaded file and the form fields. As ingest's ``getFormData``, it keeps the fields of
    ``INGEST_FIELDS`` and ignores any other (listed in the upload's ``ignored``), refuses a
    ``size`` that is not a Java ``int`` (``new Integer(size)``: ``INVALID_OR_MISSING_PARM``) and
    names the upload by its ``filename`` field, else the part's own file name. It mints
    ``bid-<uuid>``, hands the upload to ``accept`` (which writes the batch into the queue, as
    ingest does before it answers) and answers the batch state in the ``responseForm`` asked
    for (XML by default), ``batchStatus`` ``QUEUED``; a missing profile, submitter or file is
    refused with ``REQUEST_INVALID``. ``trickle`` (seconds a byte) makes it send the status
    line and headers of its answers that slowly, once the batch is written."""

    name = "ingest"

    def __init__(self, accept: Callable[[PosterUpload], None], context: str = "/ingest") -> None:
        super().__init__()
        self.accept = accept
        self.context = context
        self.uploads: list[PosterUpload] = []
        self.trickle = 0.0

    @staticmethod
    def parse(request: Request) -> tuple[dict[str, str], str, bytes] | None:
        head = f"Content-Type: {request.headers.get('Content-Type', '')}\r\n\r\n".encode()
        message = BytesParser(policy=HTTP).parsebytes(head + request.body)
        if not message.is_multipart():
            return None
        fields: dict[str, str] = {}
        filename, content = "", b""
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True)
            raw = payload if isinstance(payload, bytes) else b""
            if part.get_filename():
                filename, content = str(part.get_filename()), raw
            elif name:
                fields[str(name)] = raw.decode("utf-8")
        return fields, filename, content

    def handle(self, request: Request) -> Answer:
        verbs = (f"{self.context}/poster/submit", f"{self.context}/poster/update")
        if request.method != "POST" or request.path not in verbs:
            return exception_document("REQUESTED_ITEM_NOT_FOUND", f"no route {request.path}")
        parsed = self.parse(request)
        if parsed is None:
            return exception_document("REQUEST_INVALID", "not a multipart form")
        sent, filename, content = parsed
        fields = {k: v for k, v in sent.items() if k in INGEST_FIELDS}
        ignored = sorted(k for k in sent if k not in INGEST_FIELDS)
        form = fields.get("responseForm", "xml")
        size = fields.get("size")
        if size is not None and not (
            re.fullmatch(r"[+-]?[0-9]+", size) and abs(int(size)) <= JAVA_INT_MAX
        ):
            return exception_document(
                "INVALID_OR_MISSING_PARM",
                "JerseyBase: Could not process form field: size",
                form=form,
            )
        for needed in ("profile", "submitter"):
            if not fields.get(needed):
                return exception_document("REQUEST_INVALID", f"{needed} missing", form=form)
        if not filename:
            return exception_document("REQUEST_INVALID", "no file uploaded", form=form)
        filename = fields.get("filename") or filename
        upload = PosterUpload(f"bid-{uuid.uuid4()}", fields, filename, content, ignored)
        self.accept(upload)
        with self.lock:
            self.uploads.append(upload)
        state = {
            "batchID": upload.batch_id,
            "batchStatus": "QUEUED",
            "userAgent": fields["submitter"],
            "submissionDate": "2026-11-21T10:02:03-08:00",
            "jobStates": "",
        }
        if form == "json":
            body = {
                "bat:batchState": {
                    "xmlns:bat": BATCH_NS,
                    **{f"bat:{k}": v for k, v in state.items()},
                }
            }
            return Answer(200, json.dumps(body).encode(), "application/json", trickle=self.trickle)
        inner = "".join(f"<bat:{k}>{escape(v)}</bat:{k}>" for k, v in state.items())
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<bat:batchState xmlns:bat="{BATCH_NS}">{inner}</bat:batchState>'
        )
        return Answer(200, xml.encode(), trickle=self.trickle)
