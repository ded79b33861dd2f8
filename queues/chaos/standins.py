"""Stand-ins for Merritt's services on loopback ports, answering as the real ones are documented
to (docs/merritt-services.md): storage, inventory, EZID and a depositor's callback receiver
(ingest's poster door is ``poster_standin``, on the same ``StandIn``). The one set the project
has: ``manage.py chaosrun`` runs its storage, inventory and EZID against them (made to flap,
``flapping.Flapping``), and the tests import them.

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
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, unquote, unquote_plus, urlsplit
from xml.sax.saxutils import escape, quoteattr

import requests

from queues.chaos.flapping import RESET, SLOW, UNAVAILABLE, UNAVAILABLE_RETRY_AFTER, Flapping, reset
from queues.core.words import digits
from queues.steps.checkm import ADD_MANIFEST, MERRITT_PROFILES, ManifestError, parse_checkm
from queues.steps.objectmap import ObjectMapError, parse_object_map

EXC_NS = "http://uc3.cdlib.org/ontology/mrt/core/exc"
VERSION_NS = "http://uc3.cdlib.org/ontology/mrt/store/version"
OBJECT_NS = "http://uc3.cdlib.org/ontology/mrt/store/object"
FILE_NS = "http://uc3.cdlib.org/ontology/mrt/store/file"
NODE_NS = "http://uc3.cdlib.org/ontology/mrt/store/node"
# The #%profile URLs a manifest handed to storage's add must match (mrt-core2 ManifestRowAdd),
# as Checkm.handleHeaders matches them (checkm.merritt_profile_kind).
ADD_PROFILES = MERRITT_PROFILES[ADD_MANIFEST]
# The TException kinds these stand-ins use, with the HTTP status Merritt gives each
# (mrt-core2 core/.../utility/TExceptionEnum.java).
EXCEPTION_STATUS = {
    "REQUEST_INVALID": 400,
    "INVALID_OR_MISSING_PARM": 500,
    "REQUESTED_ITEM_NOT_FOUND": 404,
    "GENERAL_EXCEPTION": 500,
    "INVALID_DATA_FORMAT": 500,
    "FIXITY_CHECK_FAILS": 500,
    "EXTERNAL_SERVICE_UNAVAILABLE": 503,
}


class QuietServer(ThreadingHTTPServer):
    """A client killed or paused mid-request (as the run does all along) is no error here."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


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
    (its text), an add manifest (``#%profile`` ``.../store/manifest/mrt-add-manifest``, or
    another URL mrt-core2's ManifestRowAdd takes, matched as it matches them; any other profile
    is refused, as it refuses it). Every file it lists is
    fetched and checked against its size and digest. Like Merritt's storage it makes a new
    version for EVERY add, identical content or not, and answers the version state in the form
    ``t`` names (``xhtml`` by default, read as XML here). The state documents answer the object
    (``obj:objectState``: its number of versions), a version (``ver:versionState``: its number
    of files and total size, links to its file states; version 0 is the current one) and a file
    (``fil:fileState``: its name, size and ``messageDigest`` as ``algorithm=value``), in XML
    or, with ``t=json``, JSON.

    Refusals, as mrt-store gives them (docs/merritt-services.md, "Refusals"): the object's
    state on a node it does not know is INVALID_OR_MISSING_PARM (500), any other call on one
    REQUESTED_ITEM_NOT_FOUND (404), as are unknown objects, versions and files; an add without
    a manifest is REQUEST_INVALID (400), one whose manifest URL answers 404
    REQUESTED_ITEM_NOT_FOUND, another status EXTERNAL_SERVICE_UNAVAILABLE (503), no connection
    GENERAL_EXCEPTION (500); a manifest it cannot read (a wrong profile) and a file it cannot
    fetch or whose size or digest differs are GENERAL_EXCEPTION (500).
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
            (segments[0] == "state" and 2 <= len(segments) <= 5)
            or (len(segments) == 3 and segments[0] in ("add", "manifest"))
            or (len(segments) == 5 and segments[0] == "content")
        )
        if not known:
            return exception_document("REQUEST_INVALID", f"no such resource: {request.path}")
        action, node_text = segments[:2]
        ark = segments[2] if len(segments) > 2 else ""
        node = digits(node_text)
        if node is None:
            return exception_document("REQUEST_INVALID", f"nodeID not numeric: {node_text}")
        if self.nodes is not None and node not in self.nodes:
            if action == "state" and len(segments) == 3:
                # JerseyBase.getObjectState (the one taking a list of nodes) turns the node's
                # REQUESTED_ITEM_NOT_FOUND into INVALID_OR_MISSING_PARM, a 500.
                return exception_document(
                    "INVALID_OR_MISSING_PARM",
                    f"Required node not found:{node}",
                    form=request.query.get("t", "xhtml"),
                )
            # JerseyBase.getNodeLogger, for every other call on one node.
            return exception_document(
                "REQUESTED_ITEM_NOT_FOUND",
                f"Node not found: {node}",
                form=_add_form(request) if action == "add" else request.query.get("t", "xhtml"),
            )
        if action == "manifest" and request.method == "GET":
            return self._manifest(node, ark)
        if action == "content" and request.method == "GET":
            return self._content(node, ark, segments[3], segments[4])
        if action == "state" and len(segments) == 2 and request.method == "GET":
            return _node_state(node, request.query.get("t", "xhtml"))
        if action == "state" and request.method == "GET":
            return self._state(node, ark, segments[3:], request.query.get("t", "xhtml"))
        if action == "add" and request.method == "POST":
            return self._add(request, node, ark)
        return exception_document("REQUEST_INVALID", f"{request.method} not supported here")

    def _add(self, request: Request, node: int, ark: str) -> Answer:
        if request.content_type == "application/x-www-form-urlencoded":
            form = request.form()
        elif request.content_type == "multipart/form-data":
            form = request.multipart()
        else:
            return Answer(415, b"Unsupported Media Type", "text/plain")
        response_form = _add_form(request)
        if not ark.startswith("ark:/"):
            return exception_document(
                "REQUEST_INVALID", f"objectID not valid: {ark}", form=response_form
            )
        manifest_url, manifest_text = form.get("url", ""), form.get("manifest", "")
        if not manifest_url and not manifest_text:
            return exception_document(
                "REQUEST_INVALID", "Neither manifest.txt nor url provided", form=response_form
            )
        if manifest_url and not manifest_text:
            # JerseyBase.getManifest reads the URL with mrt-core2's HttpGet/HTTPUtil, whose
            # exceptions it passes on: a 404 is REQUESTED_ITEM_NOT_FOUND, any other status
            # EXTERNAL_SERVICE_UNAVAILABLE, a failed connection GENERAL_EXCEPTION.
            fetched, refusal = _get_for_storage(manifest_url, response_form)
            if refusal is not None:
                return refusal
            manifest_text = fetched.decode("utf-8", "replace")
        try:
            manifest = parse_checkm(manifest_text)
            if manifest.kind != ADD_MANIFEST:
                # mrt-core2 Checkm.handleHeaders, for ManifestRowAdd's profiles.
                raise ManifestError(
                    "handleHeaders - manifestProfile does not match expected form - input:"
                    f"{manifest.profile} - allowed:{' - allowed:'.join(ADD_PROFILES)}"
                )
        except ManifestError as exc:
            # The reader's refusal is rethrown by Manifest.hasMoreElements as a runtime
            # INVALID_OR_MISSING_PARM, which ComponentContent.buildComponents turns into
            # GENERAL_EXCEPTION: storage answers a manifest it cannot read with a 500.
            return exception_document(
                "GENERAL_EXCEPTION",
                "Unable to build VersionContent.Exception:org.cdlib.mrt.utility."
                f"TRuntimeException$INVALID_OR_MISSING_PARM: {exc}",
                form=response_form,
            )
        rows = manifest.rows
        files = [
            StoredFile(r.filename, r.size or 0, r.hash_alg.lower(), r.hash_value.lower())
            for r in rows
        ]
        # Storage fetches every file the manifest lists and checks its size and digest against
        # the manifest's; a file that fails (after one more try) fails the whole add, with a
        # GENERAL_EXCEPTION that names neither the file nor why (AddVersionContentAbs).
        if not all(_file_as_listed(r.url, r.size, r.hash_alg, r.hash_value) for r in rows):
            with self.lock:
                stored = self.objects.get((node, ark))
                next_version = (len(stored.versions) if stored else 0) + 1
            return exception_document(
                "GENERAL_EXCEPTION",
                f"Object Fails: - objectID={ark} - version={next_version}",
                form=response_form,
            )
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
                if stored and 0 < (digits(version) or 0) <= len(stored.files)
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
        asked = digits(below[0])
        number = -1 if asked is None else asked
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


def _node_state(node: int, form: str) -> Answer:
    """``GET state/{node}``: the node's ``NodeState`` (``nod:nodeState``, docs/merritt-services.md,
    "The breakers' probes"), a few of its fields."""
    fields = {
        "nod:identifier": node,
        "nod:name": f"stand-in node {node}",
        "nod:description": "the storage stand-in's node",
        "nod:verifyOnRead": True,
        "nod:verifyOnWrite": True,
    }
    return _state_document("nod:nodeState", NODE_NS, fields, form)


def _add_form(request: Request) -> str:
    """The response form an add asks for: ``t`` in a url-encoded form, ``responseForm`` in a
    multipart one (``xhtml`` by default, which the exception document is given as XML)."""
    if request.content_type == "multipart/form-data":
        return request.multipart().get("responseForm", "xhtml")
    return request.form().get("t", "xhtml")


def _get_for_storage(url: str, form: str) -> tuple[bytes, Answer | None]:
    """``url``'s bytes as storage reads a manifest (mrt-core2 HTTPUtil.getObjectEntity), or the
    exception document storage answers when it cannot."""
    if not url.startswith(("http://", "https://")):
        invalid = f"Manifest URL is invalid:{url}"
        return b"", exception_document("REQUEST_INVALID", invalid, form=form)
    return _get_as_merritt(url, form)


def _get_as_merritt(url: str, form: str) -> tuple[bytes, Answer | None]:
    """``url``'s bytes as Merritt's services read a URL (mrt-core2 ``FileUtil.url2File`` ->
    ``HttpGet`` -> ``HTTPUtil.getObjectEntity``), or the exception document of what they throw:
    a 404 is REQUESTED_ITEM_NOT_FOUND, any other status EXTERNAL_SERVICE_UNAVAILABLE, a
    connection that fails GENERAL_EXCEPTION."""
    try:
        fetched = requests.get(url, timeout=10)
    except requests.RequestException as exc:
        return b"", exception_document(
            "GENERAL_EXCEPTION", f"HTTPUTIL: getObject- Exception:{exc}", form=form
        )
    if 200 <= fetched.status_code < 300:
        return fetched.content, None
    kind = (
        "REQUESTED_ITEM_NOT_FOUND"
        if fetched.status_code == 404
        else ("EXTERNAL_SERVICE_UNAVAILABLE")
    )
    error = (
        "HTTPUTIL: getObject- Error during HttpClient processing - timeout:3600000"
        f" - URL:{url} - responseCode:{fetched.status_code}"
    )
    return b"", exception_document(kind, error, form=form)


def _file_as_listed(url: str, size: int | None, algorithm: str, digest: str) -> bool:
    """Whether the file at ``url`` can be fetched and has the size and digest its manifest row
    gives (each compared only when given; an algorithm hashlib does not know is not checked)."""
    try:
        fetched = requests.get(url, timeout=10)
    except requests.RequestException:
        return False
    if not 200 <= fetched.status_code < 300:
        return False
    if size is not None and size != len(fetched.content):
        return False
    name = algorithm.lower().replace("-", "")
    if digest and name in hashlib.algorithms_available:
        return hashlib.new(name, fetched.content).hexdigest() == digest.lower()
    return True


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
    # JerseyBase.getStateResponse answers the form's MIME type (FormatType: xml is text/xml).
    return Answer(200, xml.encode(), "text/xml")


def quote_ark(ark: str) -> str:
    from urllib.parse import quote

    return quote(ark, safe="")


INV_PROCESS_NS = "http://uc3.cdlib.org/ontology/mrt/inv/process"
INV_SERVICE_NS = "http://uc3.cdlib.org/ontology/mrt/inv/service"


def _process_state(url: str, form: str = "xml") -> Answer:
    """The add's 200: ``InvProcessState`` as mrt-core2's formatter writes it (root
    ``invp:invProcessState`` in the ``inv/process`` namespace; docs/merritt-services.md,
    "Recording a version"), no outcome among its fields."""
    fields = {
        "processDateTime": datetime.now(UTC).isoformat(timespec="seconds"),
        "processUrl": url,
        "operation": "add",
    }
    if form == "json":
        inner = {"xmlns:invp": INV_PROCESS_NS} | {f"invp:{k}": v for k, v in fields.items()}
        return Answer(200, json.dumps({"invp:invProcessState": inner}).encode(), "application/json")
    leaves = "".join(f"\n    <invp:{k}>{escape(v)}</invp:{k}>" for k, v in fields.items())
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<invp:invProcessState xmlns:invp='{INV_PROCESS_NS}'>{leaves}\n</invp:invProcessState>"
    )
    return Answer(200, xml.encode(), "text/xml")


class InventoryStandIn(StandIn):
    """mrt-inventory's entry points ingest uses: ``POST add`` (multipart form data only:
    ``url``, ``responseForm``), ``GET primary/{owner}/{local id}?t=json`` and
    ``POST primary/{ark}/{owner}/{local ids}``, answering as mrt-inventory does
    (docs/merritt-services.md, "Inventory's refusals").

    An add takes the manifest URL apart as ``SaveObject.extractParts`` does, fetches the object's
    manifest from the storage it names (``{base}/manifest/{node}/{ark}``) and reads it; what it
    keeps is the ARK's node and version count. ``database_down`` makes every call answer as
    inventory does without its database (a 500 ``GENERAL_EXCEPTION``), after the add's fetch.

    ``object_lock``: the add takes the object's inventory lock once, as mrt-inventory's
    ``SaveObject.process`` does in some versions (docs/merritt-services.md, "The object lock"):
    called with the ARK, True when it took (and let go of) ``/locks/inventory/{ark'}``; False,
    the node being held, makes the add answer its 200 without recording anything.
    """

    name = "inventory"

    def __init__(self, *, object_lock: Callable[[str], bool] | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.object_lock = object_lock
        self.skipped: list[str] = []  # adds answered 200 unrecorded: the object lock was held
        self.added: list[str] = []
        self.local_ids: dict[tuple[str, str], str] = {}  # (owner, local id) -> ark
        self.objects: dict[str, tuple[int, int]] = {}  # ark -> (node, versions recorded)
        self.database_down = False

    def handle(self, request: Request) -> Answer:
        segments = _segments(request.path)
        form = request.query.get("t", "xhtml")
        if segments == ["state"] and request.method == "GET":
            # JerseyInv's ``GET state``: the service's InvServiceState (invsv:invServiceState,
            # docs/merritt-services.md, "The breakers' probes"), the breaker's probe.
            fields = {
                "invsv:name": "inventory",
                "invsv:identifier": "inv",
                "invsv:description": "the inventory stand-in",
                "invsv:baseURI": self.url,
                "invsv:dbStatus": "running",
                "invsv:zookeeperStatus": "running",
                "invsv:systemStatus": "running",
            }
            return _state_document("invsv:invServiceState", INV_SERVICE_NS, fields, form)
        if segments == ["add"] and request.method == "POST":
            if request.content_type != "multipart/form-data":
                # The add resource consumes multipart/form-data only.
                return Answer(415, b"Unsupported Media Type", "text/plain")
            fields = request.multipart()
            return self._add(fields.get("url", ""), fields.get("responseForm", "xhtml"))
        if segments[:1] == ["primary"] and len(segments) == 3 and request.method == "GET":
            owner, local_id = segments[1], segments[2]
            if self.database_down:
                return _without_database(form)
            with self.lock:
                ark = self.local_ids.get((owner, local_id))
            return self._local_state(owner, local_id, ark, form, exists=ark is not None)
        if segments[:1] == ["primary"] and len(segments) == 4 and request.method == "POST":
            return self._add_primary(segments[1], segments[2], segments[3], form)
        return exception_document("REQUEST_INVALID", f"no such resource: {request.path}")

    def _add(self, url: str, form: str) -> Answer:
        """``InvService.add``: the manifest URL's parts, the object's manifest from storage,
        then the checks against what is recorded (``SaveObject``)."""
        parts = _manifest_url_parts(url, form)
        if isinstance(parts, Answer):
            return parts
        fetch_url, node, ark = parts
        data, refusal = _get_as_merritt(fetch_url, form)
        if refusal is not None:
            return refusal
        try:
            current = parse_object_map(data).current
        except ObjectMapError as exc:
            # ManifestSAX.process wraps the parser's exception in a TException: a 500
            # GENERAL_EXCEPTION (its text is the Java parser's, not reproduced here).
            return exception_document("GENERAL_EXCEPTION", f"ManifestSAX: {exc}", form=form)
        if self.database_down:
            return _without_database(form)
        if self.object_lock is not None and not self.object_lock(ark):
            # SaveObject.process: "item already locked", returns as if done.
            with self.lock:
                self.skipped.append(url)
            return _process_state(url, form)
        with self.lock:
            recorded_node, recorded = self.objects.get(ark, (node, 0))
            if recorded > current:
                # SaveObject.checkVersion
                return exception_document(
                    "REQUEST_INVALID",
                    "SaveObject: -checkVersion - db version count exceeds passed map version:"
                    f" - objectID:{ark} - map current:{current} - db  current:{recorded}",
                    form=form,
                )
            if recorded < current and recorded_node != node:
                # SaveObject.validateNode
                return exception_document(
                    "REQUEST_INVALID",
                    "SaveObject: Node exists for object but is different from this manifest"
                    f" - input node number={node} - existing nodes={recorded_node}",
                    form=form,
                )
            self.objects[ark] = (recorded_node, current)
            self.added.append(url)
        return _process_state(url, form)

    def _add_primary(self, ark: str, owner: str, local_ids: str, form: str) -> Answer:
        """``LocalMap.addLocal``: any text is taken as the ARK (mrt-core2 ``Identifier`` checks
        only that it is not empty); a local id another ARK holds is refused."""
        if self.database_down:
            return _without_database(form)
        ids = [i.strip() for i in local_ids.split(";") if i.strip()]
        with self.lock:
            held = {self.local_ids[(owner, i)] for i in ids if (owner, i) in self.local_ids}
            if held and held != {ark}:
                return exception_document(
                    "REQUEST_INVALID",
                    "LocalMap:  objectID already exists and does not match add objectID"
                    f"  - existing objectID={sorted(held)[0]}  - new objectID={ark}"
                    "  - connection=false",
                    form=form,
                )
            for local_id in ids:
                self.local_ids[(owner, local_id)] = ark
        # A new record answers exists false, a repeat of the same ARK exists true.
        return self._local_state(owner, local_ids, ark, form, exists=bool(held))

    def _local_state(
        self, owner: str, local_id: str, ark: str | None, form: str, *, exists: bool
    ) -> Answer:
        state: dict[str, Any] = {
            "xmlns:invloc": "http://uc3.cdlib.org/ontology/mrt/inventory/localcontainer",
            "invloc:ownerID": owner,
            "invloc:localIDs": local_id,
            "invloc:exists": exists,
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


# The URL schemes java.net.URL reads without a handler of its own.
_JAVA_URL_SCHEMES = ("http", "https", "file", "ftp", "jar")


def _manifest_url_parts(url: str, form: str) -> tuple[str, int, str] | Answer:
    """Where mrt-inventory fetches the object's manifest for an add of ``url``, its node and
    ARK (``SaveObject.extractParts``, ``InvActionAbs.getVersionMap``), or its refusal."""

    def refused(kind: str, error: str) -> Answer:
        return exception_document(kind, error, form=form)

    if not url.strip():
        return refused("INVALID_OR_MISSING_PARM", "SaveObject: setParts - ingestURL missing")
    parsed = urlsplit(url)
    if parsed.scheme.lower() not in _JAVA_URL_SCHEMES:
        return refused("INVALID_OR_MISSING_PARM", f"SaveObject: processItem - URL invalid:{url}")
    parts = parsed.path.split("/")
    while parts and not parts[-1]:
        parts.pop()  # Java's String.split drops the trailing empty strings
    invalid = f"SaveObject: processItem - URL format invalid:{url}"
    if len(parts) < 4 or "manifest" not in parts:
        return refused("INVALID_OR_MISSING_PARM", invalid)
    at = parts.index("manifest")
    base = "/".join(p for p in parts[:at] if p)
    if len(parts) < at + 3:
        # The node or the ARK is past the path's end: Java's index error, a GENERAL_EXCEPTION.
        return refused("GENERAL_EXCEPTION", f"java.lang.ArrayIndexOutOfBoundsException: {at + 2}")
    node = digits(parts[at + 1])
    if node is None:
        return refused(
            "GENERAL_EXCEPTION",
            f'java.lang.NumberFormatException: For input string: "{parts[at + 1]}"',
        )
    ark = unquote_plus(parts[at + 2])
    if node < 1:
        return refused("INVALID_OR_MISSING_PARM", "InvActionAbs: getVersionMap - node missing")
    # Java's URL gives -1 for a port the URL does not write; what inventory then fetches is not
    # established (docs/merritt-services.md): the scheme's own port is used here.
    where = f"{parsed.scheme}://{parsed.netloc.rsplit('@', 1)[-1]}"
    fetch = f"{where}/{base + '/' if base else ''}manifest/{node}/{quote_ark(ark)}"
    return fetch, node, ark


def _without_database(form: str) -> Answer:
    """What mrt-inventory answers without its database: ``DPRFileDB.getSingleConnection``
    gives no connection, and the first use of it is a NullPointerException that the action
    wraps in a TException (a 500 GENERAL_EXCEPTION)."""
    return exception_document("GENERAL_EXCEPTION", "java.lang.NullPointerException", form=form)


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
        if request.method == "GET" and request.path == "/login":
            # EZID's API: a one-time login with HTTP Basic answers a session cookie.
            return Answer(
                200,
                b"success: session cookie returned\n",
                "text/plain; charset=UTF-8",
                {"Set-Cookie": "sessionid=standin; Path=/"},
            )
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
    with a job state and answers ``status`` (200 unless told). ``received`` keeps a JSON
    state parsed, any other (XML, ANVL) as its text."""

    name = "callback receiver"

    def __init__(self, status: int = 200) -> None:
        super().__init__()
        self.status = status
        self.received: dict[str, Any] = {}

    def handle(self, request: Request) -> Answer:
        if request.method != "POST" or "/mc/" not in request.path:
            return Answer(404, b"not found", "text/plain")
        job_id = unquote_plus(request.path.rsplit("/mc/", 1)[1])
        state: Any
        try:
            state = json.loads(request.body)
        except ValueError:
            state = request.body.decode("utf-8", "replace")
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

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
