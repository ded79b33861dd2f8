"""Records of what a step did outside ZooKeeper, kept under ``/mrt-console/`` (the contract's
"Side effects outside ZooKeeper"): a job's lock fences ZooKeeper writes only, so a step whose
effect elsewhere cannot be undone notes it here, and the next claimer of the job reads the note.

``write_under_lock`` is how every such record is written: only while the job's lock is this
session's, in one transaction that checks the lock still exists and the job's status is the one
the step read. Storing's add records (``store_intents``) and Notify's callback records (below)
use it.

A callback record, ``/mrt-console/callbacks/JID``, JSON ``{url, since, session, delivered}``:
written before Notify posts the job's callback (``delivered`` empty), marked with the time the
receiver answered 2xx once it did. A claimer that finds a delivered record does not post again;
one that finds an undelivered record posts again (the receiver may or may not have it: a callback
cannot be asked what it holds, but every attempt carries the same ``Idempotency-Key``) and says so
in the log. Notify's move to Completed deletes the record in its own multi; ``job_remove`` deletes
it with the job.

A job removed by a tool that does not know these records (Merritt's library deletes a batch with
everything below it, an operator's ``zkCli``) leaves its record behind: ``records_of_gone_jobs``
finds such records and ``gone_records_remove`` deletes them (the retention daemon's sweep).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError

from . import paths, scan
from .codecs import decode_any, encode_json, now_stamp
from .errors import Conflict, patiently
from .fence import Write, write_fenced
from .kazoo_private import session_id
from .nodes import exists_many
from .records import Job

log = logging.getLogger("queues.zk")

CALLBACKS = f"{paths.CONSOLE}/callbacks"

# How long marking a callback delivered waits for ZooKeeper to answer again (seconds): the
# callback went, and a record left undelivered makes the next claim post it again.
DELIVERED_PATIENCE = 30.0


def write_under_lock(
    zk: KazooClient, job: Job, path: str, data: bytes, *, replace: bool, what: str
) -> int:
    """Create (or, with ``replace``, overwrite) ``path`` as the holder of the job's lock, in one
    transaction that checks the lock still exists and the job's status is at the version ``job``
    was read at, sent in the claim's session (``fence.write_fenced``); the record's version
    after the write. LockLost, Conflict or StaleVersion when the job is no longer this
    consumer's. The record's folder is made on first use.
    """

    def attempt() -> int:
        results = write_fenced(zk, job, [Write(path, data, replace)], what=what)
        return int(results[2].version) if replace else 0

    try:
        return attempt()
    except Conflict:
        # Any refusal other than a missing folder is about the job's lock or status.
        folder = path.rpartition("/")[0]
        if replace or zk.exists(folder) is not None:
            raise
        zk.ensure_path(folder)
        return attempt()


def callback_record_path(jid: str) -> str:
    return f"{CALLBACKS}/{paths.jid(jid)}"


@dataclasses.dataclass(frozen=True)
class CallbackRecord:
    """A job's callback to ``url``, started at ``since`` by the session ``session`` (hex), and
    answered 2xx at ``delivered`` (empty while not known to be)."""

    url: str
    since: str = ""
    session: str = ""
    delivered: str = ""
    version: int = 0  # the node's, for marking it delivered


def read_record(zk: KazooClient, path: str) -> tuple[Callable[[str], str], int] | None:
    """The record at ``path``: a getter of its text fields ("" for one missing or not text,
    and for every field of a record that does not parse: such a record still means the side
    effect may have happened) and the node's version; None when there is none."""
    try:
        data, stat = zk.get(path)
    except NoNodeError:
        return None
    value = decode_any(data)
    fields = value if isinstance(value, dict) else {}

    def text(name: str) -> str:
        item = fields.get(name)
        return item if isinstance(item, str) else ""

    return text, stat.version


def callback_record_read(zk: KazooClient, jid: str) -> CallbackRecord | None:
    """The job's callback record, or None when no callback was started (one that does not
    parse reads as undelivered)."""
    found = read_record(zk, callback_record_path(jid))
    if found is None:
        return None
    text, version = found
    return CallbackRecord(
        url=text("url"),
        since=text("since"),
        session=text("session"),
        delivered=text("delivered"),
        version=version,
    )


def _encode(record: CallbackRecord) -> bytes:
    fields = dataclasses.asdict(record)
    del fields["version"]
    return encode_json(fields)


def session_label(zk: KazooClient) -> str:
    """The client's session as a record names the session that wrote it: hex, as ZooKeeper's
    own tools show a session id ("" without a session)."""
    session = session_id(zk)
    return f"{session:x}" if session else ""


def callback_record_start(
    zk: KazooClient, job: Job, url: str, *, found: CallbackRecord | None
) -> CallbackRecord:
    """Record that the job's callback to ``url`` is about to be posted (over ``found``, the
    record ``callback_record_read`` gave); Conflict or StaleVersion when the job is no longer
    this consumer's (``write_under_lock``), and then nothing may be posted."""
    record = CallbackRecord(url=url, since=now_stamp(), session=session_label(zk))
    version = write_under_lock(
        zk,
        job,
        callback_record_path(job.jid),
        _encode(record),
        replace=found is not None,
        what=f"record the callback of {job.jid}",
    )
    return dataclasses.replace(record, version=version)


def callback_record_delivered(zk: KazooClient, jid: str, record: CallbackRecord) -> bool:
    """Mark ``record`` (this claim's, from ``callback_record_start``) delivered, waiting out a
    connection outage of up to DELIVERED_PATIENCE s. Not under the job's lock: that the callback
    went is true whoever holds the job now. False when another claim has rewritten or deleted
    the record meanwhile (its own callback is its to mark) or ZooKeeper stayed away."""
    data = _encode(dataclasses.replace(record, delivered=now_stamp()))
    try:
        patiently(
            lambda: zk.set(callback_record_path(jid), data, version=record.version),
            patience=DELIVERED_PATIENCE,
        )
    except (BadVersionError, NoNodeError):
        return False
    except Exception as exc:
        log.warning("%s notify: callback delivered, but not recorded: %s", jid, exc)
        return False
    return True


# Job nodes looked up at once when records are checked against their jobs.
GONE_CHUNK = 1_000


def records_of_gone_jobs(zk: KazooClient, folder: str) -> list[str]:
    """The records in ``folder`` (a folder of records named by job ID) whose job no longer
    exists, as paths; a name that is no job ID is not one of ours to judge (the consistency
    check reports it)."""
    names = [n for n in scan.list_names(zk, folder) if paths.JID_RE.fullmatch(n)]
    gone = []
    for start in range(0, len(names), GONE_CHUNK):
        chunk = names[start : start + GONE_CHUNK]
        stats = exists_many(zk, [paths.job(n) for n in chunk])
        gone += [f"{folder}/{n}" for n in chunk if stats[paths.job(n)] is None]
    return gone


def gone_records_remove(zk: KazooClient, folders: tuple[str, ...]) -> int:
    """Delete every record of ``folders`` whose job is gone; how many went. Job IDs are never
    given twice and a record is written only while its job's lock and status are there
    (``write_under_lock``), so a record whose job is gone can never be wanted again."""
    removed = 0
    for folder in folders:
        for path in records_of_gone_jobs(zk, folder):
            try:
                zk.delete(path)
            except NoNodeError:
                continue
            removed += 1
    return removed
