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

from queues.steps.checkm import (
    BATCH_MANIFEST,
    CONTAINER_BATCH_MANIFEST,
    HASH_LENGTHS,
    OBJECT_MANIFEST,
    SINGLE_FILE_BATCH_MANIFEST,
    ManifestError,
    filename_problem,
    parse_checkm,
)

PayloadType = Literal["file", "container", "object-manifest"]
PAYLOAD_TYPES: tuple[PayloadType, ...] = ("file", "container", "object-manifest")

# Declared batch type -> (the #%profile kind its manifest must have, the payload of each row).
BATCH_TYPES: dict[str, tuple[str, PayloadType]] = {
    "single-file-batch-manifest": (SINGLE_FILE_BATCH_MANIFEST, "file"),
    "container-batch-manifest": (CONTAINER_BATCH_MANIFEST, "container"),
    "batch-manifest": (BATCH_MANIFEST, "object-manifest"),
}
SUBMISSION_TYPES: tuple[str, ...] = (*PAYLOAD_TYPES, *BATCH_TYPES)

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

        Stable key names (Merritt's spelling where it has one)::

            payload_url  str               the payload (file, container or object manifest)
            type         str               "file" | "container" | "object-manifest"
            filename     str               path of a single file inside the object
            primaryID    str               ARK requested by the depositor
            localID      str               depositor's local identifier
            creator      str               ERC who
            title        str               ERC what
            date         str               ERC when
            digest       {"alg", "value"}  depositor's digest of the payload
            size         int               depositor's size of the payload in bytes

        Empty values are left out so that merging into an existing node never blanks a key that
        another writer (e.g. the batch's own submission) already filled.
        """
        config: dict[str, Any] = {"payload_url": self.payload_url, "type": self.payload_type}
        for key, value in (
            ("filename", self.filename),
            ("primaryID", self.primary_id),
            ("localID", self.local_id),
            ("creator", self.creator),
            ("title", self.title),
            ("date", self.date),
        ):
            if value:
                config[key] = value
        if self.digest_alg and self.digest_value:
            config["digest"] = {"alg": self.digest_alg, "value": self.digest_value}
        if self.size is not None:
            config["size"] = self.size
        return config

    @classmethod
    def from_configuration(cls, config: Mapping[str, Any]) -> ObjectSpec:
        """Read a spec back from a job configuration, also one written by Merritt's Java ingest.

        Java writes ``payload_type`` with underscores (``object_manifest``) and may put the ERC
        under ``erc_*`` keys; both are accepted so that its jobs can be worked on here.
        """
        raw_type = str(config.get("type") or config.get("payload_type") or "file")
        payload_type = raw_type.replace("_", "-")
        if payload_type not in PAYLOAD_TYPES:
            raise ValueError(f"job configuration has unknown payload type {raw_type!r}")
        payload_url = config.get("payload_url")
        if not payload_url:
            raise ValueError("job configuration has no payload_url")
        digest = config.get("digest") or {}
        size = config.get("size")
        return cls(
            payload_url=str(payload_url),
            payload_type=payload_type,  # type: ignore[arg-type]
            filename=str(config.get("filename") or ""),
            primary_id=_text(config.get("primaryID") or config.get("primary_id")),
            local_id=_text(config.get("localID") or config.get("local_id")),
            creator=_text(config.get("creator") or config.get("erc_who")),
            title=_text(config.get("title") or config.get("erc_what")),
            date=_text(config.get("date") or config.get("erc_when")),
            digest_alg=_text(digest.get("alg")) if isinstance(digest, Mapping) else None,
            digest_value=_text(digest.get("value")) if isinstance(digest, Mapping) else None,
            size=int(size) if size not in (None, "") else None,
        )


@dataclass(frozen=True)
class PayloadFile:
    """One file to download for an object: where from, where to inside ``producer/``."""

    url: str
    filename: str
    digest_alg: str | None = None
    digest_value: str | None = None
    size: int | None = None


def _text(value: object) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def filename_from_url(url: str) -> str:
    """The last path part of ``url``, unquoted; a fallback name when the depositor gave none."""
    name = unquote(urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1])
    return name or "payload"


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
) -> list[ObjectSpec]:
    """The objects a submission asks for, one per future job.

    For a batch manifest each row is one object and its ERC, identifiers and digest come from
    the row alone: the submission's own title etc. describe the batch, not its objects.
    ``fetch_text`` returns bytes or text; given bytes, UTF-8 errors are reported with a line.
    Raises ManifestError for a corrupt manifest, a kind that differs from the declared type,
    or an empty batch; ValueError for an unknown type.
    """
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
    manifest = parse_checkm(fetch_text(payload_url))
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
            filename=row.filename or filename_from_url(row.url),
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
                filename=spec.filename or filename_from_url(spec.payload_url),
                digest_alg=spec.digest_alg,
                digest_value=spec.digest_value,
                size=spec.size,
            )
        ]
    manifest = parse_checkm(fetch_text(spec.payload_url))
    if manifest.kind not in (None, OBJECT_MANIFEST):
        raise ManifestError(f"an object manifest must be {OBJECT_MANIFEST}, got {manifest.kind}")
    if not manifest.rows:
        raise ManifestError("the object manifest lists no files")
    files: list[PayloadFile] = []
    seen: dict[str, int] = {}
    for row in manifest.rows:
        name = row.filename or filename_from_url(row.url)
        if name in seen:
            raise ManifestError(
                f"file name {name!r} already used on line {seen[name]}", line=row.line
            )
        seen[name] = row.line
        files.append(
            PayloadFile(
                url=row.url,
                filename=name,
                digest_alg=row.hash_alg or None,
                digest_value=row.hash_value or None,
                size=row.size,
            )
        )
    return files
