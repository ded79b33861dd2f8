"""Submissions made through the console, sent to Merritt's ingest service when it owns intake.

Beside Merritt with ``MRT_BATCH_INTAKE=merritt`` (queues/daemons/registry.py) the console writes
no Pending batch into the shared queue: Merritt's ingest consumers would take it and fail it,
since they look for every batch on their own disk (docs/merritt-ownership.md). A submission goes
instead through ingest's own depositor door, ``POST <MRT_INGEST_URL>/poster/submit`` (``update``
for a new version, as the console's ``/poster/update`` door marks it; docs/merritt-poster.md),
and Merritt's ingest writes the batch itself.

That door takes an uploaded file, never a URL. So a payload the console was given by URL is
handed over as a checkm manifest that names the URL, and Merritt's ingest fetches it as it does
for every manifest its depositors upload:

* ``file``: an object manifest (ingest type ``manifest``) of that one file;
* ``container``: a container batch manifest (``batchManifestContainer``) of that one container,
  carrying the object's identifiers and ERC in its columns;
* ``object-manifest``: a batch manifest (``batchManifest``) listing that object manifest;
* a batch manifest by URL is read here (under the depositor fetch policy, at most
  ``MAX_MANIFEST_BYTES``) and uploaded as it is: a batch manifest cannot list another;
* a ``file://`` payload (an upload kept by the console's own ``/poster/`` door) is uploaded.

The other fields go as ingest's form fields (``profile``, ``submitter``, ``type``, ``title``,
``creator``, ``date``, ``localIdentifier``, ``primaryIdentifier``, ``digestType``,
``digestValue``, and Merritt's keys the console's ``/poster/`` door kept). Ingest answers its
batch state (``bat:batchID`` = ``bid-<uuid>``, ``bat:batchStatus`` ``QUEUED``), or its exception
document with the HTTP status of the refusal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import requests
from django.conf import settings

from queues.states import DomainError
from queues.steps import checkm
from queues.steps.fetch import local_path
from queues.steps.merritt import canonical_type, merritt_type
from queues.steps.merritt_wire import merritt_error, service_session, state_fields
from queues.steps.netpolicy import FetchPolicy, FetchRefused, TransferFailed, short_error

STANDALONE = "standalone"
BESIDE_MERRITT = "beside-merritt"
MODES = (STANDALONE, BESIDE_MERRITT)
MERRITT_INTAKE = "merritt"
CONSOLE_INTAKE = "console"
INTAKES = (MERRITT_INTAKE, CONSOLE_INTAKE)

# Ingest's door for a new object, and for a new version of one (JerseyPost ``submit``/``update``).
POSTER_PATH = "/poster/submit"
POSTER_UPDATE_PATH = "/poster/update"
MAX_MANIFEST_BYTES = 16 * 1024**2
# The console's own keys, never sent as ingest fields (the payload travels as the upload).
_NOT_FIELDS = frozenset({"payload_url", "submission_mode", "update", "digest", "submitted"})
# Merritt's submission keys the console's /poster/ door keeps -> ingest's form field names.
_MERRITT_FIELDS: dict[str, str] = {
    "note": "note",
    "notification": "notification",
    "notificationFormat": "notificationFormat",
    "DataCiteResourceType": "DataCite.resourceType",
    **{
        f"DC{name}": f"DC.{name}"
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
    },
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
    """Merritt's ingest refused the submission; the message is its reason."""


class IngestUnavailable(DomainError):
    """Merritt's ingest could not be reached or failed; nothing is known to be submitted."""


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
    """What ingest answered: its batch ID (``bid-<uuid>``), the batch status, every field."""

    batch_id: str
    status: str
    fields: dict[str, str]


def ingest_url() -> str:
    url = str(getattr(settings, "MRT_INGEST_URL", "") or "").strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise IngestUnavailable(
            "MRT_BATCH_INTAKE=merritt sends submissions to Merritt's ingest service: set "
            "MRT_INGEST_URL to its address (http://host:port/<context>)"
        )
    return url


def _row(sub: IngestSubmission, url: str) -> dict[str, object]:
    return {
        "url": url,
        "hash_alg": sub.digest_alg or None,
        "hash_value": sub.digest_value or None,
        "filename": sub.filename or None,
        "primary_id": sub.primary_id or None,
        "local_id": sub.local_id or None,
        "creator": sub.creator or None,
        "title": sub.title or None,
        "date": sub.date or None,
    }


def _manifest_for(sub: IngestSubmission, kind: str) -> bytes:
    """A one-row checkm manifest naming the payload URL; ValueError when checkm cannot carry a
    value (a ``|`` or a line break in a title, say)."""
    return checkm.write_checkm([_row(sub, sub.payload_url)], kind=kind).encode("utf-8")


def _read_manifest(url: str, policy: FetchPolicy) -> bytes:
    """A batch manifest given by URL, read under the depositor fetch policy."""
    try:
        with policy.open(url) as response:
            if response.status != 200:
                raise IngestRefused(f"the manifest at {url} answered HTTP {response.status}")
            data = bytearray()
            for chunk in response.chunks(64 * 1024):
                data += chunk
                if len(data) > MAX_MANIFEST_BYTES:
                    raise IngestRefused(
                        f"the manifest at {url} is larger than {MAX_MANIFEST_BYTES} bytes"
                    )
            return bytes(data)
    except (FetchRefused, TransferFailed, OSError) as exc:
        raise IngestRefused(f"the manifest at {url} could not be read: {short_error(exc)}") from exc


def upload_for(
    sub: IngestSubmission, *, policy: FetchPolicy, file_roots: Sequence[Path]
) -> tuple[str, str, bytes | IO[bytes]]:
    """Ingest's type name, the upload's file name and its content for one submission."""
    kind = canonical_type(sub.submission_type)
    if sub.payload_url.startswith("file://"):
        path = Path(local_path(sub.payload_url, file_roots=file_roots))
        return merritt_type(kind), sub.filename or path.name, path.open("rb")
    if kind == "file":
        return "manifest", "payload.checkm", _manifest_for(sub, checkm.OBJECT_MANIFEST)
    if kind == "container":
        content = _manifest_for(sub, checkm.CONTAINER_BATCH_MANIFEST)
        return "batchManifestContainer", "payload.checkm", content
    if kind == "object-manifest":
        return "batchManifest", "payload.checkm", _manifest_for(sub, checkm.BATCH_MANIFEST)
    name = sub.payload_url.rstrip("/").rsplit("/", 1)[-1] or "manifest.checkm"
    return merritt_type(kind), name, _read_manifest(sub.payload_url, policy)


def form_fields(sub: IngestSubmission, ingest_type: str) -> list[tuple[str, str]]:
    """Ingest's form fields for one submission, in JerseyBase's names."""
    fields = [
        ("profile", sub.profile),
        ("submitter", sub.submitter),
        ("type", ingest_type),
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
    # A manifest carries the payload's digest in its own row; the form's digest is the upload's.
    if sub.digest_alg and sub.digest_value and sub.payload_url.startswith("file://"):
        fields += [("digestType", sub.digest_alg), ("digestValue", sub.digest_value)]
    for key, kept in sub.extra.items():
        field_name = _MERRITT_FIELDS.get(key)
        if field_name and key not in _NOT_FIELDS and isinstance(kept, str) and kept:
            fields.append((field_name, kept))
    return fields


def submit_to_ingest(
    sub: IngestSubmission,
    *,
    policy: FetchPolicy,
    file_roots: Sequence[Path],
    timeout: float | None = None,
) -> IngestAnswer:
    """POST one submission to Merritt's ingest door; its answer, IngestRefused (4xx, with its
    reason) or IngestUnavailable (unreachable, 5xx, or an answer that is not a batch state).
    ``policy`` and ``file_roots`` are the depositor's: what a payload URL may reach."""
    update = sub.extra.get("update") is True or sub.extra.get("submission_mode") == "update"
    url = ingest_url() + (POSTER_UPDATE_PATH if update else POSTER_PATH)
    ingest_type, name, content = upload_for(sub, policy=policy, file_roots=file_roots)
    try:
        # A POST is not repeated once sent: a second one would make a second batch.
        session = service_session(retry_posts=False)
        response = session.post(
            url,
            data=form_fields(sub, ingest_type),
            files={"file": (name, content, "application/octet-stream")},
            timeout=timeout or settings.MRT_HTTP_TIMEOUT,
        )
    except requests.RequestException as exc:
        raise IngestUnavailable(
            f"Merritt's ingest service at {url} did not answer ({short_error(exc)}); the "
            "submission may not have reached it: look for it before sending it again"
        ) from exc
    finally:
        if not isinstance(content, bytes):
            content.close()
    if 400 <= response.status_code < 500:
        raise IngestRefused(f"Merritt's ingest refused the submission: {merritt_error(response)}")
    if response.status_code != 200:
        raise IngestUnavailable(f"Merritt's ingest failed: {merritt_error(response)}")
    parsed = state_fields(response.content)
    batch_id = parsed[1].get("batchID", "") if parsed else ""
    if parsed is None or parsed[0] != "batchState" or not batch_id:
        raise IngestUnavailable(
            f"Merritt's ingest at {url} answered HTTP 200 without a batch state document"
        )
    return IngestAnswer(
        batch_id=batch_id, status=parsed[1].get("batchStatus", ""), fields=parsed[1]
    )
