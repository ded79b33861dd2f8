"""The fence of a claim: every write a consumer makes for a job (or an access request) it holds
goes out in the session that took the item's lock, checked in the same multi that the lock is
still there, or not at all.

ZooKeeper's ``check`` compares versions, not owners, and every lock node has version 0. What
ties a write to the lock's owner is two facts together:

1. the multi checks that the lock exists (``check(lock, -1)``), and
2. it is sent in the session that created the lock, and no release of it was sent since.

A lock is deleted only by its own session (``locks``: the release, and the reconciler after it
has seen the node's owner) or by the server when that session ends, and the server refuses every
request of an ended session. So a lock that exists when a multi of its creator's session is
applied is still the creator's: the write is the owner's. docs/zookeeper-contract-notes.md
("Deleting a lock") gives the whole argument.

The daemons know the claim's session: for each job they step, the loop makes the daemon's
``SessionGate.fence`` for the claim this thread's (``fenced``) while the step runs. A gate is
given a function that only queues requests (kazoo's ``*_async``) and calls it while the claim's
session is the client's, raising LockLost otherwise; its answer is waited for outside the gate.
A write with no gate in force (an operator's tool outside the daemons) reads the lock's owner
first and is sent only while the session it read is still the client's (``owner_gate``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from queues.core.per_thread import PerThread

from . import paths
from .errors import Conflict, ItemLocked
from .kazoo_private import Multi, session_id
from .locks import ledger_of
from .nodes import checked, first_failure
from .records import Job

# Sends (queues) a request and returns what kazoo's ``*_async`` call returned, or raises
# LockLost without sending when the claim's session is gone.
Gate = Callable[[Callable[[], Any]], Any]

_gate: PerThread[Gate] = PerThread()


def fenced(gate: Gate | None) -> contextlib.AbstractContextManager[None]:
    """Make ``gate`` the fence of this thread's job writes while the block runs."""
    return _gate.bound(gate)


def current_gate() -> Gate | None:
    return _gate.get()


def owner_gate(zk: KazooClient, lock: str) -> Gate:
    """A gate for a write outside a daemon's step: the lock is read to be this session's now,
    and the write goes out only while that session lasts (the ledger's session generation,
    which the client's LOST listener changes before it fails the requests still queued)."""
    ledger = ledger_of(zk)
    generation = ledger.generation()
    session = session_id(zk)
    stat = zk.exists(lock)
    if not session or stat is None or stat.ephemeralOwner != session:
        raise Conflict(f"{lock} is not this session's lock")

    def gate(send: Callable[[], Any]) -> Any:
        return ledger.send_if_current(zk, generation, session, send)

    return gate


def holder_gate(zk: KazooClient, lock: str) -> Gate:
    """The gate of a write made as the holder of ``lock``: this thread's (a daemon's step,
    ``fenced``) or, outside a step, ``owner_gate``. Conflict when the lock is not this
    session's."""
    return current_gate() or owner_gate(zk, lock)


class Gated:
    """A multi whose request is handed to the server through ``gate`` (which may refuse to send
    it with LockLost); its answer is waited for outside the gate."""

    def __init__(self, txn: Multi, gate: Gate) -> None:
        self.txn = txn
        self.gate = gate

    def commit(self) -> list[Any]:
        return list(self.gate(self.txn.commit_async).get())


@dataclass(frozen=True)
class Write:
    """One node written by a fenced write: created, or (``replace``) overwritten; ``replace``
    None: overwritten when it exists now."""

    path: str
    data: bytes
    replace: bool | None = None


_CHECKS = 2  # the operations of a fenced write before its writes: the lock's check, the status's


def write_fenced(zk: KazooClient, job: Job, writes: Sequence[Write], *, what: str) -> list[Any]:
    """Write ``writes`` for ``job`` as the holder of its lock: one multi that checks the lock is
    there and the job's status is at the version ``job`` was read at, sent through this thread's
    gate (``fenced``) or, outside a step, ``owner_gate``. The multi's results.

    A write that does not say whether its node exists (``Write.replace`` None) overwrites it if
    ``job`` as read has it (``present``), else creates it. When the server says otherwise (the
    overwrite of a node that is gone, the create of one that is there; the checks before it
    held, and the failed multi wrote nothing), the same multi is sent again the other way: a
    round trip only when the guess was wrong, where reading every node's presence first would
    cost one every time.

    LockLost when the claim's session is gone (nothing sent); Conflict or StaleVersion when the
    lock or the status changed (nothing written).
    """
    lock = paths.job_node(job.jid, "lock")
    gate = holder_gate(zk, lock)
    replace = [w.replace if w.replace is not None else present(job, w.path) for w in writes]
    guessed = {i for i, w in enumerate(writes) if w.replace is None}
    while True:
        txn = Multi(zk)
        txn.check(lock, -1)
        txn.check(paths.job_node(job.jid, "status"), job.status.version)
        for write, overwrite in zip(writes, replace, strict=True):
            if overwrite:
                txn.set_data(write.path, write.data)
            else:
                txn.create(write.path, write.data)
        results = Gated(txn, gate).commit()
        failed = first_failure(results)
        if failed is None or failed - _CHECKS not in guessed:
            return checked(results, what=what)
        wrong = failed - _CHECKS
        if not isinstance(results[failed], NoNodeError if replace[wrong] else NodeExistsError):
            return checked(results, what=what)
        guessed.discard(wrong)  # known now: each guess is corrected at most once
        replace[wrong] = not replace[wrong]


def present(job: Job, path: str) -> bool:
    """Whether ``job`` as read had the node ``path``: ``space_needed`` is made with the job
    (the contract: "starts at 0"); an optional JSON node is there when it was read, decoded or
    not. Any other node is taken to be missing."""
    name = path.rpartition("/")[2]
    if name == "space_needed":
        return True
    return getattr(job, name, None) is not None or path in job.problems


def commit_unheld(zk: KazooClient, lock: str, add: Callable[[Multi], None], *, what: str) -> None:
    """Commit the writes ``add`` puts in a multi, made only while no session holds the item
    whose lock is ``lock`` (a repair, an operator's write): the multi creates the lock and
    deletes it again, so the server refuses it while anyone holds the item, and no lock is
    ever deleted but this one. ItemLocked when a lock refused it (nothing written); Conflict
    or StaleVersion as ``nodes.checked`` for any other refusal."""
    txn = Multi(zk)
    txn.create(lock, b"", ephemeral=True)
    txn.delete(lock)
    add(txn)
    results = txn.commit()
    if first_failure(results) == 0 and isinstance(results[0], NodeExistsError):
        raise ItemLocked(f"{what}: {lock} is held by a session; try again later")
    checked(results, what=what)
