"""The batched job loop: several jobs per claim and per move, locks kept between steps, and
everything the one-job loop guarantees (holds, priority order, lost sessions, exact nodes).

Why one module (about 1,000 lines): its tests share the step classes and the job factory the
other batched-loop tests import from here (``Step1``, ``Step2``, ``CONFIG``), and each checks one
guarantee of the one loop; split by guarantee, they would each import the same set-up.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import Counter
from typing import Any, ClassVar

import pytest
from kazoo.client import KazooClient

from queues.core.states import BatchState, JobState
from queues.daemons import pipeline as pipeline_module
from queues.daemons.base import JobDaemon, Next, Step
from queues.daemons.completions import REPORTING_MOVES
from queues.daemons.pipeline import Holding, JobPipeline, LockKeeper
from queues.zk import nodes as zk_nodes
from queues.zk import paths as zpaths
from queues.zk import pipeline as zk_pipeline
from queues.zk.batches import CompletionCheck, batch_load, batch_transition
from queues.zk.consumers import claimers_folder
from queues.zk.jobs import (
    _LocalWrites,
    job_configuration_update,
    job_load,
    job_set_json,
)
from queues.zk.kazoo_private import Multi
from queues.zk.locks import lock_create, queue_hold_set
from queues.zk.pipeline import ClaimShare, PendingClaim, StateListing
from queues.zk.records import Job

from .conftest import expire_session, make_job, wait_for

CONFIG = {"payload_url": "http://x/a", "type": "file"}


class Step1(JobDaemon):
    """Estimating -> Provisioning, recording the jobs it worked on, in order."""

    name: ClassVar[str] = "test-estimating"
    step: ClassVar[str] = "test-estimating"
    state: ClassVar[str] = JobState.ESTIMATING
    queue_hold: ClassVar[str | None] = "ingest"
    target: ClassVar[str] = JobState.PROVISIONING

    def __init__(self, *args: Any, action: Any = None, priority: int | None = None, **kw: Any):
        super().__init__(*args, **kw)
        self.seen: list[str] = []
        self.items: list[Job] = []
        self.action = action
        self.priority = priority

    def work(self, item: Job) -> Step:
        self.seen.append(item.jid)
        self.items.append(item)
        if self.action is not None:
            self.action(self, item)
        return Next(self.target, priority=self.priority)


class Step2(Step1):
    name: ClassVar[str] = "test-provisioning"
    step: ClassVar[str] = "test-provisioning"
    state: ClassVar[str] = JobState.PROVISIONING
    target: ClassVar[str] = JobState.DOWNLOADING


def jobs_in(zk: KazooClient, n: int, state: str = JobState.ESTIMATING, **kw: Any) -> list[Job]:
    return [make_job(zk, CONFIG, state=state, **kw) for _ in range(n)]


def lock_owner(zk: KazooClient, jid: str) -> int | None:
    stat = zk.exists(zpaths.job_node(jid, "lock"))
    return stat.ephemeralOwner if stat else None


def in_state(zk: KazooClient, state: str) -> int:
    stat = zk.exists(zpaths.job_state_folder(state))
    return stat.numChildren if stat else 0


def cycle_until_idle(loop: JobPipeline) -> None:
    """Cycles until one finds nothing, then the last move collected (no timing involved); the
    loop then leaves the claimers of its state, as a stopped loop does."""
    for _ in range(200):
        if not loop.cycle():
            break
    loop._finish_move()
    loop.share.leave()


def job_tree(zk: KazooClient, job: Job) -> dict[str, Any]:
    """Every node a job transition writes, with the contract's bytes (the timestamp left out)."""
    nodes: dict[str, Any] = {}
    for name in sorted(zk.get_children(zpaths.job(job.jid))):
        data, _ = zk.get(zpaths.job_node(job.jid, name))
        if name == "status":
            raw = json.loads(data)
            assert data == json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode()
            raw.pop("last_modified")
            nodes[name] = raw
        else:
            nodes[name] = data
    entries = []
    for folder in zk.get_children(zpaths.JOB_STATES):
        for entry in zk.get_children(f"{zpaths.JOB_STATES}/{folder}"):
            if entry.endswith(job.jid):
                data, _ = zk.get(f"{zpaths.JOB_STATES}/{folder}/{entry}")
                entries.append((folder, entry, data))
    batch_entries = []
    states = zpaths.batch_node(job.bid, "states")
    for folder in zk.get_children(states):
        for entry in zk.get_children(f"{states}/{folder}"):
            data, _ = zk.get(f"{states}/{folder}/{entry}")
            batch_entries.append((folder, entry, data))
    return {"nodes": nodes, "index": entries, "batch": batch_entries}


def test_batched_move_writes_exactly_what_the_one_job_path_writes(zk: KazooClient) -> None:
    single, batched = jobs_in(zk, 1)[0], jobs_in(zk, 3)
    one = Step1(zk=zk, priority=12)
    assert one.run_once()  # the one-job path
    many = Step1(zk=zk, priority=12, batch=8)
    loop = JobPipeline(many)
    cycle_until_idle(loop)
    assert many.seen == [j.jid for j in batched]
    expected = job_tree(zk, single)
    assert expected["nodes"]["priority"] == b"12"
    assert expected["index"] == [("provisioning", f"12-{single.jid}", b"")]
    for job in batched:
        got = job_tree(zk, job)
        # Same bytes, names following the job's own id and batch.
        assert got["nodes"] == {**expected["nodes"], "bid": job.bid.encode()}
        assert got["index"] == [("provisioning", f"12-{job.jid}", b"")]
        assert got["batch"] == [("batch-processing", job.jid, b"")]
        assert "lock" not in got["nodes"]


def test_one_multi_claims_and_one_multi_moves_a_whole_batch(zk: KazooClient) -> None:
    jobs_in(zk, 1, state=JobState.PROVISIONING)  # the target folder exists (the usual case)
    jobs = jobs_in(zk, 5)
    sent: Counter[str] = Counter()
    real_send = Multi.send  # every multi goes out through it (commit_async too)

    def counting(self: Any) -> Any:
        sent["multi"] += 1
        return real_send(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Multi, "send", counting)
        loop = JobPipeline(Step1(zk=zk, batch=5))
        cycle_until_idle(loop)
    assert sent["multi"] == 2  # one claim, one move
    assert all(job_load(zk, j.jid).state == JobState.PROVISIONING for j in jobs)
    assert all(job_load(zk, j.jid).lock is None for j in jobs)


def test_one_log_line_names_every_job_a_move_took_the_same_way(zk: KazooClient, caplog) -> None:
    jobs_in(zk, 1, state=JobState.PROVISIONING)
    jobs = jobs_in(zk, 5)
    caplog.set_level(logging.INFO, logger="queues.daemons")
    cycle_until_idle(JobPipeline(Step1(zk=zk, batch=5)))
    [line] = [r.getMessage() for r in caplog.records if "test-estimating ok" in r.getMessage()]
    head, _, named = line.partition(" jobs: ")
    assert head == "test-estimating ok -> Provisioning: 5"
    each = [part.split(" ") for part in named.split(", ")]
    assert sorted(jid for jid, _seconds in each) == sorted(j.jid for j in jobs)
    assert all(re.fullmatch(r"\d+\.\d\ds", seconds) for _jid, seconds in each)


def test_a_failed_batched_claim_passes_over_the_job_it_failed_on_and_claims_the_others_again(
    zk: KazooClient, other_zk: KazooClient
) -> None:
    jobs = jobs_in(zk, 6)
    taken = {jobs[1].jid, jobs[4].jid}
    for jid in taken:
        assert lock_create(other_zk, zpaths.job_node(jid, "lock"))
    worker = Step1(zk=zk, batch=6, strict=True)
    loop = JobPipeline(worker)
    assert loop.cycle()  # the batch's requests go out
    assert loop.cycle()  # the multi failed on jobs[1]: the jobs before and after claimed again
    [(retry, _holding)] = loop.retries
    assert [p.jid for p in retry.lost] == [jobs[1].jid]
    assert [[p.jid for p in picks] for picks, _answer in retry.answers] == [
        [jobs[0].jid],
        [j.jid for j in jobs[2:]],
    ]
    assert worker.seen == []
    cycle_until_idle(loop)  # the next cycle works on what they locked
    free = [j.jid for j in jobs if j.jid not in taken]
    assert worker.seen == free  # the others, still in run order
    for job in jobs:
        current = job_load(zk, job.jid)
        if job.jid in taken:
            assert current.state == JobState.ESTIMATING
            assert lock_owner(zk, job.jid) == other_zk.client_id[0]
        else:
            assert current.state == JobState.PROVISIONING
            assert current.lock is None


def test_two_clients_racing_batched_loops_move_every_job_exactly_once(
    zk: KazooClient, other_zk: KazooClient
) -> None:
    jobs = jobs_in(zk, 40)
    seen: Counter[str] = Counter()
    guard = threading.Lock()

    def count(_daemon: Any, item: Job) -> None:
        with guard:
            seen[item.jid] += 1

    workers = [Step1(zk=c, batch=8, action=count, poll=0.05) for c in (zk, other_zk)]
    stop = threading.Event()
    threads = [threading.Thread(target=w.run, args=(stop,)) for w in workers]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: in_state(zk, JobState.PROVISIONING) == 40)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert seen == Counter({j.jid: 1 for j in jobs})
    assert all(job_load(zk, j.jid).lock is None for j in jobs)


def test_batched_move_falls_back_when_one_job_changed_meanwhile(zk: KazooClient) -> None:
    from queues.services import moves

    jobs = jobs_in(zk, 4)

    def operator_fails_the_second(_daemon: Any, item: Job) -> None:
        if item.jid == jobs[1].jid:
            moves.job_fail(jid=item.jid, message="stopped by an operator")

    worker = Step1(zk=zk, batch=4, action=operator_fails_the_second)
    cycle_until_idle(JobPipeline(worker))
    states = [job_load(zk, j.jid).state for j in jobs]
    p, f = JobState.PROVISIONING, JobState.FAILED
    assert states == [p, f, p, p]
    assert all(job_load(zk, j.jid).lock is None for j in jobs)


def test_lock_is_kept_from_one_step_to_the_next_in_one_process(zk: KazooClient) -> None:
    [job] = jobs_in(zk, 1)
    keeper = LockKeeper()
    first, second = Step1(zk=zk, keeper=keeper), Step2(zk=zk, keeper=keeper)
    one, two = JobPipeline(first, keeper=keeper), JobPipeline(second, keeper=keeper)
    keeper.register(one)
    keeper.register(two)
    cycle_until_idle(one)
    moved = job_load(zk, job.jid)
    assert moved.state == JobState.PROVISIONING
    assert lock_owner(zk, job.jid) == zk.client_id[0]  # kept, not released
    cycle_until_idle(two)
    assert second.seen == [job.jid]
    done = job_load(zk, job.jid)
    assert done.state == JobState.DOWNLOADING
    assert done.lock is None  # no loop here for Downloading: released with the move
    # What the kept-lock path wrote is what the contract says: last_successful_status etc.
    assert done.status.raw["last_successful_status"] == JobState.PROVISIONING


def two_steps(zk: KazooClient, action: Any = None) -> tuple[Step1, Step2, JobPipeline, JobPipeline]:
    keeper = LockKeeper()
    first, second = Step1(zk=zk, keeper=keeper, action=action), Step2(zk=zk, keeper=keeper)
    one, two = JobPipeline(first, keeper=keeper), JobPipeline(second, keeper=keeper)
    keeper.register(one)
    keeper.register(two)
    return first, second, one, two


def test_a_kept_job_is_read_again_only_in_part_and_seen_as_a_full_read_sees_it(
    zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    [job] = jobs_in(zk, 1)
    _first, second, one, two = two_steps(zk)
    cycle_until_idle(one)
    two._absorb()
    assert set(two.known) == {job.jid}  # handed over as the move left it
    before = job_load(zk, job.jid)
    sent: list[list[str]] = []
    real = pipeline_module.start_reads

    def counting(zk_: KazooClient, node_paths: list[str]) -> Any:
        sent.append(list(node_paths))
        return real(zk_, node_paths)

    monkeypatch.setattr(pipeline_module, "start_reads", counting)
    cycle_until_idle(two)
    hold = [zpaths.queue_lock(second.queue_hold)] if second.queue_hold else []
    nodes = [zpaths.job_node(job.jid, n) for n in ("status", "priority", "configuration")]
    assert sent == [hold + nodes]  # the queue hold is read with the jobs
    assert second.items == [before]  # the same Job a full read gives


def priority_written_elsewhere(zk: KazooClient, job: Job, priority: int) -> None:
    txn = zk.transaction()
    txn.set_data(zpaths.job_node(job.jid, "priority"), str(priority).encode())
    txn.delete(job.index_path)
    txn.create(zpaths.job_index_entry(job.state, priority, job.jid), b"")
    txn.commit()


def test_what_an_operator_changes_between_kept_steps_is_seen_by_the_next_step(
    zk: KazooClient,
) -> None:
    [job] = jobs_in(zk, 1)
    _first, second, one, two = two_steps(zk)
    cycle_until_idle(one)
    # Another client changes the job while this process keeps its lock.
    job_configuration_update(zk, job.jid, {"note": "changed"})
    # Its priority, as another client (Merritt's tools) writes it: the node and the entry.
    priority_written_elsewhere(zk, job_load(zk, job.jid), 3)
    # Its status rewritten in the same state (a new version): read and decoded again.
    status = job_load(zk, job.jid).status
    zk.set(
        zpaths.job_node(job.jid, "status"),
        json.dumps({**status.raw, "message": "looked at"}).encode(),
        version=status.version,
    )
    expected = job_load(zk, job.jid)
    cycle_until_idle(two)
    assert second.items == [expected]
    assert expected.configuration["note"] == "changed" and expected.priority == 3
    assert expected.status.message == "looked at"
    assert job_load(zk, job.jid).state == JobState.DOWNLOADING


def test_a_job_on_its_way_with_its_kept_lock_is_not_claimed_by_the_loop_it_goes_to(
    zk: KazooClient,
) -> None:
    """Its new entry is listed before the move's answer hands it over: a claim of it would fail
    on this process's own lock and take the whole batch's claim down."""
    [job] = jobs_in(zk, 1)
    zk.ensure_path(zpaths.job_state_folder(JobState.PROVISIONING))  # the usual case
    _first, second, one, two = two_steps(zk)
    for _ in range(20):
        if one.inflight:
            break
        one.cycle()
    assert one.inflight  # the move is sent; its answer not collected yet
    wait_for(lambda: job_load(zk, job.jid).state == JobState.PROVISIONING)
    assert one.keeper is not None and job.jid in one.keeper.in_transit()
    two.cycle(fresh=True)
    assert not two.pending and not two.retries  # nothing claimed, nothing failed
    one._finish_move()  # the answer: handed over, taken in by the next cycle
    cycle_until_idle(two)
    assert second.seen == [job.jid]
    assert not one.keeper.in_transit()
    assert job_load(zk, job.jid).state == JobState.DOWNLOADING


def narrow_steps(zk: KazooClient) -> tuple[JobPipeline, JobPipeline]:
    """Two loops of one process, one job a claim, room for one kept job downstream."""
    keeper = LockKeeper()
    one = JobPipeline(Step1(zk=zk, keeper=keeper, batch=1), keeper=keeper)
    two = JobPipeline(Step2(zk=zk, keeper=keeper, batch=1), keeper=keeper)
    keeper.register(one)
    keeper.register(two)
    return one, two


def cycle_until(loop: JobPipeline, done: Any) -> None:
    for _ in range(100):
        if done():
            return
        loop.cycle()
    raise AssertionError("the loop never got there")


def test_a_loop_waits_while_the_next_steps_loop_is_full_and_goes_on_when_woken(
    zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Back-pressure: rather than moving jobs on without their locks (someone would claim and
    read them in full again), the loop waits; the next loop wakes it once it has room."""
    monkeypatch.setattr(pipeline_module, "KEEP_ROOM", 1)
    a, b = jobs_in(zk, 2)
    one, two = narrow_steps(zk)
    cycle_until(one, lambda: job_load(zk, a.jid).state == JobState.PROVISIONING)
    one._finish_move()  # handed over: the next loop's room is used up
    assert two._waiting() == 1 and not two.has_room()
    one.wake.clear()
    assert one.cycle() is False and one.throttled
    assert job_load(zk, b.jid).state == JobState.ESTIMATING
    assert lock_owner(zk, b.jid) is None  # not claimed while it could not be moved on
    # The next loop works on what it was handed, and says it has room again.
    cycle_until(two, lambda: job_load(zk, a.jid).state == JobState.DOWNLOADING)
    assert one.wake.is_set()
    cycle_until(one, lambda: job_load(zk, b.jid).state == JobState.PROVISIONING)
    one._finish_move()
    assert lock_owner(zk, b.jid) == zk.client_id[0]  # moved on with its lock kept
    assert b.jid in two.kept or any(job.jid == b.jid for job, _h, _c in two._handed)


def test_a_next_loop_that_takes_nothing_holds_nobody_up(
    zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopping (or draining, or cut off) loop takes no hand-overs: the loop before it does
    not wait for its room, it moves its jobs on without their locks."""
    monkeypatch.setattr(pipeline_module, "KEEP_ROOM", 1)
    a, b = jobs_in(zk, 2)
    one, two = narrow_steps(zk)
    cycle_until(one, lambda: job_load(zk, a.jid).state == JobState.PROVISIONING)
    one._finish_move()
    assert two.backlogged(1)
    two.stopping = True
    assert not two.backlogged(100)
    one.cycle()
    assert not one.throttled
    assert job_load(zk, b.jid).state == JobState.ESTIMATING  # nothing new claimed meanwhile


def test_a_listing_sent_before_a_move_out_does_not_offer_the_moved_job(zk: KazooClient) -> None:
    """ZooKeeper answers a session's requests in order: a listing sent before the move may
    show the job's old entry, one sent after it cannot."""
    listing = StateListing(zk, JobState.ESTIMATING)
    gone, staying = "05-jid0000000001", "05-jid0000000002"
    before = time.monotonic()
    listing.leaving(["jid0000000001"])
    listing.listed(before, [gone, staying], [])
    assert [p.name for p in listing.take(10, {})] == [staying]
    listing.listed(time.monotonic(), [gone, staying], [])  # (a move that failed: still there)
    assert [p.name for p in listing.take(10, {})] == [gone, staying]


def test_a_job_its_step_wrote_is_handed_on_to_be_read_in_full(zk: KazooClient) -> None:
    [job] = jobs_in(zk, 1)

    def name_it(daemon: Any, item: Job) -> None:
        job_set_json(daemon.zk, item, "identifiers", {"primary_id": "ark:/99999/fk4written"})

    _first, second, one, two = two_steps(zk, action=name_it)
    cycle_until_idle(one)
    two._absorb()
    assert job.jid in two.kept and job.jid not in two.known
    cycle_until_idle(two)
    [seen] = second.items
    assert seen.identifiers == {"primary_id": "ark:/99999/fk4written"}


def test_local_writes_forget_old_jobs_by_counting_them_as_written() -> None:
    writes = _LocalWrites(keep=2)
    mark = writes.mark()
    assert not writes.since("jid0000000001", mark)
    writes.note("jid0000000001")
    assert writes.since("jid0000000001", mark)
    assert not writes.since("jid0000000001", writes.mark())
    later = writes.mark()
    writes.note("jid0000000002")
    writes.note("jid0000000003")  # jid0000000001 is forgotten now
    assert writes.since("jid0000000001", mark)  # written after mark: still true
    assert not writes.since("jid0000000009", writes.mark())
    assert writes.since("jid0000000009", mark)  # unknown, but a forgotten write is newer
    assert writes.since("jid0000000002", later)


def test_a_kept_lock_honours_a_queue_hold_placed_between_steps(zk: KazooClient) -> None:
    [job] = jobs_in(zk, 1)
    keeper = LockKeeper()
    first, second = Step1(zk=zk, keeper=keeper), Step2(zk=zk, keeper=keeper)
    one, two = JobPipeline(first, keeper=keeper), JobPipeline(second, keeper=keeper)
    keeper.register(one)
    keeper.register(two)
    cycle_until_idle(one)
    assert lock_owner(zk, job.jid) == zk.client_id[0]
    queue_hold_set(zk, "ingest")
    cycle_until_idle(two)
    assert second.seen == []
    assert job_load(zk, job.jid).state == JobState.PROVISIONING
    assert job_load(zk, job.jid).lock is None  # given back, not kept through the hold
    assert not two.kept


def test_priority_order_is_kept_in_batches_and_across_kept_locks(zk: KazooClient) -> None:
    low, normal, urgent = (
        jobs_in(zk, 1, priority=20)[0],
        jobs_in(zk, 1)[0],
        jobs_in(zk, 1, priority=0)[0],
    )
    worker = Step1(zk=zk, batch=2, strict=True)
    cycle_until_idle(JobPipeline(worker))
    assert worker.seen == [urgent.jid, normal.jid, low.jid]
    # A job handed over with its lock waits behind a more urgent job of the next state.
    [kept] = jobs_in(zk, 1, priority=5)
    [first_in_line] = jobs_in(zk, 1, state=JobState.PROVISIONING, priority=1)
    keeper = LockKeeper()
    first = Step1(zk=zk, keeper=keeper, strict=True)
    second = Step2(zk=zk, keeper=keeper, strict=True)
    one, two = JobPipeline(first, keeper=keeper), JobPipeline(second, keeper=keeper)
    keeper.register(one)
    keeper.register(two)
    cycle_until_idle(one)
    assert lock_owner(zk, kept.jid) == zk.client_id[0]
    # Provisioning also holds the three jobs moved above (priority 0, 5, 20).
    cycle_until_idle(two)
    order = [j for j in second.seen if j in (kept.jid, first_in_line.jid, urgent.jid)]
    assert order == [urgent.jid, first_in_line.jid, kept.jid]


def test_session_expiry_during_a_step_commits_nothing(
    zk: KazooClient, zk_hosts: str, own_zk
) -> None:
    client, gate = own_zk
    jobs = jobs_in(zk, 3)
    old = client.client_id[0]

    def expire(_daemon: Any, item: Job) -> None:
        if item.jid == jobs[0].jid:
            expire_session(client, zk_hosts)
            wait_for(lambda: client.connected and client.client_id[0] != old, timeout=30)

    worker = Step1(zk=client, gate=gate, batch=3, action=expire)
    loop = JobPipeline(worker)
    assert loop.cycle()  # the batch's requests go out
    assert loop.cycle()  # its answers: the step runs, the session expires, no move is sent
    loop._finish_move()
    assert gate.generation == 1
    assert worker.last is not None and worker.last.outcome == "dropped"
    for job in jobs:
        current = job_load(zk, job.jid)
        assert current.state == JobState.ESTIMATING  # nothing committed without the lock
        assert current.lock is None  # the locks went with the session


def test_session_expiry_drops_kept_locks_and_nothing_moves_under_them(
    zk: KazooClient, other_zk: KazooClient, zk_hosts: str, own_zk
) -> None:
    client, gate = own_zk
    jobs = jobs_in(zk, 2)
    keeper = LockKeeper()
    first = Step1(zk=client, gate=gate, keeper=keeper, batch=2)
    second = Step2(zk=client, gate=gate, keeper=keeper, batch=2)
    one, two = JobPipeline(first, keeper=keeper), JobPipeline(second, keeper=keeper)
    keeper.register(one)
    keeper.register(two)
    cycle_until_idle(one)
    old = client.client_id[0]
    assert all(lock_owner(zk, j.jid) == old for j in jobs)
    expire_session(client, zk_hosts)
    wait_for(lambda: client.connected and client.client_id[0] != old, timeout=30)
    assert all(lock_owner(zk, j.jid) is None for j in jobs)
    # Another consumer takes one of them meanwhile: it is theirs now.
    assert lock_create(other_zk, zpaths.job_node(jobs[0].jid, "lock"))
    cycle_until_idle(two)
    assert not two.holding or all(h.session != old for h in two.holding.values())
    assert second.seen == [jobs[1].jid]  # claimed anew under the new session
    theirs = job_load(zk, jobs[0].jid)
    assert theirs.state == JobState.PROVISIONING
    assert lock_owner(zk, jobs[0].jid) == other_zk.client_id[0]
    mine = job_load(zk, jobs[1].jid)
    assert mine.state == JobState.DOWNLOADING and mine.lock is None


def test_a_lock_handed_over_from_a_gone_session_is_dropped_by_a_loop_that_looked_already(
    zk: KazooClient, other_zk: KazooClient
) -> None:
    # The loop looks through its holdings only when one may be from another session: here it
    # has looked (and found nothing) under the current one before a move collected late hands
    # it a job whose lock was taken in a session since lost (another consumer holds it now).
    (job,) = jobs_in(zk, 1, state=JobState.PROVISIONING)
    assert lock_create(other_zk, zpaths.job_node(job.jid, "lock"))
    _first, second, _one, two = two_steps(zk)
    cycle_until_idle(two)  # the job is busy: nothing taken, every holding looked at
    now = two._current()
    assert two.hand([(job, True)], Holding(now.generation, (now.session or 0) + 1))
    cycle_until_idle(two)
    assert second.seen == []  # no step under a lock this session does not hold
    assert two.holding == {} and two.kept == {}
    assert lock_owner(zk, job.jid) == other_zk.client_id[0]


def test_run_gives_kept_locks_back_when_it_stops(zk: KazooClient) -> None:
    jobs = jobs_in(zk, 3)
    keeper = LockKeeper()
    first = Step1(zk=zk, keeper=keeper, batch=3, poll=0.05)
    # A Provisioning loop that never gets to run its jobs: registered, then stopped.
    second = Step2(zk=zk, keeper=keeper, batch=3, poll=0.05)
    two = JobPipeline(second, keeper=keeper)
    keeper.register(two)
    one = JobPipeline(first, keeper=keeper)
    cycle_until_idle(one)
    assert all(lock_owner(zk, j.jid) == zk.client_id[0] for j in jobs)
    stop = threading.Event()
    stop.set()
    two.run(stop)  # stops at once: what it was handed goes back
    assert all(job_load(zk, j.jid).lock is None for j in jobs)
    assert all(job_load(zk, j.jid).state == JobState.PROVISIONING for j in jobs)


# Dividing fresh jobs between loops ---------------------------------------------------------------


def count_listings(zk: KazooClient, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Folder path -> how often ``zk`` lists it from now on (sync or async)."""
    listings: Counter[str] = Counter()
    real_sync, real_async = zk.get_children, zk.get_children_async

    def counted(path: str, *args: Any, **kwargs: Any) -> Any:
        listings[path] += 1
        return real_sync(path, *args, **kwargs)

    def counted_async(path: str, *args: Any, **kwargs: Any) -> Any:
        listings[path] += 1
        return real_async(path, *args, **kwargs)

    monkeypatch.setattr(zk, "get_children", counted)
    monkeypatch.setattr(zk, "get_children_async", counted_async)
    return listings


def refreshed(share: ClaimShare, members: int) -> bool:
    share.refresh()
    return share.members == members


def test_claim_shares_divide_every_job_between_the_loops_of_a_state(
    zk: KazooClient, other_zk: KazooClient
) -> None:
    a = ClaimShare(zk, JobState.ESTIMATING, "host-1-aaaa")
    b = ClaimShare(other_zk, JobState.ESTIMATING, "host-2-bbbb")
    a.refresh()
    b.refresh()
    wait_for(lambda: refreshed(a, 2))
    jids = [f"jid{n:010d}" for n in range(400)]
    mine_a = {j for j in jids if a.mine(j)}
    mine_b = {j for j in jids if b.mine(j)}
    assert mine_a.isdisjoint(mine_b) and mine_a | mine_b == set(jids)
    assert 120 < len(mine_a) < 280  # crc32 spreads them
    # A loop that leaves (a drain, a stop) leaves every job to the others.
    b.leave()
    wait_for(lambda: refreshed(a, 1))
    assert all(a.mine(j) for j in jids)
    assert zk.get_children(claimers_folder(JobState.ESTIMATING)) == ["host-1-aaaa"]
    # The loops of one process that keep locks take part under one name, so a job claimed at
    # its first step is the same process's at every later step.
    keeper = LockKeeper()
    one = JobPipeline(Step1(zk=zk, keeper=keeper), keeper=keeper)
    two = JobPipeline(Step2(zk=zk, keeper=keeper), keeper=keeper)
    assert one.share.member == two.share.member == keeper.member
    assert one.share.state != two.share.state


def test_a_loop_takes_other_shares_only_when_its_own_is_used_up_and_they_waited(
    zk: KazooClient, other_zk: KazooClient
) -> None:
    jobs = jobs_in(zk, 24)
    absent = ClaimShare(other_zk, JobState.ESTIMATING, "zz-busy-elsewhere")
    absent.refresh()  # a member that never claims (busy, stuck)
    worker = Step1(zk=zk, batch=4, strict=True)
    loop = JobPipeline(worker)
    loop.listing.steal_after = 3600
    wait_for(lambda: refreshed(loop.share, 2))
    own = [j.jid for j in jobs if loop.share.mine(j.jid)]
    assert 0 < len(own) < len(jobs)
    cycle_until_idle(loop)
    assert worker.seen == own  # its own share, in run order; the others' wait for their owner
    assert in_state(zk, JobState.ESTIMATING) == len(jobs) - len(own)
    # Once they have waited long enough, a loop with nothing of its own takes them.
    thief = Step1(zk=zk, batch=4, strict=True)
    loop = JobPipeline(thief)
    loop.listing.steal_after = 0.0
    wait_for(lambda: refreshed(loop.share, 2))
    cycle_until_idle(loop)
    assert sorted(thief.seen) == sorted(j.jid for j in jobs if j.jid not in own)
    assert in_state(zk, JobState.ESTIMATING) == 0


def test_a_divided_listing_sorts_out_other_shares_entries_when_it_lists(
    zk: KazooClient, other_zk: KazooClient
) -> None:
    """Other shares' entries are set aside as the folder is listed (not popped one by one at
    every listing); a kept job is taken wherever its entry falls; a busy entry is not stolen;
    nothing is stolen before it has waited ``steal_after``."""
    jobs = jobs_in(zk, 24)
    other = ClaimShare(other_zk, JobState.ESTIMATING, "zz-other")
    other.refresh()
    share = ClaimShare(zk, JobState.ESTIMATING, "aa-this")
    wait_for(lambda: refreshed(share, 2))
    names = {j.jid: zpaths.index_name(j.priority, j.jid) for j in jobs}
    own = sorted(names[j.jid] for j in jobs if share.mine(j.jid))
    foreign = sorted(names[j.jid] for j in jobs if not share.mine(j.jid))
    assert own and len(foreign) > 2
    kept_jid = foreign[0][3:]
    kept = {kept_jid: foreign[0]}

    patient = StateListing(zk, JobState.ESTIMATING, share=share, steal_after=3600)
    picks = patient.take(100, kept)
    assert [p.name for p in picks] == sorted([*own, foreign[0]])
    assert [p.kept for p in picks] == [p.jid == kept_jid for p in picks]
    assert patient.take(100, {}) == []  # the others' entries have not waited long enough

    eager = StateListing(zk, JobState.ESTIMATING, share=share, steal_after=0.0)
    eager.busy([foreign[1][3:]])  # found locked by another consumer a moment ago
    taken = eager.take(100, {}, exclude={foreign[2][3:]})
    # Its own share and, the room left, what the others left waiting: in run order.
    assert [p.name for p in taken] == sorted(own + [n for n in foreign if n not in foreign[1:3]])
    assert not any(p.kept for p in taken)
    # What was excluded (in hand) is still there to take once it no longer is.
    assert [p.name for p in eager.take(100, {})] == [foreign[2]]


def test_a_divided_listing_of_several_priorities_passes_over_busy_and_leaving_jobs(
    zk: KazooClient, other_zk: KazooClient
) -> None:
    """The listing sorts its entries with set operations on entry names: jobs known by jid
    (locked elsewhere, moving out) are passed over at whichever priority their entry has."""
    other = ClaimShare(other_zk, JobState.ESTIMATING, "zz-other")
    other.refresh()
    share = ClaimShare(zk, JobState.ESTIMATING, "aa-this")
    wait_for(lambda: refreshed(share, 2))
    jids = [f"jid{n:010d}" for n in range(1, 41)]
    names = {j: f"{'03' if n % 2 else '07'}-{j}" for n, j in enumerate(jids)}
    own = [j for j in jids if share.mine(j)]
    foreign = [j for j in jids if not share.mine(j)]
    assert len(own) > 3 and len(foreign) > 3
    listing = StateListing(zk, JobState.ESTIMATING, share=share, steal_after=0.0, strict=True)
    before = time.monotonic()
    listing.leaving([own[0], own[1]])
    listing.busy([foreign[0], foreign[1]])
    listing.listed(before, [*names.values(), "not-an-entry"], [])
    taken = [p.name for p in listing.take(100, {})]
    # Its own share and, the room left, what the others left waiting: in run order.
    assert taken == sorted(names[j] for j in own[2:] + foreign[2:])


class _Looks(dict):
    """A dict that counts its ``get`` calls (how often a listing looks at an entry's wait)."""

    looks = 0

    def get(self, key: Any, default: Any = None) -> Any:
        self.looks += 1
        return super().get(key, default)


def test_taking_over_a_big_share_looks_at_each_set_aside_entry_once(
    zk: KazooClient, other_zk: KazooClient
) -> None:
    """A loop whose own share is used up takes over a slow owner's entries some 16 a take; the
    entries its listing set aside are looked at once, not at every take (every loop of its
    thread waits while it looks), and still come in run order, each once."""
    other = ClaimShare(other_zk, JobState.ESTIMATING, "zz-other")
    other.refresh()
    share = ClaimShare(zk, JobState.ESTIMATING, "aa-this")
    wait_for(lambda: refreshed(share, 2))
    jids = [f"jid{n:010d}" for n in range(1, 3001)]
    foreign = [f"{'03' if n % 3 else '07'}-{j}" for n, j in enumerate(jids) if not share.mine(j)]
    assert len(foreign) > 1000
    for strict in (True, False):
        listing = StateListing(
            zk, JobState.ESTIMATING, share=share, steal_after=0.0, max_age=3600, strict=strict
        )
        listing._first_seen = _Looks()
        listing.listed(time.monotonic(), foreign, [])
        taken: list[str] = []
        while picks := listing.take(16, {}):
            assert len(picks) <= 16 and all(p.stolen and not p.kept for p in picks)
            taken += [p.name for p in picks]
        assert sorted(taken) == sorted(foreign)  # every one, once
        assert [n[:2] for n in taken] == sorted(n[:2] for n in taken)  # priority 03 first
        if strict:
            assert taken == sorted(foreign)
        assert listing._first_seen.looks <= len(foreign)


def test_jobs_taken_over_from_another_share_are_claimed_each_on_its_own(
    zk: KazooClient, other_zk: KazooClient
) -> None:
    """A job taken over from another share may have been locked by its owner since the
    listing: its claim fails alone, and the batch's other jobs, its own share's in one multi
    and the others taken over, are locked all the same."""
    jobs = jobs_in(zk, 24)
    other = ClaimShare(other_zk, JobState.ESTIMATING, "zz-other")
    other.refresh()
    share = ClaimShare(zk, JobState.ESTIMATING, "aa-this")
    wait_for(lambda: refreshed(share, 2))
    foreign = [j.jid for j in jobs if not share.mine(j.jid)]
    assert len(foreign) > 3
    listing = StateListing(zk, JobState.ESTIMATING, share=share, steal_after=0.0, strict=True)
    picks = listing.take(100, {})
    assert {p.jid for p in picks} == {j.jid for j in jobs}
    assert [p.stolen for p in picks] == [p.jid in foreign for p in picks]
    owners = foreign[:2]  # their owner locked them after this listing
    for jid in owners:
        other_zk.create(zpaths.job_node(jid, "lock"), b"", ephemeral=True)

    claim = PendingClaim(zk, picks, listing.folder)
    locked = claim.collect()
    assert locked == {j.jid for j in jobs} - set(owners)
    assert sorted(p.jid for p in claim.lost) == sorted(owners)
    assert not claim.fell_back and claim.fallback() is None
    session = zk.client_id[0]
    assert all(lock_owner(zk, jid) == session for jid in locked)
    assert all(lock_owner(zk, jid) == other_zk.client_id[0] for jid in owners)


def count_folder_listings(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Folder path -> how often a ``StateListing`` sends its own listing from now on."""
    listings: Counter[str] = Counter()
    real = zk_pipeline.list_children

    def counted(zk_: KazooClient, path: str, *args: Any) -> Any:
        listings[path] += 1
        return real(zk_, path, *args)

    monkeypatch.setattr(zk_pipeline, "list_children", counted)
    return listings


def test_a_large_folder_is_listed_again_less_often_while_entries_are_left(
    zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing costs in proportion to its folder: a loop with entries still in hand lists a
    large folder again only as often as LIST_RATE entries a second would (40 entries at 5 a
    second: every 8 s, not every ``max_age``), and a small one every ``max_age`` as before."""
    monkeypatch.setattr(zk_nodes, "LIST_RATE", 5)
    names = [f"05-jid{n:010d}" for n in range(1, 41)]
    listing = StateListing(zk, JobState.ESTIMATING, max_age=1.0)
    for name in names:
        zk.create(f"{listing.folder}/{name}", b"", makepath=True)
    listing.listed(time.monotonic(), names, [])
    assert listing.age_limit() == 8.0
    listings = count_folder_listings(monkeypatch)
    listing._listed_at -= 2.0  # older than max_age, younger than its age limit
    assert [p.name for p in listing.take(4, {})] == names[:4]
    assert listings[listing.folder] == 0
    for name in names[:4]:  # moved on; a listing answered before the next take shows the rest
        zk.delete(f"{listing.folder}/{name}")
    listing._listed_at -= 6.5  # older than its age limit
    assert [p.name for p in listing.take(4, {})] == names[4:8]
    assert listings[listing.folder] == 1

    small = StateListing(zk, JobState.PROVISIONING, max_age=1.0)
    small.listed(time.monotonic(), names[:4], [])
    assert small.age_limit() == 1.0
    small._listed_at -= 1.5
    small.take(4, {})
    assert listings[small.folder] == 1


def test_other_shares_entries_of_a_large_folder_wait_as_much_longer_as_its_listing(
    zk: KazooClient, other_zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry another member moved stays in a listing until the next; taken over before
    then, its claim would fail. In a folder listed every 8 s instead of every second, the other
    shares' entries are taken over after 2 + 2 x 7 = 16 s, not after ``steal_after``'s 2."""
    monkeypatch.setattr(zk_nodes, "LIST_RATE", 5)
    other = ClaimShare(other_zk, JobState.ESTIMATING, "zz-other")
    other.refresh()
    share = ClaimShare(zk, JobState.ESTIMATING, "aa-this")
    wait_for(lambda: refreshed(share, 2))
    names = [f"05-jid{n:010d}" for n in range(1, 41)]
    listing = StateListing(zk, JobState.ESTIMATING, share=share, max_age=1.0, steal_after=2.0)
    listing.listed(time.monotonic(), names, [])
    assert listing.steal_wait() == 16.0
    own = [n for n in names if share.mine(n[3:])]
    assert 0 < len(own) < len(names)
    assert [p.name for p in listing.take(len(names), {})] == own
    waits = listing.others_only()
    assert waits is not None and 12.0 < waits <= 16.0


def test_a_listing_is_sorted_again_when_members_join_or_leave_without_listing_again(
    zk: KazooClient, other_zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing sorted out while this loop claimed alone gives up the other member's entries
    as soon as that member joins, and takes them back as soon as it leaves: not a listing
    (up to ``max_age``) later, and without listing the folder again."""
    share = ClaimShare(zk, JobState.ESTIMATING, "aa-this")
    wait_for(lambda: refreshed(share, 1))
    jids = [f"jid{n:010d}" for n in range(1, 41)]
    names = {j: f"05-{j}" for j in jids}
    listing = StateListing(zk, JobState.ESTIMATING, share=share, max_age=3600, steal_after=3600)
    listing.listed(time.monotonic(), names.values(), [])
    listings = count_listings(zk, monkeypatch)
    assert [p.name for p in listing.take(1, {})] == [names[jids[0]]]
    listing.leaving([jids[0]])  # what the loop does with the jobs it took: moves them on

    other = ClaimShare(other_zk, JobState.ESTIMATING, "zz-other")
    other.refresh()
    wait_for(lambda: refreshed(share, 2))
    own = [j for j in jids[1:] if share.mine(j)]
    assert 3 < len(own) < len(jids) - 4
    kept = {jids[-1]: names[jids[-1]]}  # a kept job is this loop's whatever its share
    taken = [p.name for p in listing.take(100, kept)]
    assert taken == sorted({names[j] for j in own} | set(kept.values()))
    assert listing.others_only() is not None  # the rest: the other member's, waiting
    listing.leaving([*own, jids[-1]])

    other.leave()
    wait_for(lambda: refreshed(share, 1))
    rest = [j for j in jids[1:-1] if j not in own]
    assert rest
    assert [p.name for p in listing.take(100, {})] == [names[j] for j in rest]
    assert listings[listing.folder] == 0


def test_a_loop_left_with_other_shares_entries_does_not_list_its_folder_at_every_change(
    zk: KazooClient, other_zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once its own share is done and only entries another member has yet to take are left,
    the loop waits for the first it may take over (or the poll); it does not set its folder's
    watch again, which would list the whole folder at each of the other members' moves."""
    jobs = jobs_in(zk, 24)
    other = ClaimShare(other_zk, JobState.ESTIMATING, "zz-other")
    other.refresh()  # a member that is busy elsewhere: its share waits
    worker = Step1(zk=zk, batch=4, poll=30.0)
    loop = JobPipeline(worker)
    loop.listing.steal_after = 3600
    wait_for(lambda: refreshed(loop.share, 2))
    foreign = [j for j in jobs if not loop.share.mine(j.jid)]
    assert foreign
    folder = zpaths.job_state_folder(JobState.ESTIMATING)
    listings = count_listings(zk, monkeypatch)
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: in_state(zk, JobState.ESTIMATING) == len(foreign))
        wait_for(lambda: loop.listing.others_only() is not None)
        before = listings[folder]
        # The other member's moves: its entries leave the folder and come back, 20 changes,
        # each given time to reach the loop.
        entry = f"{folder}/{zpaths.index_name(foreign[0].priority, foreign[0].jid)}"
        for _ in range(10):
            other_zk.delete(entry)
            time.sleep(0.1)
            other_zk.create(entry, b"")
            time.sleep(0.1)
        assert listings[folder] - before <= 2, listings
        assert worker.seen == [j.jid for j in jobs if loop.share.mine(j.jid)]
    finally:
        stop.set()
        thread.join(timeout=60)


def test_an_idle_loop_stops_when_told_without_waiting_out_its_poll(zk: KazooClient) -> None:
    """A process stopping (a redeploy) does not wait for the poll of each idle loop: the loop
    looks at the stop event while it waits."""
    jobs = jobs_in(zk, 2)
    worker = Step1(zk=zk, batch=4, poll=3600.0)
    loop = JobPipeline(worker)
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    thread.start()
    wait_for(lambda: sorted(worker.seen) == sorted(j.jid for j in jobs))
    wait_for(lambda: in_state(zk, JobState.ESTIMATING) == 0)
    stop.set()
    thread.join(timeout=60)  # an hour's poll otherwise
    assert not thread.is_alive()


def test_a_thief_takes_a_run_from_the_later_half_of_the_waiting_entries(
    zk: KazooClient, other_zk: KazooClient
) -> None:
    """Their owner works from the first ones: a thief takes a run from the later half (a
    strict loop, in run order, the first)."""
    jobs = jobs_in(zk, 40)
    other = ClaimShare(other_zk, JobState.ESTIMATING, "zz-other")
    other.refresh()
    share = ClaimShare(zk, JobState.ESTIMATING, "aa-this")
    wait_for(lambda: refreshed(share, 2))
    names = sorted(zpaths.index_name(j.priority, j.jid) for j in jobs)
    own = [n for n in names if share.mine(n[3:])]
    foreign = [n for n in names if not share.mine(n[3:])]
    assert len(foreign) >= 8
    for strict in (False, True):
        listing = StateListing(zk, JobState.ESTIMATING, share=share, steal_after=0.0)
        listing.strict = strict
        assert [p.name for p in listing.take(len(own), {})] == own
        stolen = [p.name for p in listing.take(2, {})]
        if strict:
            assert stolen == foreign[:2]
        else:
            start = foreign.index(stolen[0])
            assert stolen == foreign[start : start + 2] and start >= len(foreign) // 2


def test_a_claim_share_joins_again_after_a_lost_session(zk_hosts: str, own_zk) -> None:
    client, _gate = own_zk
    share = ClaimShare(client, JobState.ESTIMATING, "host-3-cccc")
    share.refresh()
    path = f"{claimers_folder(JobState.ESTIMATING)}/host-3-cccc"
    assert client.exists(path).ephemeralOwner == client.client_id[0]
    old = client.client_id[0]
    expire_session(client, zk_hosts)
    wait_for(lambda: client.connected and client.client_id[0] != old)
    wait_for(lambda: (share.refresh(), client.exists(path))[1] is not None)
    assert client.exists(path).ephemeralOwner == client.client_id[0]
    assert share.members == 1


# Several loops in one thread (run_together) -------------------------------------------------------


class Finish(Step1):
    """Notify -> Completed: the end of a job's way, after which its batch may be complete."""

    name: ClassVar[str] = "test-notify"
    step: ClassVar[str] = "test-notify"
    state: ClassVar[str] = JobState.NOTIFY
    target: ClassVar[str] = JobState.COMPLETED


@pytest.mark.django_db
def test_loops_sharing_a_thread_are_woken_by_watches_and_hand_overs(zk: KazooClient) -> None:
    """With an hour's poll, only the folder's watch (new jobs) and the hand-over from the first
    loop (kept locks) can wake the thread: both reach a loop that shares it."""
    keeper = LockKeeper()
    ran_in: set[int] = set()

    def note(_daemon: Step1, _job: Job) -> None:
        ran_in.add(threading.get_ident())

    first = Step1(zk=zk, keeper=keeper, batch=4, poll=3600.0, action=note)
    second = Step2(zk=zk, keeper=keeper, batch=4, poll=3600.0, action=note)
    stop = threading.Event()
    loops = [first.pipeline(), second.pipeline()]
    thread = threading.Thread(target=pipeline_module.run_together, args=(loops, stop), daemon=True)
    thread.start()
    wait_for(lambda: all(loop._watch is not None and loop._watch.armed for loop in loops))
    jobs = jobs_in(zk, 10)
    wait_for(lambda: in_state(zk, JobState.DOWNLOADING) == 10)
    stop.set()
    thread.join(timeout=60)  # an hour's poll otherwise
    assert not thread.is_alive()
    assert ran_in == {thread.ident}
    assert sorted(second.seen) == sorted(j.jid for j in jobs)  # each job once
    assert all(job_load(zk, j.jid).lock is None for j in jobs)


@pytest.mark.django_db
def test_an_error_in_one_loops_turn_stops_no_loop_of_its_thread(zk: KazooClient) -> None:
    keeper = LockKeeper()
    first = Step1(zk=zk, keeper=keeper, batch=4, poll=0.05)
    second = Step2(zk=zk, keeper=keeper, batch=4, poll=0.05)
    loops = [first.pipeline(), second.pipeline()]
    looked = Counter[str]()
    real = loops[1].listing.others_only

    def others_only() -> float | None:  # a bug, once, outside the cycle
        looked["others_only"] += 1
        if looked["others_only"] == 1:
            raise RuntimeError("a bug")
        return real()

    loops[1].listing.others_only = others_only  # type: ignore[method-assign]
    stop = threading.Event()
    thread = threading.Thread(target=pipeline_module.run_together, args=(loops, stop), daemon=True)
    thread.start()
    wait_for(lambda: looked["others_only"] > 1)  # the erring loop's turns went on
    jobs_in(zk, 6)
    wait_for(lambda: in_state(zk, JobState.DOWNLOADING) == 6)
    stop.set()
    thread.join(timeout=60)
    assert not thread.is_alive()


@pytest.mark.django_db
def test_a_turn_that_would_wait_for_an_answer_returns_at_once(
    zk: KazooClient, proxy: Any, proxied_client: Any
) -> None:
    """Behind a black hole no answer comes: a turn that does not block leaves the batch it
    would have waited for in hand and says which request it waits for."""
    client = proxied_client(timeout=30)
    jobs_in(zk, 8)
    loop = JobPipeline(Step1(zk=client, batch=2))
    assert loop.cycle(fresh=True)  # listed, the first batch sent
    # Joining the claimers of the state fired the watch on their folder: they are listed again
    # now, not by a cycle behind the black hole.
    wait_for(lambda: loop.share._changed.is_set())
    loop.share.refresh()
    proxy.blackhole()
    for _ in range(10):
        if not loop.cycle(block=False):
            break
    assert loop.pending, "a batch was waited for"
    assert loop.waits_for in {b.order for b in loop.pending} | {f.order for f in loop.inflight}
    assert loop.turn(block=False) is None  # as run_together sees it
    proxy.heal()


@pytest.mark.django_db
def test_a_loops_completion_check_asks_about_the_batches_of_a_move_at_once(
    zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batches a move finished are asked about in one check sent after the move, its
    answer taken by a later cycle (``completions``), and the complete ones go to Reporting."""
    jobs = jobs_in(zk, 3, state=JobState.NOTIFY)
    for job in jobs:
        batch_transition(zk, batch_load(zk, job.bid), BatchState.PROCESSING)
    loop = JobPipeline(Finish(zk=zk, batch=3))
    asked: list[list[str]] = []
    real = CompletionCheck.complete

    def complete(check: CompletionCheck) -> list[str]:
        asked.append([bid for bid, _answer in check.asked])
        return real(check)

    monkeypatch.setattr(CompletionCheck, "complete", complete)
    cycle_until_idle(loop)
    assert [sorted(bids) for bids in asked] == [sorted(j.bid for j in jobs)]
    assert REPORTING_MOVES.settle(timeout=30)  # moved by the process's mover, not the loop
    assert {batch_load(zk, j.bid).state for j in jobs} == {BatchState.REPORTING}
    assert not loop.completions


class Slots:
    """A ``Parking``: jobs 1-4 wait under "a", 5-8 under "b", the others under none."""

    def __init__(self) -> None:
        self.free = {"a": 0, "b": 5}
        self.keyed = True

    def key(self, jid: str) -> str | None:
        number = int(jid[3:])
        return "a" if number <= 4 else "b" if number <= 8 else None

    def room(self, key: str) -> int:
        return self.free[key]

    def keys_any(self) -> bool:
        return self.keyed


def test_entries_passed_over_wait_under_their_key_until_it_has_room(zk: KazooClient) -> None:
    """Entries with a key (their depositor server) wait under it, those a listing passes over
    (a full server's jobs) too, and are taken up in run order, as many as their key has room
    for, without the folder listed again; a new listing sorts them out anew."""
    slots = Slots()
    listing = StateListing(zk, JobState.DOWNLOADING, max_age=3600)
    listing.parking = slots
    listing.skip = lambda jid: (key := slots.key(jid)) is not None and slots.free[key] <= 0
    names = [f"05-jid{n:010d}" for n in range(1, 11)]
    listing.listed(time.monotonic(), names, [])
    assert listing.parked == 8  # every job with a key waits under it, to be put back by room
    assert [p.name for p in listing.take(10, {})] == names[4:]
    assert listing.parked == 4

    slots.free["a"] = 2
    # Not listed again (the folder is empty on the server: a listing would find nothing).
    assert [p.name for p in listing.take(10, {})] == names[:2]
    assert listing.parked == 2

    asked: list[str] = []

    def full(jid: str) -> bool:
        asked.append(jid)
        return False

    assert listing.take(10, {}, limit=full) == []
    assert asked == ["jid0000000003"]  # once for the key, not for each of its entries
    assert listing.parked == 2
    slots.free["a"] = 1
    assert [p.name for p in listing.take(10, {})] == [names[2]]

    # The limit asked of a key's entries as they are put back: the first it refuses, and
    # those after it, wait for the next take.
    listing.listed(time.monotonic(), names[4:8], [])
    picks = listing.take(10, {}, limit=lambda jid: jid != "jid0000000006")
    assert [p.name for p in picks] == [names[4]]
    assert listing.parked == 3
    assert [p.name for p in listing.take(10, {})] == names[5:8]

    # Refused by the limit with no key: it waits for the next listing.
    listing.listed(time.monotonic(), names[8:], [])
    picks = listing.take(10, {}, limit=lambda jid: jid != "jid0000000009")
    assert [p.name for p in picks] == [names[9]]
    assert listing.parked == 0
    assert listing.take(10, {}) == []
    slots.free["a"] = 0
    listing.listed(time.monotonic(), names, [])
    assert listing.parked == 8

    # While the parking knows no job's key (no server full yet), a listing walks none of them:
    # every entry is taken as any job is, in run order.
    slots.keyed = False
    listing.skip = None
    listing.listed(time.monotonic(), names, [])
    assert listing.parked == 0
    assert [p.name for p in listing.take(10, {})] == names
