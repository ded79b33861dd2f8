"""The consumers' claimer: a kept listing, priority order, and several consumers on one folder."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from queues.zk import client as zkmod
from queues.zk import jobs, nodes
from queues.zk.records import Job


def drain(claimer: jobs.JobClaimer, zk: KazooClient) -> list[str]:
    """Claim until nothing is left, moving each job on (lock released in the move)."""
    claimed = []
    while (job := claimer.claim()) is not None:
        jobs.job_transition(zk, job, "Held", release_lock=True)
        claimed.append(job.jid)
    return claimed


def test_one_consumer_claims_in_priority_order_from_a_kept_listing(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    low, normal, urgent = make_job(priority=9), make_job(), make_job(priority=1)
    claimer = jobs.JobClaimer(zk, "Pending", max_age=3600)
    assert drain(claimer, zk) == [urgent.jid, normal.jid, low.jid]


def test_a_job_arriving_after_the_listing_is_claimed_before_the_claimer_gives_up(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    first, second = make_job(), make_job()
    claimer = jobs.JobClaimer(zk, "Pending", max_age=3600)
    assert claimer.claim().jid == first.jid
    late = make_job(priority=0)
    # The kept listing comes first, then the folder is listed again rather than report no work.
    assert drain(claimer, zk) == [second.jid, late.jid]


def test_a_large_folder_is_listed_again_less_often_while_names_are_left(
    zk: KazooClient, make_job: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claimer with names of its listing still to walk lists a folder of more than
    LIST_RATE * max_age entries again only as often as LIST_RATE entries a second would (here
    6 entries at 1 a second: every 6 s, not every second), and at once when none is left."""
    monkeypatch.setattr(nodes, "LIST_RATE", 1)
    made = [make_job() for _ in range(6)]
    claimer = jobs.JobClaimer(zk, "Pending", max_age=1.0)
    listings = []
    real = claimer._list

    def counted() -> None:
        listings.append(1)
        real()

    monkeypatch.setattr(claimer, "_list", counted)

    def claim_and_move() -> str:
        job = claimer.claim()
        jobs.job_transition(zk, job, "Held", release_lock=True)
        return job.jid

    assert claim_and_move() == made[0].jid
    assert len(listings) == 1
    claimer._listed_at -= 2.0  # older than max_age, younger than 6 / LIST_RATE
    assert claim_and_move() == made[1].jid
    assert len(listings) == 1
    claimer._listed_at -= 4.5  # older than 6 / LIST_RATE
    assert claim_and_move() == made[2].jid
    assert len(listings) == 2


def test_a_job_moved_on_by_another_consumer_is_never_locked(
    zk: KazooClient, other_zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    moved, waiting = make_job(), make_job()
    claimer = jobs.JobClaimer(zk, "Pending", max_age=3600)
    claimer._list()  # this consumer has listed both jobs ...
    theirs = jobs.job_acquire(other_zk, "Pending")
    assert theirs.jid == moved.jid  # ... another takes the first and moves it on
    jobs.job_transition(other_zk, theirs, "Held", release_lock=True)

    assert claimer.claim().jid == waiting.jid
    # The moved job was not locked on the way, so its next step's consumer can take it.
    assert zk.exists(f"/jobs/{moved.jid}/lock") is None
    assert jobs.job_acquire(other_zk, "Held").jid == moved.jid


def test_a_job_the_consumer_does_not_accept_stays_unlocked_for_others(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    big, small = make_job(space_needed=10**12), make_job(space_needed=10)
    claimer = jobs.JobClaimer(zk, "Pending")
    got = claimer.claim(accept=lambda job: job.space_needed < 10**9)
    assert got.jid == small.jid
    assert zk.exists(f"/jobs/{big.jid}/lock") is None


def test_consumers_sharing_a_folder_claim_every_job_exactly_once(
    zk: KazooClient, zk_hosts: str, make_job: Callable[..., Job]
) -> None:
    created = {make_job().jid for _ in range(60)}
    clients = [zkmod.connect(zk_hosts) for _ in range(3)]
    results: list[list[str]] = [[] for _ in clients]
    go = threading.Barrier(len(clients))

    def consume(i: int) -> None:
        claimer = jobs.JobClaimer(clients[i], "Pending")
        go.wait()
        results[i] = drain(claimer, clients[i])

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(len(clients))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        for client in clients:
            client.stop()
            client.close()

    claimed = [jid for result in results for jid in result]
    assert sorted(claimed) == sorted(created)  # all of them, none twice
    assert {j for j in created if zk.exists(f"/jobs/{j}/lock")} == set()


def test_a_crowded_claimer_reads_which_jobs_are_locked_instead_of_trying_them(
    zk: KazooClient, other_zk: KazooClient, make_job: Callable[..., Job], monkeypatch
) -> None:
    made = [make_job() for _ in range(6)]
    for job in made[:4]:  # four consumers elsewhere are working on the first four
        other_zk.create(f"/jobs/{job.jid}/lock", b"", ephemeral=True)
    claimer = jobs.JobClaimer(zk, "Pending")
    claimer._crowd = 4  # the last claim lost races: the folder is crowded
    writes = []
    real = zk.transaction
    monkeypatch.setattr(zk, "transaction", lambda: writes.append(1) or real())

    job = claimer.claim()
    # One of the free jobs, locked at the first try: a lock tried on a locked job is a failed
    # write the server has to log, where reading the locks ahead is one cheap read.
    assert job.jid in {made[4].jid, made[5].jid}
    assert len(writes) == 1
