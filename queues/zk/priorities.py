"""An operator's change of a waiting job's priority: the ``priority`` node and the job's index
entry ``/jobs/states/<state>/PP-JID`` renamed to the new ``PP``, in one transaction.

Only a job that waits (Pending, Held) and that no consumer holds: a consumer that has the job
locked moves it with the index entry it read, and a rename under it would leave an entry behind
(its move deletes the old name and creates one from the priority it loaded). The transaction
checks the status version the job was read at, and that its lock is absent (it creates the
lock and deletes it again, which fails when a lock exists), so a job claimed or moved since it
was read is refused, not renamed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from queues.core.states import JobState, job_batch_folder

from . import paths
from .codecs import encode_int
from .errors import InvalidTransition, ItemLocked, MalformedNode
from .jobs import check_priority, decode_priority
from .nodes import commit, exists_many, read_many
from .records import Job

WAITING = frozenset({JobState.PENDING, JobState.HELD})


def priority_set_waiting(zk: KazooClient, job: Job, priority: int) -> Job:
    """``job`` (Pending or Held, unlocked) with ``priority``; InvalidTransition for a job in
    another state, ItemLocked while a consumer holds it, StaleVersion/Conflict when it changed
    since ``job`` was read."""
    check_priority(priority)
    if job.state not in WAITING:
        raise InvalidTransition(
            f"job: only a waiting (Pending or Held) job's priority can be changed; "
            f"{job.jid} is {job.state}"
        )
    if priority == job.priority:
        return job
    lock = paths.job_node(job.jid, "lock")
    new_entry = paths.job_index_entry(job.state, priority, job.jid)
    found = exists_many(zk, [lock, job.index_path, new_entry])
    if found[lock] is not None:
        raise ItemLocked(f"job {job.jid} is being worked on by a consumer; try again")
    txn = zk.transaction()
    txn.check(paths.job_node(job.jid, "status"), job.status.version)
    txn.create(lock, b"", ephemeral=True)
    txn.delete(lock)
    txn.set_data(paths.job_node(job.jid, "priority"), encode_int(priority))
    if found[job.index_path] is not None:
        txn.delete(job.index_path)
    if found[new_entry] is None:
        txn.create(new_entry, b"")
    commit(txn, what=f"set the priority of {job.jid}")
    return replace(job, priority=priority)


def batch_waiting(
    zk: KazooClient, bid: str, states_of: Callable[[list[str]], dict[str, str]]
) -> list[tuple[int, str]]:
    """The (priority, jid) of a batch's waiting jobs: its unfinished jobs are its
    ``batch-processing`` entries, their states told by ``states_of`` (the read index: no walk
    of the state folders), their priorities read in one round trip."""
    folder = paths.batch_index(bid, job_batch_folder(JobState.PENDING))
    try:
        members = zk.get_children(folder)
    except NoNodeError:
        return []
    where = states_of(members)
    waiting = [jid for jid in members if where.get(jid) in WAITING]
    reads = read_many(zk, [paths.job_node(jid, "priority") for jid in waiting])
    found = []
    for jid in waiting:
        read = reads[paths.job_node(jid, "priority")]
        if read is not None:
            with contextlib.suppress(MalformedNode):
                found.append((decode_priority(paths.job_node(jid, "priority"), read[0]), jid))
    return found
