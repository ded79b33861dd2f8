"""A reader that applies the rules of Merritt's ``mrt-zk`` library to the raw ZooKeeper tree.

Written from the contract page (``../shared/design/zookeeper-contract.md``) alone, and on
purpose independent of the service module: it reads bytes with kazoo and imports nothing from
``queues``, so that it cannot share a mistake with the code it checks. Every state name, key
set, encoding and path below is copied from the contract, not from ``queues.core.states``.

``read_job``, ``read_batch`` and ``read_access`` return what the library would load, or raise
``LayoutError`` listing every rule the item breaks (all of them, not only the first).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import ZnodeStat

# Encoding -------------------------------------------------------------------------------------

STAMP_FORMAT = "%Y-%m-%d %H:%M:%S %z"
STAMP_RE = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} [+-]\d{4}$")
PLAIN_INT_RE = re.compile(r"^(0|[1-9][0-9]*)$")  # plain decimal text: no sign, quotes or spaces
BID_RE = re.compile(r"^bid[0-9]{10}$")
JID_RE = re.compile(r"^jid[0-9]{10}$")
QID_RE = re.compile(r"^qid[0-9]{10}$")
INDEX_ENTRY_RE = re.compile(r"^([0-9]{2})-(jid[0-9]{10})$")

# State machines -------------------------------------------------------------------------------

JOB_STATES = (
    "Pending",
    "Held",
    "Estimating",
    "Provisioning",
    "Downloading",
    "Processing",
    "Storing",
    "Recording",
    "Notify",
    "Completed",
    "Failed",
    "Deleted",
)
BATCH_STATES = (
    "Pending",
    "Held",
    "Processing",
    "Reporting",
    "UpdateReporting",
    "Completed",
    "Failed",
    "Deleted",
)
ACCESS_STATES = ("Pending", "Processing", "Completed", "Failed", "Deleted")

# Status objects: exactly these keys.
JOB_STATUS_KEYS = ("status", "last_modified", "last_successful_status", "retry_count", "message")
SIMPLE_STATUS_KEYS = ("status", "last_modified", "message")

# A job's batch index folder follows its status.
BATCH_FOLDERS = ("batch-processing", "batch-completed", "batch-failed", "batch-deleted")


def batch_folder_of(state: str) -> str:
    return {
        "Completed": "batch-completed",
        "Failed": "batch-failed",
        "Deleted": "batch-deleted",
    }.get(state, "batch-processing")


# Documented keys of an access token and the JSON type each must have when present.
TOKEN_TYPES: dict[str, type | tuple[type, ...]] = {
    "token": str,
    "delivery-node": int,
    "cloud-content-byte": int,
    "status": int,
    "url": str,
    "anticipated-availability-time": str,
}


class LayoutError(AssertionError):
    """The item breaks the library's rules; ``problems`` names each one with its path."""

    def __init__(self, what: str, problems: list[str]) -> None:
        super().__init__(f"{what} breaks the library's layout:\n  " + "\n  ".join(problems))
        self.problems = problems


@dataclass
class LibraryJob:
    jid: str
    bid: str
    priority: int
    space_needed: int
    configuration: dict[str, Any]
    status: dict[str, Any]
    identifiers: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    locked: bool = False


@dataclass
class LibraryBatch:
    bid: str
    submission: dict[str, Any]
    status: dict[str, Any]
    started: bool  # the states marker exists
    jobs: dict[str, list[str]] = field(default_factory=dict)  # batch folder -> job IDs
    report: dict[str, Any] | None = None
    locked: bool = False


@dataclass
class LibraryAccess:
    queue: str
    qid: str
    token: dict[str, Any]
    status: dict[str, Any]
    locked: bool = False


class _Reader:
    """Reads nodes and collects problems instead of stopping at the first."""

    def __init__(self, zk: KazooClient) -> None:
        self.zk = zk
        self.problems: list[str] = []

    def bad(self, path: str, why: str) -> None:
        self.problems.append(f"{path}: {why}")

    def get(self, path: str) -> tuple[bytes, ZnodeStat] | None:
        try:
            return self.zk.get(path)
        except NoNodeError:
            return None

    def children(self, path: str) -> list[str] | None:
        try:
            return sorted(self.zk.get_children(path))
        except NoNodeError:
            return None

    def required(self, path: str) -> tuple[bytes, ZnodeStat] | None:
        found = self.get(path)
        if found is None:
            self.bad(path, "required node is missing")
        return found

    def no_data(self, path: str, found: tuple[bytes, ZnodeStat] | None, what: str) -> None:
        if found is not None and found[0] not in (b"", None):
            self.bad(path, f"{what} holds {found[0][:40]!r}; it has no data")

    def marker(self, path: str, *, ephemeral: bool = False) -> bool:
        """An empty marker node; ``ephemeral`` for locks, persistent otherwise."""
        found = self.get(path)
        if found is None:
            return False
        data, stat = found
        if data:
            self.bad(path, f"a marker is empty; this one holds {data[:40]!r}")
        if ephemeral and not stat.ephemeralOwner:
            self.bad(path, "a lock is ephemeral; this one is persistent")
        if not ephemeral and stat.ephemeralOwner:
            self.bad(path, "an index or state marker is persistent; this one is ephemeral")
        return True

    def json_object(self, path: str, found: tuple[bytes, ZnodeStat] | None) -> dict[str, Any]:
        """Compact UTF-8 JSON holding an object, byte for byte as the contract encodes it."""
        if found is None:
            return {}
        data = found[0] or b""
        try:
            value = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            self.bad(path, f"not UTF-8 JSON ({exc})")
            return {}
        if not isinstance(value, dict):
            self.bad(path, f"JSON {type(value).__name__}, not an object")
            return {}
        compact = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if data != compact:
            self.bad(path, f"JSON is not compact UTF-8: {data[:80]!r}")
        return value

    def integer(self, path: str, found: tuple[bytes, ZnodeStat] | None) -> int:
        if found is None:
            return 0
        text = (found[0] or b"").decode("utf-8", errors="replace")
        if not PLAIN_INT_RE.fullmatch(text):
            self.bad(path, f"an integer is plain decimal text; found {text[:40]!r}")
            return 0
        return int(text)

    def string(self, path: str, found: tuple[bytes, ZnodeStat] | None) -> str:
        if found is None:
            return ""
        try:
            text = (found[0] or b"").decode("utf-8")
        except UnicodeDecodeError:
            self.bad(path, "a string node is UTF-8 text")
            return ""
        if text.startswith('"') or text.endswith('"'):
            self.bad(path, f"a string node is raw text, without JSON quotes: {text[:40]!r}")
        return text

    def stamp(self, path: str, key: str, value: Any) -> None:
        if not isinstance(value, str) or not STAMP_RE.fullmatch(value):
            self.bad(path, f"{key} {value!r} is not in the format {STAMP_FORMAT}")
            return
        try:
            datetime.strptime(value, STAMP_FORMAT)
        except ValueError as exc:
            self.bad(path, f"{key} {value!r} does not parse: {exc}")

    def status(
        self,
        path: str,
        found: tuple[bytes, ZnodeStat] | None,
        keys: tuple[str, ...],
        states: tuple[str, ...],
    ) -> dict[str, Any]:
        value = self.json_object(path, found)
        if found is None:
            return value
        if set(value) != set(keys):
            extra = sorted(set(value) - set(keys))
            missing = sorted(set(keys) - set(value))
            self.bad(
                path, f"status keys are exactly {list(keys)}; extra {extra}, missing {missing}"
            )
        if value.get("status") not in states:
            self.bad(path, f"status {value.get('status')!r} is not one of {', '.join(states)}")
        self.stamp(path, "last_modified", value.get("last_modified"))
        if not isinstance(value.get("message", ""), str):
            self.bad(path, "message is a string")
        return value

    def fail_if_any(self, what: str) -> None:
        if self.problems:
            raise LayoutError(what, self.problems)


# Jobs -----------------------------------------------------------------------------------------


def read_job(zk: KazooClient, jid: str) -> LibraryJob:
    """Load a job as the library does, checking every rule of the contract on the way."""
    r = _Reader(zk)
    if not JID_RE.fullmatch(jid):
        raise LayoutError(jid, ["a job ID is jid + 10 digits"])
    base = f"/jobs/{jid}"
    node = r.get(base)
    if node is None:
        raise LayoutError(jid, [f"{base}: the job does not exist"])
    r.no_data(base, node, "a job node")

    bid = r.string(f"{base}/bid", r.required(f"{base}/bid"))
    if bid and not BID_RE.fullmatch(bid):
        r.bad(f"{base}/bid", f"a batch ID, raw (bid + 10 digits); found {bid[:40]!r}")
    elif bid and r.get(f"/batches/{bid}") is None:
        r.bad(f"{base}/bid", f"batch {bid} does not exist")
    priority = r.integer(f"{base}/priority", r.required(f"{base}/priority"))
    if not 0 <= priority <= 99:
        r.bad(f"{base}/priority", f"priority {priority} is outside 0..99")
    space = r.integer(f"{base}/space_needed", r.required(f"{base}/space_needed"))
    configuration = r.json_object(f"{base}/configuration", r.required(f"{base}/configuration"))
    status = r.status(f"{base}/status", r.required(f"{base}/status"), JOB_STATUS_KEYS, JOB_STATES)
    last = status.get("last_successful_status")
    if last is not None and last not in JOB_STATES:
        r.bad(f"{base}/status", f"last_successful_status {last!r} is not a job state")
    retry = status.get("retry_count")
    if not isinstance(retry, int) or isinstance(retry, bool) or retry < 0:
        r.bad(f"{base}/status", f"retry_count {retry!r} is a non-negative integer")

    identifiers = None
    found = r.get(f"{base}/identifiers")
    if found is not None:
        identifiers = r.json_object(f"{base}/identifiers", found)
        if not isinstance(identifiers.get("primary_id", ""), str):
            r.bad(f"{base}/identifiers", "primary_id is a string")
        local = identifiers.get("local_id", [])
        if not isinstance(local, list) or not all(isinstance(i, str) for i in local):
            r.bad(f"{base}/identifiers", "local_id is a list of strings")
    metadata = None
    found = r.get(f"{base}/metadata")
    if found is not None:
        metadata = r.json_object(f"{base}/metadata", found)
        erc = {"erc_who", "erc_what", "erc_when", "erc_where"}
        if set(metadata) != erc:
            r.bad(f"{base}/metadata", f"metadata keys are {sorted(erc)}, found {sorted(metadata)}")
    for name in ("inventory", "store"):
        found = r.get(f"{base}/{name}")
        if found is not None:
            r.json_object(f"{base}/{name}", found)
    locked = r.marker(f"{base}/lock", ephemeral=True)

    state = status.get("status")
    if isinstance(state, str) and state in JOB_STATES:
        _check_job_index(r, jid, state, priority)
        if bid and BID_RE.fullmatch(bid):
            _check_batch_index(r, jid, bid, state)
    r.fail_if_any(f"job {jid}")
    return LibraryJob(
        jid=jid,
        bid=bid,
        priority=priority,
        space_needed=space,
        configuration=configuration,
        status=status,
        identifiers=identifiers,
        metadata=metadata,
        locked=locked,
    )


def _check_job_index(r: _Reader, jid: str, state: str, priority: int) -> None:
    """Exactly one entry ``PP-JID`` for the job, in the lowercase folder of its state."""
    expected = f"/jobs/states/{state.lower()}/{priority:02d}-{jid}"
    found = []
    for folder in r.children("/jobs/states") or []:
        if folder != folder.lower():
            r.bad(f"/jobs/states/{folder}", "job state folders are lowercase")
        for name in r.children(f"/jobs/states/{folder}") or []:
            match = INDEX_ENTRY_RE.fullmatch(name)
            if match and match.group(2) == jid:
                found.append(f"/jobs/states/{folder}/{name}")
    if found != [expected]:
        r.bad(expected, f"the job's one index entry; found {found or 'none'}")
    else:
        r.marker(expected)


def _check_batch_index(r: _Reader, jid: str, bid: str, state: str) -> None:
    """Exactly one entry for the job below its batch, in the folder its status names."""
    folder = batch_folder_of(state)
    expected = f"/batches/{bid}/states/{folder}/{jid}"
    found = [
        f"/batches/{bid}/states/{f}/{jid}"
        for f in BATCH_FOLDERS
        if jid in (r.children(f"/batches/{bid}/states/{f}") or [])
    ]
    if found != [expected]:
        r.bad(expected, f"the job's one batch index entry; found {found or 'none'}")
    else:
        r.marker(expected)


# Batches --------------------------------------------------------------------------------------


def read_batch(zk: KazooClient, bid: str) -> LibraryBatch:
    r = _Reader(zk)
    if not BID_RE.fullmatch(bid):
        raise LayoutError(bid, ["a batch ID is bid + 10 digits"])
    base = f"/batches/{bid}"
    node = r.get(base)
    if node is None:
        raise LayoutError(bid, [f"{base}: the batch does not exist"])
    r.no_data(base, node, "a batch node")
    submission = r.json_object(f"{base}/submission", r.required(f"{base}/submission"))
    status = r.status(
        f"{base}/status", r.required(f"{base}/status"), SIMPLE_STATUS_KEYS, BATCH_STATES
    )
    batch_id = submission.get("batchID")
    if batch_id is not None and not isinstance(batch_id, str):
        r.bad(f"{base}/submission", f"batchID is a string, found {batch_id!r}")
    elif batch_id:
        uuid_path = f"/batch-uuids/{batch_id}"
        found = r.get(uuid_path)
        if found is None:
            r.bad(uuid_path, "written for any non-empty batchID; missing")
        elif r.string(uuid_path, found) != bid:
            r.bad(uuid_path, f"holds {found[0][:40]!r}, not the raw batch ID {bid}")

    started = r.get(f"{base}/states") is not None
    if started:
        r.marker(f"{base}/states")
    elif status.get("status") not in (None, "Pending"):
        r.bad(
            f"{base}/states",
            f"a {status.get('status')} batch has left Pending and must have the states marker",
        )
    jobs: dict[str, list[str]] = {}
    for folder in r.children(f"{base}/states") or []:
        if folder not in BATCH_FOLDERS:
            r.bad(f"{base}/states/{folder}", f"batch sub-folders are {', '.join(BATCH_FOLDERS)}")
            continue
        path = f"{base}/states/{folder}"
        r.marker(path)
        jobs[folder] = r.children(path) or []
        for jid in jobs[folder]:
            if not JID_RE.fullmatch(jid):
                r.bad(f"{path}/{jid}", "batch index entries are job IDs")
            else:
                r.marker(f"{path}/{jid}")
    if status.get("status") == "Completed" and jobs.get("batch-processing"):
        r.bad(f"{base}/states/batch-processing", "a Completed batch has no job still processing")

    report = None
    found = r.get(f"{base}/status-report")
    if found is not None:
        report = r.json_object(f"{base}/status-report", found)
        r.stamp(f"{base}/status-report", "last_modified", report.get("last_modified"))
        for key in ("failed_jobs", "successful_jobs"):
            value = report.get(key)
            if not isinstance(value, list) or not all(
                isinstance(j, str) and JID_RE.fullmatch(j) for j in value
            ):
                r.bad(f"{base}/status-report", f"{key} is a list of job IDs, found {value!r}")
    locked = r.marker(f"{base}/lock", ephemeral=True)
    r.fail_if_any(f"batch {bid}")
    return LibraryBatch(
        bid=bid,
        submission=submission,
        status=status,
        started=started,
        jobs=jobs,
        report=report,
        locked=locked,
    )


# Access requests ------------------------------------------------------------------------------


def read_access(zk: KazooClient, queue: str, qid: str) -> LibraryAccess:
    r = _Reader(zk)
    if queue not in ("small", "large") or not QID_RE.fullmatch(qid):
        raise LayoutError(f"{queue}/{qid}", ["the queues are small and large; IDs qid + 10 digits"])
    base = f"/access/{queue}/{qid}"
    node = r.get(base)
    if node is None:
        raise LayoutError(qid, [f"{base}: the request does not exist"])
    r.no_data(base, node, "an access request node")
    token = r.json_object(f"{base}/token", r.required(f"{base}/token"))
    for key, kind in TOKEN_TYPES.items():
        if key in token and (not isinstance(token[key], kind) or isinstance(token[key], bool)):
            r.bad(f"{base}/token", f"{key} is {kind}, found {token[key]!r}")
    status = r.status(
        f"{base}/status", r.required(f"{base}/status"), SIMPLE_STATUS_KEYS, ACCESS_STATES
    )
    locked = r.marker(f"{base}/lock", ephemeral=True)
    r.fail_if_any(f"access request {queue}/{qid}")
    return LibraryAccess(queue=queue, qid=qid, token=token, status=status, locked=locked)


# Per-object locks -----------------------------------------------------------------------------


def object_lock_name(ark: str) -> str:
    """The contract's name of an ARK's per-object lock: each match of ``:?/`` becomes ``_``."""
    return re.sub(r":?/", "_", ark)
