"""The version files Merritt's inventory reads, written as Merritt's ingest writes them.

Besides ``mrt-erc.txt`` and ``mrt-dc.xml`` (``queues.steps.erc``), every object version Merritt's
ingest hands to storage carries, in ``system/``::

    mrt-ingest.txt               ANVL, "key:<TAB>value": who submitted what, how, where it goes
    mrt-mom.txt                  ANVL, "key:<TAB>value": the Merritt object model (ARK, type, role)
    mrt-owner.txt                the owner's ARK (no line break), when the profile names one
    mrt-membership.txt           one collection ARK per line, when the profile names any
    mrt-submission-manifest.txt  the depositor's object manifest as submitted (manifest type)
    mrt-delete.txt               on an update: the files to delete, as the depositor sent them

Merritt's inventory reads ``mrt-ingest.txt`` as Java properties (``file``, ``type``, ``profile``,
``batch``, ``job``, ``userAgent``, ``submissionDate``). ``docs/merritt-ingest-formats.md`` names the
handler that writes each file and the few places where this console's text differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from queues.steps.erc import SYSTEM_DIR, UNAS, write_atomic

INGEST_FILE = "mrt-ingest.txt"
MOM_FILE = "mrt-mom.txt"
OWNER_FILE = "mrt-owner.txt"
MEMBERSHIP_FILE = "mrt-membership.txt"
SUBMISSION_MANIFEST_FILE = "mrt-submission-manifest.txt"
DELETE_FILE = "mrt-delete.txt"
# What Merritt's example profiles give an object when the profile says nothing.
DEFAULT_OBJECT_TYPE = "MRT-curatorial"
DEFAULT_OBJECT_ROLE = "MRT-content"
SERVICE_NAME = "Merritt queue console"


def _one_line(value: object) -> str:
    return " ".join(str(value if value is not None else "").split())


def anvl_text(pairs: Iterable[tuple[str, object]], delimiter: str = "\t") -> str:
    """ANVL lines ``key:<delimiter>value`` as Merritt's ``MetadataUtil.writeMetadataANVL``
    writes them (a tab unless told otherwise). A value is folded onto one line, so no value
    can forge another key; an empty key stands for a value the writer skips (a bare line
    break)."""
    return "".join(
        f"{key}:{delimiter}{_one_line(value)}\n" if key else "\n" for key, value in pairs
    )


def _or_unas(value: object) -> str:
    text = _one_line(value)
    return text or UNAS


@dataclass(frozen=True)
class IngestRecord:
    """What ``mrt-ingest.txt`` says about one job's version."""

    submission_date: str
    batch: str
    job: str
    filename: str
    package_type: str  # Merritt's name: file, container, manifest, ...
    profile: str
    collections: Sequence[str]
    storage_service: str
    notification: Sequence[str]
    supplied_identifier: str | None = None
    digest_type: str | None = None
    digest_value: str | None = None
    creator: str | None = None
    title: str | None = None
    date: str | None = None
    local_identifier: str | None = None
    note: str | None = None
    user_agent: str | None = None
    manifest_validity: str | None = None  # "valid" for a manifest submission
    assigned_identifier: str | None = None  # minted here
    retrieved_identifier: str | None = None  # found by the local id
    handlers: Sequence[str] = ()


def ingest_text(record: IngestRecord) -> str:
    """``mrt-ingest.txt``: the keys of Merritt's ``HandlerInitialize``, in its order, then the
    lines its later handlers append (manifest validity, identifiers, handlers)."""
    pairs: list[tuple[str, object]] = [
        ("ingest", SERVICE_NAME),
        ("submissionDate", record.submission_date),
        ("batch", record.batch),
        ("job", record.job),
    ]
    if record.user_agent:
        pairs.append(("userAgent", record.user_agent))
    pairs += [
        ("file", record.filename),
        ("type", record.package_type),
        ("profile", record.profile),
        ("collection", "; ".join(record.collections)),
        ("storageService", record.storage_service),
        # Merritt's writer skips the node (an Integer), leaving only the line break.
        ("", None),
        ("notification", ";".join(record.notification)),
        ("suppliedIdentifier", _or_unas(record.supplied_identifier)),
        ("digestType", _or_unas(record.digest_type)),
        ("digestValue", _or_unas(record.digest_value)),
        ("creator", _or_unas(record.creator)),
        ("title", _or_unas(record.title)),
        ("date", _or_unas(record.date)),
        ("localIdentifier", _or_unas(record.local_identifier)),
        ("note", _or_unas(record.note)),
    ]
    if record.manifest_validity:
        pairs.append(("manifestValidity", record.manifest_validity))
    pairs += [
        ("assignedIdentifier", _or_unas(record.assigned_identifier)),
        ("retrievedIdentifier", _or_unas(record.retrieved_identifier)),
    ]
    if record.handlers:
        pairs.append(("handlers", ",".join(record.handlers)))
    return anvl_text(pairs)


def mom_text(
    *,
    primary_identifier: str,
    object_type: str | None = None,
    object_role: str | None = None,
    aggregate: str | None = None,
    local_identifier: str | None = None,
) -> str:
    """``mrt-mom.txt``: ``primaryIdentifier``, ``type``, ``role``, ``aggregate`` (only when the
    profile has one) and ``localIdentifier`` (only when the object has one)."""
    pairs: list[tuple[str, object]] = [
        ("primaryIdentifier", primary_identifier),
        ("type", object_type or DEFAULT_OBJECT_TYPE),
        ("role", object_role or DEFAULT_OBJECT_ROLE),
    ]
    if _one_line(aggregate):
        pairs.append(("aggregate", aggregate))
    if _one_line(local_identifier):
        pairs.append(("localIdentifier", local_identifier))
    return anvl_text(pairs)


def owner_text(owner: str) -> str:
    """``mrt-owner.txt``: the owner's ARK alone, without a line break."""
    return _one_line(owner)


def membership_text(collections: Iterable[str]) -> str:
    """``mrt-membership.txt``: one collection ARK per line."""
    return "".join(f"{_one_line(c)}\n" for c in collections if _one_line(c))


def delete_list(text: str) -> str:
    """The ``store.delete`` string Merritt's ingest makes of ``mrt-delete.txt``: every non-empty
    line, ``producer/`` put in front unless it is there, each ending in a line break."""
    entries = []
    for line in text.splitlines():
        if not line.strip():
            continue
        entries.append(line if line.startswith("producer/") else f"producer/{line}")
    return "".join(f"{entry}\n" for entry in entries)


@dataclass(frozen=True)
class VersionFiles:
    """Everything the ANVL version files say about one object version."""

    ingest: IngestRecord
    primary_identifier: str
    local_identifier: str | None = None
    owner: str | None = None
    collections: Sequence[str] = ()
    object_type: str | None = None
    object_role: str | None = None
    aggregate: str | None = None


def write_version_files(object_dir: Path, files: VersionFiles) -> list[Path]:
    """Write ``mrt-ingest.txt``, ``mrt-mom.txt`` and, when they have content, ``mrt-owner.txt``
    and ``mrt-membership.txt`` into ``object_dir/system``; stale owner/membership files (a
    profile changed between runs) are removed. Returns the files written."""
    system = object_dir / SYSTEM_DIR
    written = [
        write_atomic(system / INGEST_FILE, ingest_text(files.ingest)),
        write_atomic(
            system / MOM_FILE,
            mom_text(
                primary_identifier=files.primary_identifier,
                object_type=files.object_type,
                object_role=files.object_role,
                aggregate=files.aggregate,
                local_identifier=files.local_identifier,
            ),
        ),
    ]
    for name, text in (
        (OWNER_FILE, owner_text(files.owner or "")),
        (MEMBERSHIP_FILE, membership_text(files.collections)),
    ):
        if text:
            written.append(write_atomic(system / name, text))
        else:
            (system / name).unlink(missing_ok=True)
    return written


def write_submission_manifest(object_dir: Path, data: bytes) -> Path:
    """The depositor's object manifest, byte for byte, as ``system/mrt-submission-manifest.txt``."""
    path = object_dir / SYSTEM_DIR / SUBMISSION_MANIFEST_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path


def move_delete_file(object_dir: Path, producer_dir: str = "producer") -> str:
    """On an update: move the depositor's ``producer/mrt-delete.txt`` to ``system/`` (as Merritt's
    ingest does) and return the ``store.delete`` string; "" when there is none."""
    source = object_dir / producer_dir / DELETE_FILE
    target = object_dir / SYSTEM_DIR / DELETE_FILE
    if source.is_file() and not source.is_symlink():
        target.parent.mkdir(parents=True, exist_ok=True)
        source.replace(target)
    if target.is_file() and not target.is_symlink():
        return delete_list(target.read_text(encoding="utf-8", errors="replace"))
    return ""
