"""Turn a submission into the objects (future jobs) it describes, and an object into its files.

The batch daemon calls :func:`expand_submission` once per batch; each ObjectSpec becomes one job
and is stored in the job's ``configuration`` node via :meth:`ObjectSpec.to_configuration`. The
job daemons call :func:`payload_files` to learn what to HEAD and GET.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from queues.core.words import LONG_MAX, digits
from queues.steps import merritt
from queues.steps.checkm import (
    BATCH_MANIFEST,
    CONTAINER_BATCH_MANIFEST,
    HASH_LENGTHS,
    OBJECT_MANIFEST,
    SINGLE_FILE_BATCH_MANIFEST,
    CheckmReader,
    ManifestError,
    ManifestRow,
    ObjectNames,
    filename_problem,
    hash_problem,
    parse_checkm,
    text_problem,
)
from queues.steps.merritt_wire import is_ark_answer
from queues.steps.notify import notification_format

PayloadType = Literal["file", "container", "object-manifest"]
PAYLOAD_TYPES: tuple[PayloadType, ...] = ("file", "container", "object-manifest")

# Declared batch type -> (the #%profile kind its manifest must have, the payload of each row).
BATCH_TYPES: dict[str, tuple[str, PayloadType]] = {
    "single-file-batch-manifest": (SINGLE_FILE_BATCH_MANIFEST, "file"),
    "container-batch-manifest": (CONTAINER_BATCH_MANIFEST, "container"),
    "batch-manifest": (BATCH_MANIFEST, "object-manifest"),
}
SUBMISSION_TYPES: tuple[str, ...] = (*PAYLOAD_TYPES, *BATCH_TYPES)
# Merritt ingest's names for the same types (``manifest`` for an object manifest, ...), accepted
# wherever a type is given.
TYPE_ALIASES: dict[str, str] = dict(merritt.TYPE_ALIASES)
MERRITT_TYPE_NAMES: tuple[str, ...] = tuple(
    name for ours, name in merritt.MERRITT_TYPES.items() if name != ours
)
canonical_type = merritt.canonical_type


class PayloadNotHere(ValueError):
    """A job whose payload this console cannot reach: written by Merritt's ingest, which keeps
    the payload on its own disk and writes no ``payload_url``."""


FetchText = Callable[[str], str | bytes]


@dataclass(frozen=True)
class ObjectSpec:
    """One object to ingest, i.e. one job."""

    payload_url: str
    payload_type: PayloadType
    filename: str = ""
    primary_id: str | None = None
    local_id: str | None = None
    creator: str | None = None
    title: str | None = None
    date: str | None = None
    digest_alg: str | None = None
    digest_value: str | None = None
    size: int | None = None

    def to_configuration(self) -> dict[str, Any]:
        """The keys this spec contributes to a job's ``configuration`` JSON node.

        Merritt's ingest keys (its readers need them) and the console's own beside them::

            type         str               Merritt's name: "file" | "container" | "manifest"
            filename     str               path of a single file inside the object
            objectID     str               ARK requested by the depositor (Merritt's key)
            localID      str               depositor's local identifier
            creator      str               ERC who
            title        str               ERC what
            date         str               ERC when
            digestType   str               depositor's digest of the payload (Merritt's keys;
            digestValue  str               the algorithm as Merritt writes it: "SHA-256")
            size         int               depositor's size of the payload in bytes (a number,
                                           as Merritt's ingest writes sizes)
            payload_url  str               the console's: where the payload is
            primaryID    str               the console's spelling of objectID
            digest       {"alg", "value"}  the console's spelling of digestType/digestValue

        Empty values are left out so that merging into an existing node never blanks a key that
        another writer (e.g. the batch's own submission) already filled.
        """
        config: dict[str, Any] = {
            "payload_url": self.payload_url,
            "type": merritt.merritt_type(self.payload_type),
        }
        for key, value in (
            ("filename", self.filename),
            ("objectID", self.primary_id),
            ("primaryID", self.primary_id),
            ("localID", self.local_id),
            ("creator", self.creator),
            ("title", self.title),
            ("date", self.date),
        ):
            if value:
                config[key] = value
        if self.digest_alg and self.digest_value:
            config["digestType"] = merritt.merritt_digest_name(self.digest_alg)
            config["digestValue"] = self.digest_value
            config["digest"] = {"alg": self.digest_alg, "value": self.digest_value}
        if self.size is not None:
            config["size"] = self.size
        return config

    @classmethod
    def from_configuration(cls, config: Mapping[str, Any]) -> ObjectSpec:
        """Read a spec back from a job configuration, the console's or Merritt's.

        Merritt's keys are read as well as the console's: ``type`` in either naming
        (``manifest`` or ``object-manifest``; ``payload_type`` as the mrt-zk library's own
        helper writes it), ``objectID``, ``digestType``/``digestValue`` (``SHA-256`` as Merritt
        writes it, ``sha256`` as this console wrote it before), ``size`` as a number or, as this
        console wrote it before, as text.
        A configuration without ``payload_url`` raises :class:`PayloadNotHere`: Merritt's
        ingest keeps the payload on its own disk, out of this console's reach.
        """
        raw_type = str(config.get("type") or config.get("payload_type") or "file")
        try:
            payload_type = canonical_type(raw_type)
        except ValueError:
            payload_type = raw_type
        if payload_type not in PAYLOAD_TYPES:
            raise ValueError(f"job configuration has unknown payload type {raw_type!r}")
        payload_url = config.get("payload_url")
        if not payload_url:
            raise PayloadNotHere(payload_elsewhere_reason(config))
        digest = config.get("digest")
        alg = value = None
        if isinstance(digest, Mapping):
            alg, value = _text(digest.get("alg")), _text(digest.get("value"))
        if not (alg and value):
            alg = _digest_name(config.get("digestType"))
            value = _text(config.get("digestValue"))
        return cls(
            payload_url=str(payload_url),
            payload_type=payload_type,  # type: ignore[arg-type]
            filename=str(config.get("filename") or ""),
            primary_id=_text(
                config.get("primaryID") or config.get("objectID") or config.get("primary_id")
            ),
            local_id=_text(config.get("localID") or config.get("local_id")),
            creator=_text(config.get("creator") or config.get("erc_who")),
            title=_text(config.get("title") or config.get("erc_what")),
            date=_text(config.get("date") or config.get("erc_when")),
            digest_alg=alg if value else None,
            digest_value=value if alg else None,
            size=size_number(config.get("size")),
        )


def payload_elsewhere_reason(config: Mapping[str, Any]) -> str:
    """Why a job configuration (or batch submission) without ``payload_url`` cannot be worked on
    here, in words."""
    batch, job = config.get("batchID"), config.get("jobID")
    where = None
    if isinstance(batch, str) and batch:
        where = f"queue/{batch}"
        if isinstance(job, str) and job:
            where += f"/{job}/producer"
    if where:
        return (
            "written by Merritt's ingest: no payload_url, the payload is on ingest's own disk "
            f"({where})"
        )
    return "no payload_url: the payload is not where this console can reach it"


def processing_problem(config: Mapping[str, Any]) -> str | None:
    """Why this console's daemons cannot work on a job with this configuration, or None.

    Only a payload out of reach counts (a job written by Merritt's ingest): such a job is left
    untouched for Merritt's own consumers. Anything else wrong with a configuration is the
    job's own failure, reported by the step that meets it.
    """
    if type(config) is not dict and not isinstance(config, Mapping):  # a dict: no ABC check
        return None
    payload_url = config.get("payload_url")
    if isinstance(payload_url, str) and payload_url:
        return None
    return payload_elsewhere_reason(config)


def merritt_submission_keys(
    submission: Mapping[str, Any], *, profile_format: object = None
) -> dict[str, Any]:
    """Merritt ingest's keys for a batch ``submission`` written with the console's keys.

    Merritt's ingest writes ``type`` with its own name (``manifest``, ``batchManifest``, ...),
    ``objectID``, ``digestType``/``digestValue`` (the algorithm as its DigestEnum value:
    ``SHA-256``, ``MD5``), ``filename``, ``update`` (a boolean its readers require), ``size``
    (a number, 0 when the depositor gave none), ``notificationFormat`` and ``submissionDate``
    (``java.util.Date`` text); ``batchID``, ``profile``, ``submitter``,
    ``title``, ``creator``, ``date``, ``localID`` share the console's names. The console's own
    type name stays as ``submission_type``. Values already present (``update`` from an update
    request, a ``submissionDate``) are kept; a size given as text becomes its number.

    ``notificationFormat`` is what Merritt's batch handler writes: the request's when it names
    one of Merritt's format types exactly, else the profile's ``NotificationFormat``
    (``profile_format``) likewise, else ``xml``; a request's value that names none is dropped,
    as Merritt drops it (docs/merritt-services.md, "Callbacks").
    """
    ours = canonical_type(
        str(submission.get("submission_type") or submission.get("type") or "file")
    )
    keys: dict[str, Any] = {
        "type": merritt.merritt_type(ours),
        "submission_type": ours,
        "update": submission.get("update") is True,
        "submissionDate": submission.get("submissionDate") or merritt.java_date_text(),
        "notificationFormat": notification_format(
            submission.get("notificationFormat"), profile_format, default="xml"
        ),
        "size": size_number(submission.get("size")) or 0,
    }
    primary = _text(submission.get("primaryID") or submission.get("objectID"))
    if primary:
        keys["objectID"] = primary
    digest = submission.get("digest")
    if isinstance(digest, Mapping) and _text(digest.get("alg")) and _text(digest.get("value")):
        keys["digestType"] = merritt.merritt_digest_name(str(digest["alg"]))
        keys["digestValue"] = str(digest["value"])
    payload_url = submission.get("payload_url")
    if not _text(submission.get("filename")) and isinstance(payload_url, str) and payload_url:
        keys["filename"] = filename_from_url(payload_url)
    return keys


def merritt_job_keys(submission: Mapping[str, Any]) -> dict[str, Any]:
    """Keys a job's ``configuration`` takes in Merritt's form, from its batch's ``submission``.

    ``submissionDate``: Merritt's ingest gives a job its submission date as a ``DateState``,
    whose text is ISO 8601 with the zone's offset (``2026-11-21T10:02:03-08:00``), where the
    batch's is ``java.util.Date`` text. The batch's ``submitted`` (this console's) is used
    first, else its ``submissionDate`` in either form, else now.
    """
    moment = None
    for key in ("submitted", "submissionDate"):
        value = submission.get(key)
        if isinstance(value, str) and value.strip():
            moment = merritt.parse_submission_date(value)
            if moment is not None:
                break
    return {"submissionDate": merritt.iso_date_text(moment)}


def size_number(value: object) -> int | None:
    """A size given as a number or as its digits (as earlier configurations wrote it); None
    when there is none or it is not a whole number of bytes that Merritt reads (a Java long)."""
    if isinstance(value, bool):
        return None
    number = value if isinstance(value, int) else digits(_text(value) or "")
    return number if number is not None and 0 <= number <= LONG_MAX else None


def _digest_name(value: object) -> str | None:
    """A digest algorithm as the console names it, from Merritt's spelling or the console's:
    ``SHA-256`` (Merritt's DigestEnum value) and ``sha256`` -> ``sha256``, ``MD5`` -> ``md5``."""
    text = _text(value)
    return text.lower().replace("-", "") if text else None


@dataclass(frozen=True, slots=True)  # one a file of an object: a million for some objects
class PayloadFile:
    """One file to download for an object: where from, where to inside ``producer/``."""

    url: str
    filename: str
    digest_alg: str | None = None
    digest_value: str | None = None
    size: int | None = None


def file_of_row(row: ManifestRow, filename: str) -> PayloadFile:
    """The file a manifest's row names, to be written as ``filename``."""
    return PayloadFile(
        url=row.url,
        filename=filename,
        digest_alg=row.hash_alg or None,
        digest_value=row.hash_value or None,
        size=row.size,
    )


def _text(value: object) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def filename_from_url(url: str) -> str:
    """The last path part of ``url``, unquoted; a fallback name when the depositor gave none.
    Unquoting can make it any text ("..%2F..%2Fetc%2Fpasswd"): every caller checks it by the
    file-name rule, as it checks a name given (``named_from_url``)."""
    name = unquote(urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1])
    return name or "payload"


def named_from_url(url: str, line: int = 0) -> str:
    """``filename_from_url``, or ManifestError (naming the manifest's ``line``) when that name
    breaks the file-name rule: with no nfo:fileName, a row's URL named its file unchecked."""
    name = filename_from_url(url)
    problem = filename_problem(name)
    if problem:
        raise ManifestError(f"the file name {name!r} taken from the URL {problem}", line=line)
    return name


# A submission's fields of free text, by the submit form's names, as a refusal words them.
# Merritt's door keeps any text in them (JerseyBase.getFormData); they end up in ANVL files
# (mrt-erc.txt, mrt-ingest.txt), EZID metadata, mails, logs and pages, where a line break
# forges a line and a bidirectional override disguises what is shown
# (docs/merritt-poster.md, "What each field may hold").
TEXT_FIELDS: dict[str, str] = {
    "submitter": "the submitter",
    "title": "the title",
    "creator": "the creator",
    "date": "the date",
    "local_id": "the local ID",
    "payload_url": "the payload URL",
}


def submission_filename_problem(name: str) -> str | None:
    """Why ``name`` cannot be a submission's file name, or None: the file-name rule, and one
    name, no folder (Merritt's ingest writes the upload as ``new File(queueDir, filename)`` and
    checks its digest on the name's last part alone)."""
    problem = filename_problem(name)
    if problem:
        return problem
    if "/" in name:
        return "names a folder too: a submission's file name is one name, without '/'"
    return None


def submission_problems(fields: Mapping[str, Any]) -> dict[str, str]:
    """Why fields of a submission (the submit form's names: ``submitter``, ``title``,
    ``primary_id``, ``digest_alg``, ...) cannot be right, each by the field it is about; empty
    when none. The one rule of every door (the form, the API, ``/poster/``, ``submitbatch``).

    Free text (``TEXT_FIELDS``) holds no control character and no bidirectional override; the
    primary ID is an ARK; a digest is both an algorithm the console and Merritt know and a value
    of hex digits of its length; the file name (the depositor's, else the payload URL's last
    part) is one file's name.
    """
    problems: dict[str, str] = {}
    for name, words in TEXT_FIELDS.items():
        value = fields.get(name)
        if isinstance(value, str) and (problem := text_problem(value)):
            problems[name] = f"{words} {problem}"
    primary = _text(fields.get("primary_id"))
    if primary and not is_ark_answer(primary):
        problems["primary_id"] = (
            "the primary ID must be an ARK (ark:/NAAN/name, printable ASCII without spaces), "
            f"got {primary[:80]!r}"
        )
    alg = (_text(fields.get("digest_alg")) or "").lower()
    value = _text(fields.get("digest_value")) or ""
    if bool(alg) != bool(value):
        problems["digest_alg" if value else "digest_value"] = (
            "give both a digest algorithm and a digest value, or neither"
        )
    elif problem := hash_problem(alg, value):
        problems["digest_alg" if alg not in HASH_LENGTHS else "digest_value"] = (
            f"digest: {problem[:120]}"
        )
    given = fields.get("filename")
    url = fields.get("payload_url")
    name = given if isinstance(given, str) and given else ""
    if not name and isinstance(url, str) and url:
        name = filename_from_url(url)
    if name and (problem := submission_filename_problem(name)):
        problems["filename"] = f"file name {name[:200]!r} {problem}"
    return problems


def _check_digest(alg: str | None, value: str | None) -> tuple[str | None, str | None]:
    if not alg and not value:
        return None, None
    if not alg or not value:
        raise ManifestError("a digest needs both an algorithm and a value")
    alg = alg.lower()
    if alg not in HASH_LENGTHS:
        raise ManifestError(f"unsupported hash algorithm {alg!r}")
    return alg, value.lower()


def expand_submission(
    *,
    submission_type: str,
    payload_url: str,
    fetch_text: FetchText,
    filename: str | None = None,
    title: str | None = None,
    creator: str | None = None,
    date: str | None = None,
    local_id: str | None = None,
    primary_id: str | None = None,
    digest_alg: str | None = None,
    digest_value: str | None = None,
    most_objects: int | None = None,
) -> list[ObjectSpec]:
    """The objects a submission asks for, one per future job (a batch manifest of more than
    ``most_objects`` rows raises TooManyRows as soon as its reading finds the row past them).

    For a batch manifest each row is one object and its ERC, identifiers and digest come from
    the row alone: the submission's own title etc. describe the batch, not its objects.
    ``fetch_text`` returns bytes or text; given bytes, UTF-8 errors are reported with a line.
    Raises ManifestError for a corrupt manifest, a kind that differs from the declared type,
    or an empty batch; ValueError for an unknown type. Merritt's type names are accepted.
    """
    submission_type = canonical_type(submission_type)
    if submission_type in PAYLOAD_TYPES:
        alg, value = _check_digest(digest_alg, digest_value)
        name = filename or filename_from_url(payload_url)
        problem = filename_problem(name)
        if problem:
            raise ManifestError(f"file name {name!r} {problem}")
        return [
            ObjectSpec(
                payload_url=payload_url,
                payload_type=submission_type,  # type: ignore[arg-type]
                filename=name,
                primary_id=_text(primary_id),
                local_id=_text(local_id),
                creator=_text(creator),
                title=_text(title),
                date=_text(date),
                digest_alg=alg,
                digest_value=value,
            )
        ]
    if submission_type not in BATCH_TYPES:
        raise ValueError(f"unknown submission type {submission_type!r}")
    expected_kind, row_type = BATCH_TYPES[submission_type]
    manifest = parse_checkm(
        fetch_text(payload_url),
        most_rows=most_objects,
        profile_if_headed=True,
        profile_needed=expected_kind,
    )
    if manifest.kind != expected_kind:
        raise ManifestError(
            f"a {submission_type} submission needs a {expected_kind} manifest, "
            f"got {manifest.kind or 'one without #%profile'}"
        )
    if not manifest.rows:
        raise ManifestError("the batch manifest lists no objects")
    return [
        ObjectSpec(
            payload_url=row.url,
            payload_type=row_type,
            filename=row.filename or named_from_url(row.url, row.line),
            primary_id=row.primary_id or None,
            local_id=row.local_id or None,
            creator=row.creator or None,
            title=row.title or None,
            date=row.date or None,
            digest_alg=row.hash_alg or None,
            digest_value=row.hash_value or None,
            size=row.size,
        )
        for row in manifest.rows
    ]


def payload_files(spec: ObjectSpec, *, fetch_text: FetchText) -> list[PayloadFile]:
    """The files to fetch for one object.

    A file or a container is itself the one download (a container is unpacked after download);
    an object manifest is fetched and each of its rows becomes a file.
    """
    if spec.payload_type != "object-manifest":
        return [
            PayloadFile(
                url=spec.payload_url,
                filename=spec.filename or named_from_url(spec.payload_url),
                digest_alg=spec.digest_alg,
                digest_value=spec.digest_value,
                size=spec.size,
            )
        ]
    # Row by row: what is kept of each is its file, not the row (a million-file manifest's
    # rows held beside its files took about as much again).
    files: list[PayloadFile] = []
    names = ObjectNames()  # "a" and "./a" are one file; "a" and "a/b" a file and a folder
    text = fetch_text(spec.payload_url)
    for row in CheckmReader(text, only=OBJECT_MANIFEST, profile_if_headed=True):
        name = row.filename or named_from_url(row.url, row.line)
        names.add(name, row.line)
        files.append(file_of_row(row, name))
    if not files:
        raise ManifestError("the object manifest lists no files")
    return files
