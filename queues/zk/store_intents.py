"""What Storing records before it asks storage for a version: ``/mrt-console/store-intents/JID``.

A storage add is a side effect outside ZooKeeper: a consumer that loses its session between the
add and the move loses the job, and the next claimer would add again (Merritt's storage makes a
new version for every add, identical or not). So Storing writes this record first, in one
transaction that checks the job's lock and status, and a claimer that finds it asks storage what
the object holds before adding. The record is JSON: the manifest's URL and sha256, the storage
node, the ARK, when and by which session the add was started. Storing deletes it once the job has
moved to Recording; docs/zookeeper-contract-notes.md says why it lives here and not in the job.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kazoo.client import KazooClient

from . import paths
from .codecs import encode_json, now_stamp
from .records import Job
from .side_effects import CALLBACKS, read_record, session_label, write_under_lock

STORE_INTENTS = f"{paths.CONSOLE}/store-intents"
# Every folder of records of a step's side effects, each a record per job, named by its ID.
SIDE_EFFECT_FOLDERS = (STORE_INTENTS, CALLBACKS)


def store_intent_path(jid: str) -> str:
    return f"{STORE_INTENTS}/{paths.jid(jid)}"


@dataclass(frozen=True)
class StoreIntent:
    """An add of ``manifest_url`` to ``ark`` on storage node ``node`` that may have been sent."""

    manifest_url: str
    manifest_sha256: str
    node: str
    ark: str
    since: str = ""  # the contract's timestamp
    session: str = ""  # the ZooKeeper session that recorded it, in hex
    # The object's number of versions in storage just before the add: once storage holds more,
    # the add landed, whatever the working folder holds by then ("" when not known).
    versions_before: str = ""


def store_intent_read(zk: KazooClient, jid: str) -> StoreIntent | None:
    """The job's record, or None when no add was started. A record that does not parse still
    means an add may have been sent, so it reads as one with empty fields."""
    found = read_record(zk, store_intent_path(jid))
    if found is None:
        return None
    text, _version = found
    return StoreIntent(
        manifest_url=text("manifest_url"),
        manifest_sha256=text("manifest_sha256"),
        node=text("node"),
        ark=text("ark"),
        since=text("since"),
        session=text("session"),
        versions_before=text("versions_before"),
    )


def store_intent_record(
    zk: KazooClient,
    job: Job,
    *,
    manifest_url: str,
    manifest_sha256: str,
    node: str,
    ark: str,
    replace: bool,
    versions_before: int | None = None,
) -> StoreIntent:
    """Write the job's record (``replace``: over the one ``store_intent_read`` found) once the
    job's lock is seen to belong to this client's session, in one transaction that checks the
    lock still exists and the job's status is the one ``job`` was read at. A consumer whose
    session (and so its lock) went since its claim cannot record, and so never adds, even when
    the next consumer holds the lock by now. Conflict or StaleVersion when the job is no longer
    this consumer's to store.
    """
    intent = StoreIntent(
        manifest_url=manifest_url,
        manifest_sha256=manifest_sha256,
        node=node,
        ark=ark,
        since=now_stamp(),
        session=session_label(zk),
        versions_before="" if versions_before is None else str(versions_before),
    )
    data = encode_json(asdict(intent))
    write_under_lock(
        zk,
        job,
        store_intent_path(job.jid),
        data,
        replace=replace,
        what=f"record the storage add of {job.jid}",
    )
    return intent
