"""Submissions made through the console, sent to Merritt's ingest service when it owns intake.

Beside Merritt with ``MRT_BATCH_INTAKE=merritt`` (queues/daemons/registry.py) the console writes
no Pending batch into the shared queue: Merritt's ingest consumers would take it and fail it,
since they look for every batch on their own disk (docs/merritt-ownership.md). A submission goes
instead through ingest's own depositor door, ``POST <MRT_INGEST_URL>/poster/submit`` (``update``
for a new version, as the console's ``/poster/update`` door marks it; docs/merritt-poster.md),
and Merritt's ingest writes the batch itself. Every door of ours (the form, the API, ``/poster/``
and ``manage.py submitbatch``) comes here through ``services.batch_submit_outcome``.

That door takes an uploaded file, never a URL. So a payload the console was given by URL is
handed over as a checkm manifest that names the URL, and Merritt's ingest fetches it as it does
for every manifest its depositors upload:

* ``file``: an object manifest (ingest type ``manifest``) of that one file;
* ``container``: a container batch manifest (``batchManifestContainer``) of that one container,
  carrying the object's identifiers and ERC in its columns;
* ``object-manifest``: a batch manifest (``batchManifest``) listing that object manifest;
* a batch manifest by URL is read here (under the depositor fetch policy, at most
  ``MAX_MANIFEST_BYTES``, within the exchange's one deadline) and uploaded as it is: a batch
  manifest cannot list another;
* a ``file://`` payload (an upload kept by the console's own ``/poster/`` door) is uploaded,
  streamed from its file.

A depositor's manifest uploaded as it is (a batch manifest, or an object manifest uploaded) is
first read as Merritt's ingest reads it (``_check_manifest``): one whose ``#%fields`` puts the
columns ingest reads by position elsewhere, that does not end with ``#%eof``, that has ``#%``
lines without a ``#%profile`` before its first row or between its rows, or a batch manifest
with no ``#%profile``, is refused, as the console's own intake refuses it (an uploaded file
larger than ``MAX_MANIFEST_BYTES`` is judged by its headers alone).

The row of a manifest written here always names the file (``fileName``): the depositor's name,
else the URL's last part, the name the console's own intake gives it. Left empty, ingest would
make one of the URL itself, differently in each handler (docs/merritt-poster.md).

The other fields go as ingest's form fields (``profile``, ``submitter``, ``type``, ``title``,
``creator``, ``date``, ``localIdentifier``, ``primaryIdentifier``, ``erc``, ``retainTargetURL``,
``note``, ``notification``, ``notificationFormat``, ``DataCite.resourceType``, ``DC.*``). What
describes the payload itself (``filename``, ``size``, ``digestType``/``digestValue``) goes as a
form field when the upload is the payload, and in the manifest row when the upload is a manifest
naming it. Ingest answers its batch state (``bat:batchID`` = ``bid-<uuid>``, ``bat:batchStatus``
``QUEUED``), or its exception document with the HTTP status of the refusal.

The exchange with ingest goes through ``netpolicy`` like every other outside request: one
deadline (``MRT_INGEST_DEADLINE``) for all of it, reading a manifest by URL included, enforced by
its watchdog however slowly ingest answers; no redirect to another host is followed (the
submission's body would go there); the answer is read up to ``MAX_ANSWER_BYTES``.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from urllib3.fields import RequestField

from queues.core.deployment import (
    BESIDE_MERRITT,
    CONSOLE_INTAKE,
    INTAKES,
    MERRITT_INTAKE,
    MODES,
    STANDALONE,
)
from queues.core.outside_text import url_shown
from queues.core.states import DomainError
from queues.steps import checkm
from queues.steps.erc import DC_NAMES
from queues.steps.fetch import DownloadError, local_path
from queues.steps.merritt import canonical_type, merritt_digest_type, merritt_type
from queues.steps.merritt_wire import exception_kind, merritt_error_text, state_fields
from queues.steps.netpolicy import (
    BASE_HEADERS,
    FetchPolicy,
    FetchRefused,
    TooSlow,
    TransferFailed,
    short_error,
)
from queues.steps.submission import BATCH_TYPES, filename_from_url, size_number

# Ingest's door for a new object, and for a new version of one (JerseyPost ``submit``/``update``).
POSTER_PATH = "/poster/submit"
POSTER_UPDATE_PATH = "/poster/update"
MAX_MANIFEST_BYTES = 16 * 1024**2
# Ingest's batch state lists the batch's jobs once it has made them (JerseyBase.submitPost waits
# up to 30 s for that): a batch of many jobs answers a long document, never an endless one.
MAX_ANSWER_BYTES = 16 * 1024**2
# The console's own keys, never sent as ingest fields (the payload travels as the upload).
_NOT_FIELDS = frozenset({"payload_url", "submission_mode", "update", "digest", "submitted"})
# Merritt's submission keys the console's /poster/ door keeps -> ingest's form field names
# (``size``, a number, is sent with the payload it describes: ``form_fields``, ``_row``).
_MERRITT_FIELDS: dict[str, str] = {
    "erc": "erc",
    "retainTargetURL": "retainTargetURL",
    "note": "note",
    "notification": "notification",
    "notificationFormat": "notificationFormat",
    "DataCiteResourceType": "DataCite.resourceType",
    **{f"DC{name}": f"DC.{name}" for name in DC_NAMES},
}


class DeploymentError(ValueError):
    """A deployment setting that cannot work, or a daemon this deployment does not serve."""


def deployment_mode() -> str:
    """MRT_DEPLOYMENT: ``standalone`` or ``beside-merritt``."""
    mode = str(settings.MRT_DEPLOYMENT or STANDALONE).strip().lower().replace("_", "-")
    if mode not in MODES:
        raise DeploymentError(f"MRT_DEPLOYMENT must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def batch_intake() -> str:
    """Who takes new batches through ingest: ``merritt`` or ``console`` (MRT_BATCH_INTAKE,
    else ``merritt`` beside Merritt and ``console`` standalone)."""
    mode = deployment_mode()
    value = str(getattr(settings, "MRT_BATCH_INTAKE", "") or "").strip().lower()
    if not value:
        return MERRITT_INTAKE if mode == BESIDE_MERRITT else CONSOLE_INTAKE
    if value not in INTAKES:
        raise DeploymentError(
            f"MRT_BATCH_INTAKE must be one of {', '.join(INTAKES)} (or empty for the "
            f"deployment's default), got {value!r}"
        )
    if value == MERRITT_INTAKE and mode != BESIDE_MERRITT:
        raise DeploymentError(
            "MRT_BATCH_INTAKE=merritt needs MRT_DEPLOYMENT=beside-merritt: a standalone "
            "console has no Merritt ingest service to send batches to"
        )
    return value


class IngestRefused(ValueError):
    """Merritt's ingest refused the submission (or it could not be sent as it is); the message
    is the reason. ``status`` and ``kind`` are ingest's HTTP status and exception name when it
    answered one, for a door that answers the depositor as ingest would."""

    def __init__(self, message: str, *, status: int | None = None, kind: str | None = None):
        super().__init__(message)
        self.status = status
        self.kind = kind


class IngestUnavailable(DomainError):
    """Merritt's ingest could not be reached or failed; nothing is known to be submitted.
    ``status`` and ``kind`` as for IngestRefused, when ingest answered a failure."""

    def __init__(self, message: str, *, status: int | None = None, kind: str | None = None):
        super().__init__(message)
        self.status = status
        self.kind = kind


@dataclass(frozen=True)
class IngestSubmission:
    """One submission as the console's forms clean it."""

    profile: str
    submitter: str
    payload_url: str
    submission_type: str = "file"
    title: str = ""
    creator: str = ""
    date: str = ""
    local_id: str = ""
    primary_id: str = ""
    digest_alg: str = ""
    digest_value: str = ""
    filename: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class IngestAnswer:
    """What ingest answered: its batch ID (``bid-<uuid>``), the batch status, every field, and
    the document itself (XML, as asked)."""

    batch_id: str
    status: str
    fields: dict[str, str]
    document: bytes = b""


def ingest_url() -> str:
    url = str(getattr(settings, "MRT_INGEST_URL", "") or "").strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise IngestUnavailable(
            "MRT_BATCH_INTAKE=merritt sends submissions to Merritt's ingest service: set "
            "MRT_INGEST_URL to its address (http://host:port/<context>)"
        )
    return url


def ingest_policy(deadline: float | None = None) -> FetchPolicy:
    """How the console talks to Merritt's ingest: any address (it is the operator's own
    service), one deadline for the whole exchange, no redirect to another host."""
    return FetchPolicy(
        restrict=False,
        max_redirects=settings.MRT_FETCH_MAX_REDIRECTS,
        cross_origin_redirects=False,
        timeout=settings.MRT_HTTP_TIMEOUT,
        deadline=deadline if deadline is not None else settings.MRT_INGEST_DEADLINE,
        headers={**BASE_HEADERS, "Accept": "text/xml"},
        # TLS trusts the operator's REQUESTS_CA_BUNDLE, as for every one of the system's own
        # requests (``FetchPolicy.trusted``): an ingest behind the site's own authority.
    )


def payload_name(sub: IngestSubmission) -> str:
    """The name the payload's file gets: the depositor's, else the URL's last part (what the
    console's own intake names it, and what ingest names an upload: the file's own name)."""
    return sub.filename or filename_from_url(sub.payload_url)


def payload_size(sub: IngestSubmission) -> int | None:
    """The payload's size in bytes the depositor gave (``size``, kept by ``/poster/``)."""
    return size_number(sub.extra.get("size"))


def _row(sub: IngestSubmission, url: str) -> dict[str, object]:
    return {
        "url": url,
        "hash_alg": sub.digest_alg or None,
        "hash_value": sub.digest_value or None,
        "size": payload_size(sub),
        "filename": payload_name(sub),
        "primary_id": sub.primary_id or None,
        "local_id": sub.local_id or None,
        "creator": sub.creator or None,
        "title": sub.title or None,
        "date": sub.date or None,
    }


def _manifest_for(sub: IngestSubmission, kind: str) -> bytes:
    """A one-row checkm manifest naming the payload URL; IngestRefused when checkm cannot carry
    a value (a ``|`` or a line break in a title, say)."""
    try:
        return checkm.write_checkm([_row(sub, sub.payload_url)], kind=kind).encode("utf-8")
    except ValueError as exc:
        raise IngestRefused(str(exc)) from exc


def _read_manifest(url: str, policy: FetchPolicy, started: float) -> bytes:
    """A batch manifest given by URL, read under the depositor fetch policy within the
    exchange's deadline (``policy.deadline``, counted from ``started``)."""
    shown = url_shown(url)
    try:
        with policy.open(url, started=started) as response:
            if response.status != 200:
                raise IngestRefused(f"the manifest at {shown} answered HTTP {response.status}")
            data = bytearray()
            for chunk in response.chunks(64 * 1024):
                data += chunk
                if len(data) > MAX_MANIFEST_BYTES:
                    raise IngestRefused(
                        f"the manifest at {shown} is larger than {MAX_MANIFEST_BYTES} bytes"
                    )
            return bytes(data)
    except TooSlow as exc:
        raise IngestRefused(
            f"the manifest at {shown} could not be read in time: it {exc.reason}"
        ) from exc
    except (FetchRefused, TransferFailed, OSError) as exc:
        raise IngestRefused(
            f"the manifest at {shown} could not be read: {short_error(exc)}"
        ) from exc


@dataclass(frozen=True)
class Upload:
    """The file sent to ingest's door: ingest's type for it, its name, its content (bytes, or
    the file to stream), and whether it is the payload itself or a manifest written here."""

    ingest_type: str
    name: str
    content: bytes | Path
    is_payload: bool


def upload_for(
    sub: IngestSubmission,
    *,
    policy: FetchPolicy,
    file_roots: Sequence[Path],
    started: float | None = None,
) -> Upload:
    """What to upload for one submission (``policy`` reads a batch manifest by URL)."""
    started = time.monotonic() if started is None else started
    kind = canonical_type(sub.submission_type)
    if sub.payload_url.startswith("file://"):
        try:
            path = Path(local_path(sub.payload_url, file_roots=file_roots)).resolve()
        except DownloadError as exc:
            raise IngestRefused(f"payload URL refused: {exc.reason}") from exc
        if not path.is_file():
            raise IngestRefused(f"the payload {sub.payload_url} is not a file here")
        if kind in DEPOSITOR_MANIFESTS:
            data, whole = _manifest_text(path)
            _check_manifest(data, kind, sub.payload_url, whole=whole)
        return Upload(merritt_type(kind), sub.filename or path.name, path, True)
    if kind == "file":
        content = _manifest_for(sub, checkm.OBJECT_MANIFEST)
        return Upload("manifest", "payload.checkm", content, False)
    if kind == "container":
        content = _manifest_for(sub, checkm.CONTAINER_BATCH_MANIFEST)
        return Upload("batchManifestContainer", "payload.checkm", content, False)
    if kind == "object-manifest":
        content = _manifest_for(sub, checkm.BATCH_MANIFEST)
        return Upload("batchManifest", "payload.checkm", content, False)
    content = _read_manifest(sub.payload_url, policy, started)
    _check_manifest(content, kind, sub.payload_url)
    return Upload(merritt_type(kind), payload_name(sub), content, True)


# A depositor's manifest handed to ingest as it is, by the console's type: the checkm kinds
# Merritt's ingest reads it as (ManifestRowIngest; ManifestRowBatch, which takes any of the three
# batch profiles and makes its jobs by the one named).
_BATCH_KINDS = tuple(manifest_kind for manifest_kind, _row in BATCH_TYPES.values())
DEPOSITOR_MANIFESTS: dict[str, tuple[str, ...]] = {
    "object-manifest": (checkm.OBJECT_MANIFEST,),
    **dict.fromkeys(BATCH_TYPES, _BATCH_KINDS),
}


def _check_manifest(data: bytes, kind: str, url: str, *, whole: bool = True) -> None:
    """Refuse (IngestRefused, before anything is sent) a depositor's manifest Merritt's ingest
    would read otherwise than its headers say, or refuse: a ``#%fields`` line that puts the
    columns ingest reads by position elsewhere (``checkm.columns_problem``), a ``#%profile``
    Merritt's reader of ``kind`` refuses, no ``#%eof`` as its last line, ``#%`` lines without a
    ``#%profile`` between its rows or before its first row (``checkm.CheckmReader.check``),
    and a batch manifest without a ``#%profile`` at all: Merritt's ingest takes the type of each
    of its jobs from that profile (mrt-ingest ``HandlerDisaggregate.getObjectType``) and fails
    the batch without one. The console's own intake refuses them all. The rows' cells are not
    judged here. ``data``: the whole manifest, or, not ``whole``, its lines up to its first row
    at least (only its headers are judged)."""
    reader = checkm.CheckmReader(data, only=DEPOSITOR_MANIFESTS[kind], profile_if_headed=True)
    try:
        if whole:
            reader.check()
        else:
            reader.columns()
    except checkm.ManifestError as exc:
        raise IngestRefused(f"manifest {url_shown(url)}: {exc}") from exc
    if kind in BATCH_TYPES and reader.kind is None:
        raise IngestRefused(
            f"manifest {url_shown(url)}: a batch manifest without a #%profile: Merritt's ingest "
            "takes the type of each object of a batch from its manifest's #%profile (one of "
            f"{', '.join(_BATCH_KINDS)}) and fails the batch without one"
        )


def _manifest_text(path: Path) -> tuple[bytes, bool]:
    """An uploaded manifest, and True, when it is at most ``MAX_MANIFEST_BYTES``; else its
    lines up to its first row, and False."""
    if path.stat().st_size <= MAX_MANIFEST_BYTES:
        return path.read_bytes(), True
    head = bytearray()
    with path.open("rb") as stream:
        while len(head) <= MAX_MANIFEST_BYTES:
            line = stream.readline(MAX_MANIFEST_BYTES + 1 - len(head))
            head += line
            text = line.strip().removeprefix(b"\xef\xbb\xbf")
            if not line or (text and not text.startswith(b"#")):
                break
    return bytes(head), False


def form_fields(sub: IngestSubmission, upload: Upload) -> list[tuple[str, str]]:
    """Ingest's form fields for one submission, in JerseyBase's names."""
    fields = [
        ("profile", sub.profile),
        ("submitter", sub.submitter),
        ("type", upload.ingest_type),
        ("responseForm", "xml"),
    ]
    for name, value in (
        ("title", sub.title),
        ("creator", sub.creator),
        ("date", sub.date),
        ("localIdentifier", sub.local_id),
        ("primaryIdentifier", sub.primary_id),
    ):
        if value:
            fields.append((name, value))
    if upload.is_payload:
        # The upload is the payload: its name, size and digest are the form's. A manifest
        # written here carries them in its row instead (``_row``).
        fields.append(("filename", upload.name))
        size = payload_size(sub)
        if size is not None:
            fields.append(("size", str(size)))
        if sub.digest_alg and sub.digest_value:
            # Ingest compares the value with the lower-case hex it computes (HandlerVerify).
            fields += [
                ("digestType", merritt_digest_type(sub.digest_alg)),
                ("digestValue", sub.digest_value.lower()),
            ]
    for key, kept in sub.extra.items():
        field_name = _MERRITT_FIELDS.get(key)
        if field_name and key not in _NOT_FIELDS and isinstance(kept, str) and kept:
            fields.append((field_name, kept))
    return fields


@dataclass(frozen=True)
class MultipartBody:
    """A ``multipart/form-data`` body of form fields and one file, encoded as ``requests``
    encodes one (urllib3's ``RequestField``), read from its file as it is sent."""

    fields: tuple[tuple[str, str], ...]
    filename: str
    content: bytes | Path
    file_field: str = "file"
    boundary: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    def _head(self) -> bytes:
        out = bytearray()
        for name, value in self.fields:
            out += self._part(name) + value.encode("utf-8") + b"\r\n"
        out += self._part(self.file_field, self.filename)
        return bytes(out)

    def _part(self, name: str, filename: str | None = None) -> bytes:
        part = RequestField(name=name, data=b"", filename=filename)
        part.make_multipart(content_type="application/octet-stream" if filename else None)
        return f"--{self.boundary}\r\n".encode("latin-1") + part.render_headers().encode("utf-8")

    def _tail(self) -> bytes:
        return f"\r\n--{self.boundary}--\r\n".encode("latin-1")

    @property
    def length(self) -> int:
        size = len(self.content) if isinstance(self.content, bytes) else self.content.stat().st_size
        return len(self._head()) + size + len(self._tail())

    def chunks(self) -> Iterator[bytes]:
        yield self._head()
        if isinstance(self.content, bytes):
            yield self.content
        else:
            with self.content.open("rb") as handle:
                while chunk := handle.read(1024 * 1024):
                    yield chunk
        yield self._tail()


def submit_to_ingest(
    sub: IngestSubmission,
    *,
    policy: FetchPolicy,
    file_roots: Sequence[Path],
    deadline: float | None = None,
) -> IngestAnswer:
    """POST one submission to Merritt's ingest door; its answer, IngestRefused (4xx, with its
    reason, or a payload that cannot be sent) or IngestUnavailable (unreachable, 5xx, too
    slow, redirected elsewhere, or an answer that is not a batch state).

    ``policy`` and ``file_roots`` are the depositor's: what a payload URL may reach. The whole
    exchange, a batch manifest read by URL included, runs under one deadline
    (``MRT_INGEST_DEADLINE`` unless ``deadline`` says otherwise)."""
    started = time.monotonic()
    rules = ingest_policy(deadline)
    update = sub.extra.get("update") is True or sub.extra.get("submission_mode") == "update"
    url = ingest_url() + (POSTER_UPDATE_PATH if update else POSTER_PATH)
    shown = url_shown(url)  # MRT_INGEST_URL may carry a password
    limit = rules.deadline
    reading = policy
    if limit is not None and (policy.deadline is None or policy.deadline > limit):
        reading = dataclasses.replace(policy, deadline=limit)
    upload = upload_for(sub, policy=reading, file_roots=file_roots, started=started)
    body = MultipartBody(tuple(form_fields(sub, upload)), upload.name, upload.content)
    unsent = (
        "the submission may not have reached it: look for it in the queue before sending it again"
    )
    try:
        # One POST, never repeated: a second one would make a second batch.
        with rules.open(
            url, method="POST", started=started, body=body, content_type=body.content_type
        ) as response:
            status = response.status
            content = bytearray()
            for chunk in response.chunks(64 * 1024):
                content += chunk
                if len(content) > MAX_ANSWER_BYTES:
                    raise IngestUnavailable(
                        f"Merritt's ingest at {shown} answered more than {MAX_ANSWER_BYTES} bytes; "
                        + unsent
                    )
    except FetchRefused as exc:
        raise IngestUnavailable(
            f"Merritt's ingest at {shown} was not asked: {exc.reason}. Set MRT_INGEST_URL to the "
            "address ingest answers at itself"
        ) from exc
    except TooSlow as exc:
        raise IngestUnavailable(
            f"Merritt's ingest at {shown} did not answer in time (it {exc.reason}, "
            f"MRT_INGEST_DEADLINE); " + unsent
        ) from exc
    except (TransferFailed, OSError) as exc:
        raise IngestUnavailable(
            f"Merritt's ingest service at {shown} did not answer ({short_error(exc)}); " + unsent
        ) from exc
    if status != 200:
        reason = merritt_error_text(status, bytes(content))
        kind = exception_kind(bytes(content))
        if 400 <= status < 500:
            raise IngestRefused(
                f"Merritt's ingest refused the submission: {reason}", status=status, kind=kind
            )
        raise IngestUnavailable(f"Merritt's ingest failed: {reason}", status=status, kind=kind)
    parsed = state_fields(bytes(content))
    batch_id = parsed[1].get("batchID", "") if parsed else ""
    if parsed is None or parsed[0] != "batchState" or not batch_id:
        raise IngestUnavailable(
            f"Merritt's ingest at {shown} answered HTTP 200 without a batch state document"
        )
    return IngestAnswer(
        batch_id=batch_id,
        status=parsed[1].get("batchStatus", ""),
        fields=parsed[1],
        document=bytes(content),
    )
