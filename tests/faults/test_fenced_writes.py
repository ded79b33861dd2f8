"""Fenced to the last write (issue 49): a lock is deleted only by its owner, seen to own it just
then, and every write a consumer makes to a job's nodes goes out in the session that took the
job's lock, checked in the same multi, or not at all.

Found in a chaos run: a reconciler deleted another consumer's lock by a path it had listed
earlier as its own session's, and Estimating's step wrote ``space_needed`` after its claim's
session was gone, under the process's new one. Here both are forced on a real server.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from daemons.conftest import expire_session, make_job, wait_for
from daemons.test_batched import CONFIG, cycle_until_idle
from kazoo.client import KazooClient

from queues.core.states import JobState
from queues.daemons.estimating import Estimating
from queues.daemons.pipeline import JobPipeline
from queues.zk import locks
from queues.zk import paths as zpaths
from queues.zk.errors import LockLost
from queues.zk.fence import fenced
from queues.zk.jobs import job_load, job_set_json, job_set_nodes, job_set_space_needed
from queues.zk.kazoo_private import session_id
from queues.zk.locks import Reconciler, ledger_of, lock_create
from queues.zk.records import Job
from queues.zk.side_effects import callback_record_path, callback_record_start
from queues.zk.store_intents import store_intent_path, store_intent_record

pytestmark = pytest.mark.slow


def lock_of(job: Job) -> str:
    return zpaths.job_node(job.jid, "lock")


def new_session(client: KazooClient, hosts: str) -> None:
    """End ``client``'s session on the server and wait for the new one the client opens."""
    old = session_id(client)
    expire_session(client, hosts)
    wait_for(lambda: client.connected and session_id(client) not in (None, old), timeout=30)


def owner(zk: KazooClient, path: str) -> int | None:
    stat = zk.exists(path)
    return stat.ephemeralOwner if stat is not None else None


def test_the_reconciler_leaves_a_lock_another_session_made_between_its_list_and_its_delete(
    zk: KazooClient, other_zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = make_job(zk, CONFIG, state=JobState.ESTIMATING)
    lock = lock_of(job)
    zk.create(lock, b"", ephemeral=True)  # this session's, and no thread works under it
    listed, go = threading.Event(), threading.Event()
    listing = locks.session_ephemerals

    def list_then_wait(client: KazooClient) -> list[str]:
        found = listing(client)
        listed.set()
        assert go.wait(30)
        return found

    monkeypatch.setattr(locks, "session_ephemerals", list_then_wait)
    deleted: list[list[str]] = []
    reconciler = Reconciler(zk, ledger_of(zk))
    thread = threading.Thread(target=lambda: deleted.append(reconciler.reconcile()))
    thread.start()
    assert listed.wait(30)
    assert lock in listing(zk)  # listed as this session's
    # Between the list and the delete this session's lock goes (an earlier delete of its own
    # that lands late) and another consumer locks the job.
    zk.delete(lock)
    other_zk.create(lock, b"", ephemeral=True)
    go.set()
    thread.join(30)
    assert deleted == [[]]
    assert owner(zk, lock) == other_zk.client_id[0]


def test_the_reconciler_still_deletes_its_own_orphan(zk: KazooClient) -> None:
    job = make_job(zk, CONFIG, state=JobState.ESTIMATING)
    lock = lock_of(job)
    zk.create(lock, b"", ephemeral=True)
    assert Reconciler(zk, ledger_of(zk)).reconcile() == [lock]
    assert zk.exists(lock) is None


def _store_intent(zk: KazooClient, job: Job) -> Any:
    return store_intent_record(
        zk,
        job,
        manifest_url="http://w/m",
        manifest_sha256="0" * 64,
        node="9501",
        ark="a",
        replace=False,
    )


# Every place a consumer writes a job's nodes (``/jobs/JID/*``) or its records of side effects,
# with the node it writes: Estimating's and Downloading's size, Processing's identifiers and its
# store and inventory, Storing's inventory and its add record, Notify's callback record.
WRITERS: dict[str, tuple[Callable[[KazooClient, Job], Any], Callable[[Job], str]]] = {
    "space_needed": (
        lambda zk, job: job_set_space_needed(zk, job, 4321),
        lambda job: zpaths.job_node(job.jid, "space_needed"),
    ),
    "identifiers": (
        lambda zk, job: job_set_json(zk, job, "identifiers", {"primary_id": "ark:/1/x"}),
        lambda job: zpaths.job_node(job.jid, "identifiers"),
    ),
    "store and inventory": (
        lambda zk, job: job_set_nodes(zk, job, {"store": {"a": 1}, "inventory": {"b": 2}}),
        lambda job: zpaths.job_node(job.jid, "store"),
    ),
    "inventory": (
        lambda zk, job: job_set_json(zk, job, "inventory", {"version": 3}),
        lambda job: zpaths.job_node(job.jid, "inventory"),
    ),
    "store intent": (_store_intent, lambda job: store_intent_path(job.jid)),
    "callback record": (
        lambda zk, job: callback_record_start(zk, job, "http://r/hook", found=None),
        lambda job: callback_record_path(job.jid),
    ),
}


def _read(zk: KazooClient, path: str) -> tuple[bytes, int] | None:
    stat = zk.exists(path)
    return (zk.get(path)[0], stat.version) if stat is not None else None


@pytest.mark.parametrize("taken", [True, False], ids=["another holds it", "nobody holds it"])
@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_write_after_the_claims_session_is_gone_writes_nothing(
    zk: KazooClient,
    zk_hosts: str,
    own_zk,
    writer: str,
    taken: bool,
) -> None:
    client, gate = own_zk
    write, node = WRITERS[writer]
    job = make_job(zk, CONFIG, state=JobState.STORING)
    zk.ensure_path(callback_record_path(job.jid).rpartition("/")[0])
    zk.ensure_path(store_intent_path(job.jid).rpartition("/")[0])
    claim = (gate.generation, session_id(client))
    assert lock_create(client, lock_of(job))
    before = _read(zk, node(job))
    # The session is lost just before the write; the process has a new one at once.
    new_session(client, zk_hosts)
    if taken:
        assert lock_create(zk, lock_of(job))
    with fenced(gate.fence(client, *claim)), pytest.raises(LockLost):
        write(client, job)
    assert _read(zk, node(job)) == before
    # The same write in the session that holds the lock goes through.
    if not taken:
        assert lock_create(client, lock_of(job))
        fresh = (gate.generation, session_id(client))
        with fenced(gate.fence(client, *fresh)):
            write(client, job_load(zk, job.jid))
        assert _read(zk, node(job)) != before


class SizingThenLosing(Estimating):
    """Estimating whose session ends (on the server) after its HEADs, before it writes."""

    name: ClassVar[str] = "test-estimating-lost"
    lose: Callable[[], None]

    def estimate(self, job: Job) -> int:
        size = super().estimate(job)
        self.lose()
        return size


@pytest.mark.parametrize("batched", [True, False], ids=["batched loop", "one-job loop"])
def test_estimating_whose_session_went_during_its_step_writes_no_size(
    zk: KazooClient,
    other_zk: KazooClient,
    zk_hosts: str,
    own_zk,
    batched: bool,
) -> None:
    client, gate = own_zk
    job = make_job(zk, CONFIG, state=JobState.ESTIMATING)

    def lose() -> None:
        new_session(client, zk_hosts)
        assert lock_create(other_zk, lock_of(job))  # the next consumer holds the job now

    daemon = SizingThenLosing(zk=client, gate=gate, poll=0.05, batch=1)
    daemon.lose = lose
    if batched:
        cycle_until_idle(JobPipeline(daemon))
    else:
        assert gate.connected
        daemon.run_once()
    assert daemon.last is not None and daemon.last.outcome == "dropped"
    after = job_load(zk, job.jid)
    assert after.space_needed == 0  # as created: nothing written without the lock
    assert after.state == JobState.ESTIMATING
    assert owner(zk, lock_of(job)) == other_zk.client_id[0]


def test_the_release_deletes_only_a_lock_of_the_session_it_is_sent_in(
    zk: KazooClient,
    zk_hosts: str,
    own_zk,
    other_zk: KazooClient,
) -> None:
    client, _gate = own_zk
    job = make_job(zk, CONFIG, state=JobState.ESTIMATING)
    lock = lock_of(job)
    assert lock_create(client, lock)
    new_session(client, zk_hosts)
    assert lock_create(other_zk, lock)
    locks.lock_release(client, lock)
    assert owner(zk, lock) == other_zk.client_id[0]
