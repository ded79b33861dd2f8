"""The batched loop of a step as long as its object (processing, storing, recording:
``JobDaemon.workers``, ``pipeline.LONG_WAIT``): fast steps move in batches, a long one never
keeps claimed jobs waiting behind it, and ``runconsumer`` builds it so."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kazoo.client import KazooClient

from queues.core.states import JobState
from queues.daemons import pipeline as pipeline_module
from queues.daemons import runner
from queues.daemons.base import JobDaemon
from queues.daemons.downloading import Downloading
from queues.daemons.fetching import HOST_SLOTS, SERVER_KEYS
from queues.daemons.pipeline import JobPipeline, LockKeeper
from queues.daemons.registry import DAEMONS
from queues.daemons.shared import ItemResult, Next
from queues.services.depositors import depositor_policy
from queues.zk import paths as zpaths
from queues.zk.jobs import job_load
from queues.zk.kazoo_private import Multi
from queues.zk.locks import queue_hold_clear, queue_hold_set
from queues.zk.records import Job

from .conftest import FileServer, make_job, wait_for
from .test_batched import Step1, Step2, cycle_until_idle, in_state, jobs_in, lock_owner


class Long(Step1):
    """Estimating -> Provisioning as a long step's loop would run it, noting each outcome."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.outcomes: list[tuple[str, str, str]] = []

    def log_result(self, result: ItemResult) -> None:
        self.outcomes.append((result.id, result.outcome, result.detail))
        super().log_result(result)

    def log_moved(self, results: list[ItemResult]) -> None:
        self.outcomes.extend((r.id, r.outcome, r.detail) for r in results)
        super().log_moved(results)


@contextmanager
def running(*daemons: JobDaemon) -> Iterator[None]:
    stop = threading.Event()
    threads = [threading.Thread(target=d.run, args=(stop,)) for d in daemons]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(t.is_alive() for t in threads)


def test_fast_steps_of_a_long_steps_loop_are_claimed_and_moved_in_batches(
    zk: KazooClient,
) -> None:
    jobs_in(zk, 1, state=JobState.PROVISIONING)  # the target folder exists
    jobs = jobs_in(zk, 40)
    sent: Counter[str] = Counter()
    real_send = Multi.send

    def counting(self: Any) -> Any:
        sent["multi"] += 1
        return real_send(self)

    daemon = Long(zk=zk, batch=8, workers=1, poll=0.05)
    assert daemon.batched()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Multi, "send", counting)
        with running(daemon):
            wait_for(lambda: in_state(zk, JobState.PROVISIONING) == 41)
    # One job a thread until a step was timed, then as many as a thread begins within LONG_WAIT
    # (a batch at most): one claim and one move a batch, not one of each a job (80).
    assert sent["multi"] <= 30, sent
    assert sorted(daemon.seen) == sorted(j.jid for j in jobs)
    assert all(job_load(zk, j.jid).lock is None for j in jobs)


def test_jobs_claimed_behind_a_long_step_go_back_for_another_consumer(
    zk: KazooClient, other_zk: KazooClient
) -> None:
    released = threading.Event()
    blocker: list[str] = []

    def slow_for_the_blocker(_daemon: Any, item: Job) -> None:
        if item.jid in blocker:
            released.wait(120)

    ours = Long(zk=zk, batch=8, workers=1, poll=0.05, action=slow_for_the_blocker)
    theirs = Long(zk=other_zk, batch=1, poll=0.05)
    with running(ours):
        # Steps timed first: then a claim takes a batch, as fast steps deserve.
        jobs_in(zk, 3)
        wait_for(lambda: in_state(zk, JobState.PROVISIONING) == 3)
        # The next claim takes the long step's job (first in run order) and six behind it: they
        # are made while the queue is held, and the release lets the loop see all seven at once.
        queue_hold_set(zk, "ingest")
        first = jobs_in(zk, 1, priority=1)[0]
        blocker.append(first.jid)
        behind = jobs_in(zk, 6, priority=5)
        queue_hold_clear(zk, "ingest")
        wait_for(lambda: lock_owner(zk, first.jid) == zk.client_id[0])
        # Its thread is taken by the long step: the others go back to the folder, unlocked...
        wait_for(
            lambda: (
                all(
                    job_load(zk, j.jid).state == JobState.ESTIMATING
                    and lock_owner(zk, j.jid) is None
                    for j in behind
                )
                and any(o[1] == "waiting" for o in ours.outcomes)
            )
        )
        # ... and another consumer takes them while the long step goes on.
        with running(theirs):
            wait_for(lambda: in_state(zk, JobState.PROVISIONING) == 3 + 6)
        assert not released.is_set() and lock_owner(zk, first.jid) == zk.client_id[0]
        assert sorted(theirs.seen) == sorted(j.jid for j in behind)
        given_back = {o[0] for o in ours.outcomes if o[1] == "waiting"}
        assert given_back <= {j.jid for j in behind}
        assert not set(ours.seen) & {j.jid for j in behind}
        released.set()
        wait_for(lambda: job_load(zk, first.jid).state == JobState.PROVISIONING)
    assert job_load(zk, first.jid).lock is None


def test_runconsumer_runs_the_long_steps_in_the_batched_loop_with_their_copies_as_threads(
    settings: Any,
) -> None:
    settings.MRT_BATCH_LONG_STEPS = True
    for name in runner.LONG_STEPS:
        cls = DAEMONS[name]
        assert issubclass(cls, JobDaemon)
        assert runner.instances(cls, 3) == 1
        keeper = LockKeeper()
        loop = runner.job_loop(cls, keeper, 3)
        assert loop["workers"] == 3 and loop["keeper"] is keeper
        assert cls(zk=object(), **loop).batched()
    settings.MRT_BATCH_LONG_STEPS = False
    cls = DAEMONS["storing"]
    assert runner.instances(cls, 3) == 3
    assert not cls(zk=object(), **runner.job_loop(cls, None, 3)).batched()


def test_a_downloading_loop_holds_no_more_of_a_servers_jobs_than_its_cap_and_gives_every_slot_back(
    zk: KazooClient, files: FileServer, settings: Any
) -> None:
    settings.MRT_DOWNLOADS_PER_HOST = 1
    url = files.put("a.txt", "a")
    jobs = [
        make_job(zk, {"payload_url": url, "type": "file"}, state=JobState.DOWNLOADING)
        for _ in range(6)
    ]
    server = SERVER_KEYS.key(url, depositor_policy())
    under_way: list[int] = []
    daemon = Downloading(zk=zk, poll=0.05, batch=8, workers=4)
    real_work = daemon.work

    def noting(item: Job) -> Any:
        under_way.append(HOST_SLOTS.busy(server))
        return real_work(item)

    daemon.work = noting  # type: ignore[method-assign]
    assert daemon.batched()
    with running(daemon):
        wait_for(
            lambda: all(job_load(zk, j.jid).state == JobState.PROCESSING for j in jobs), timeout=120
        )
    # One download from that server at a time (its cap), though four threads were free, and
    # every slot given back: the loop took the others as slots came free.
    assert under_way == [1] * 6
    assert HOST_SLOTS.busy(server) == 0


def test_a_downloading_loop_passes_over_a_full_servers_jobs_without_claiming_one(
    zk: KazooClient, files: FileServer, settings: Any
) -> None:
    settings.MRT_DOWNLOADS_PER_HOST = 1
    full_url = "http://127.0.0.2:9/a.txt"  # its one slot taken below: nothing is fetched from it
    waiting = [
        make_job(zk, {"payload_url": full_url, "type": "file"}, state=JobState.DOWNLOADING)
        for _ in range(30)
    ]
    # Made last, so behind all of them in run order: the loop has looked at theirs first.
    other = make_job(
        zk, {"payload_url": files.put("b.txt", "b"), "type": "file"}, state=JobState.DOWNLOADING
    )
    locked: list[str] = []
    for job in waiting:
        lock = zpaths.job_node(job.jid, "lock")
        assert zk.exists(lock, watch=lambda event: locked.append(event.path)) is None
    full = SERVER_KEYS.key(full_url, depositor_policy())
    assert HOST_SLOTS.try_take(full, 1)  # a download from that server under way
    try:
        with running(Downloading(zk=zk, poll=0.05, batch=8, workers=2)):
            wait_for(lambda: job_load(zk, other.jid).state == JobState.PROCESSING, timeout=120)
    finally:
        HOST_SLOTS.give_back(full)
    # The jobs' server was read from their configurations, in bulk: none was claimed to learn
    # it (before, each was locked, read and given back: three requests a job).
    assert locked == []
    assert {job_load(zk, j.jid).state for j in waiting} == {JobState.DOWNLOADING}


def test_jobs_go_on_to_downloading_with_their_locks_only_while_their_server_has_a_slot(
    zk: KazooClient, settings: Any
) -> None:
    """A job kept for the downloading loop whose depositor server has no slot left would be
    given back at once (``Downloading.accept``): it goes on unlocked instead, and the slots the
    move's own kept jobs will take count."""
    settings.MRT_DOWNLOADS_PER_HOST = 2
    zk.ensure_path(zpaths.job_state_folder(JobState.DOWNLOADING))
    busy_url, free_url = "http://127.0.0.2:9/a.txt", "http://127.0.0.3:9/b.txt"
    jobs = [
        make_job(zk, {"payload_url": url, "type": "file"}, state=JobState.PROVISIONING)
        for url in [busy_url] * 4 + [free_url] * 3
    ]
    busy = SERVER_KEYS.key(busy_url, depositor_policy())
    assert HOST_SLOTS.try_take(busy, 2)  # one of its two slots taken by a download under way
    keeper = LockKeeper()
    one = JobPipeline(Step2(zk=zk, keeper=keeper, batch=8), keeper=keeper)
    two = JobPipeline(Downloading(zk=zk, keeper=keeper, batch=8, workers=8), keeper=keeper)
    two.begin()  # registers with the keeper
    try:
        two.cycle()  # says how many it takes (its folder empty: it takes nothing itself)
        assert two.room_for_hand() == 8
        cycle_until_idle(one)
        assert in_state(zk, JobState.DOWNLOADING) == 7
        owners = [lock_owner(zk, j.jid) for j in jobs]
        me = zk.client_id[0]
        # The busy server's one free slot: its first job kept, the rest unlocked; the free
        # server's two slots: its first two kept.
        assert owners == [me] + [None] * 3 + [me, me, None]
        assert [job.jid for job, _h, _c in two._handed] == [jobs[i].jid for i in (0, 4, 5)]
    finally:
        HOST_SLOTS.give_back(busy)
        two.end()
    assert all(lock_owner(zk, j.jid) is None for j in jobs)


def test_a_downloading_claim_takes_no_more_of_a_servers_jobs_than_its_free_slots(
    zk: KazooClient, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim takes as many of a server's jobs as it has slots free, not a batch of them of
    which ``accept`` would give all but those back (and the slot each gives back would wake the
    loop for the next such claim)."""
    settings.MRT_DOWNLOADS_PER_HOST = 2
    claimed = claims_counted(monkeypatch)
    urls = {
        "full": "http://127.0.0.2:9/a.txt",  # both slots taken below
        "one free": "http://127.0.0.3:9/b.txt",  # one of two taken below
        "free": "http://127.0.0.4:9/c.txt",
    }
    jobs = {
        name: [
            make_job(zk, {"payload_url": url, "type": "file"}, state=JobState.DOWNLOADING)
            for _ in range(4)
        ]
        for name, url in urls.items()
    }
    servers = {name: SERVER_KEYS.key(url, depositor_policy()) for name, url in urls.items()}
    taken = [servers["full"], servers["full"], servers["one free"]]
    for server in taken:
        assert HOST_SLOTS.try_take(server, 2)
    daemon = Downloading(zk=zk, batch=16, workers=8)
    daemon.work = lambda item: Next(JobState.PROCESSING)  # type: ignore[method-assign]
    loop = daemon.pipeline()
    loop.begin()
    try:
        loop.cycle()  # one claim: the listing's screen read the jobs' servers (one was full)
        mine = {name: [j.jid for j in made if j.jid in claimed] for name, made in jobs.items()}
        assert {name: len(jids) for name, jids in mine.items()} == {
            "full": 0,
            "one free": 1,
            "free": 2,
        }
        assert mine["one free"] == [jobs["one free"][0].jid]  # in run order
    finally:
        loop.end()
        for server in taken:
            HOST_SLOTS.give_back(server)
    assert all(HOST_SLOTS.busy(s) == 0 for s in servers.values())


class LongNext(Step2):
    """Provisioning -> Downloading as a long step's loop runs it, a step held up at will."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.release = threading.Event()
        self.release.set()
        self.began: list[str] = []

    def work(self, item: Job) -> Any:
        self.began.append(item.jid)
        self.release.wait(120)
        return super().work(item)


def claims_counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    claimed: list[str] = []
    real = pipeline_module.PendingClaim

    def counting(zk_: KazooClient, picks: list[Any], folder: str) -> Any:
        claimed.extend(p.jid for p in picks)
        return real(zk_, picks, folder)

    monkeypatch.setattr(pipeline_module, "PendingClaim", counting)
    return claimed


def long_after_short(zk: KazooClient, workers: int) -> tuple[JobPipeline, JobPipeline, LongNext]:
    keeper = LockKeeper()
    one = JobPipeline(Step1(zk=zk, keeper=keeper, batch=8), keeper=keeper)
    second = LongNext(zk=zk, keeper=keeper, batch=8, workers=workers)
    two = JobPipeline(second, keeper=keeper)
    keeper.register(one)
    two.begin()  # its step threads, and it registers with the keeper
    return one, two, second


def cycled(loop: JobPipeline, done: Any) -> Any:
    """Wait for ``done`` while cycling ``loop`` (its steps end in threads of its own)."""

    def check() -> Any:
        loop.cycle()
        return done()

    return wait_for(check, every=0.02)


def test_a_long_steps_loop_takes_jobs_with_their_locks_as_its_free_threads_begin_them(
    zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs_in(zk, 1, state=JobState.DOWNLOADING)  # the last folder exists
    jobs = jobs_in(zk, 5)
    claimed = claims_counted(monkeypatch)
    one, two, second = long_after_short(zk, workers=2)
    try:
        two.cycle()  # says how many jobs it takes: a job a thread, no step timed yet
        assert two.room_for_hand() == 2
        cycle_until_idle(one)
        # Two jobs (the first in run order) went on with their locks kept, the others without.
        owners = [lock_owner(zk, j.jid) for j in jobs]
        assert owners == [zk.client_id[0]] * 2 + [None] * 3
        assert [job.jid for job, _h, _c in two._handed] == [j.jid for j in jobs[:2]]
        assert two.room_for_hand() == 0
        del claimed[:]
        cycled(two, lambda: in_state(zk, JobState.DOWNLOADING) == 6)
        # The kept ones were not claimed again; the others were, by the long step's loop.
        assert sorted(claimed) == sorted(j.jid for j in jobs[2:])
        assert sorted(second.seen) == sorted(j.jid for j in jobs)
        assert all(lock_owner(zk, j.jid) is None for j in jobs)
    finally:
        two.end()


def test_a_long_steps_loop_with_every_thread_taken_takes_no_job_with_its_lock(
    zk: KazooClient, other_zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its threads are under a long step: a job kept for it would wait; it goes on unlocked,
    and another consumer takes it meanwhile."""
    monkeypatch.setattr(pipeline_module, "LONG_WAIT", 0.2)
    jobs_in(zk, 1, state=JobState.DOWNLOADING)
    [slow] = jobs_in(zk, 1)
    one, two, second = long_after_short(zk, workers=1)
    try:
        second.release.clear()
        two.cycle()
        cycle_until_idle(one)
        two._absorb()
        cycled(two, lambda: second.began == [slow.jid])  # its one thread under the step
        # Under way longer than LONG_WAIT: no thread begins anything soon.
        cycled(two, lambda: two._long_overdue() == 1)
        assert two.room_for_hand() == 0
        behind = jobs_in(zk, 3)
        one.cycle(fresh=True)  # a new listing
        cycle_until_idle(one)
        assert all(job_load(zk, j.jid).state == JobState.PROVISIONING for j in behind)
        assert all(lock_owner(zk, j.jid) is None for j in behind)
        theirs = Step2(zk=other_zk, batch=8, poll=0.05)
        with running(theirs):
            wait_for(lambda: in_state(zk, JobState.DOWNLOADING) == 4)
        assert sorted(theirs.seen) == sorted(j.jid for j in behind)
        assert lock_owner(zk, slow.jid) == zk.client_id[0]
    finally:
        second.release.set()
        cycled(two, lambda: job_load(zk, slow.jid).state == JobState.DOWNLOADING)
        two.end()
    assert lock_owner(zk, slow.jid) is None


def test_jobs_kept_for_a_long_steps_loop_go_back_once_its_threads_are_taken(
    zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline_module, "LONG_WAIT", 0.2)
    jobs_in(zk, 1, state=JobState.DOWNLOADING)
    jobs = jobs_in(zk, 2)
    one, two, second = long_after_short(zk, workers=2)
    try:
        second.release.clear()
        two.cycle()
        cycle_until_idle(one)
        assert all(lock_owner(zk, j.jid) == zk.client_id[0] for j in jobs)
        two._absorb()
        # Taken in as kept, then (as if its threads had been taken meanwhile) not begun: the
        # next cycle gives its lock back rather than keep it waiting.
        monkeypatch.setattr(two, "_long_begins", lambda: 0)
        two.cycle()
        assert not two.kept and not two.pending and not two.stepping
        assert all(lock_owner(zk, j.jid) is None for j in jobs)
        assert all(job_load(zk, j.jid).state == JobState.PROVISIONING for j in jobs)
        assert second.began == []
    finally:
        second.release.set()
        two.end()


def test_fast_steps_share_a_task_and_a_long_one_is_cut_out_of_it(
    zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps shorter than a hand-over to a thread go to the threads a batch at a time; the jobs
    behind one that turns out long in its task go on in the loop's other thread."""
    monkeypatch.setattr(pipeline_module, "LONG_WAIT", 0.2)
    released = threading.Event()
    blocker: list[str] = []
    tasks: list[int] = []
    real_submit = JobPipeline._submit

    def noting(self: JobPipeline, stepping: Any, *, first: bool = False) -> None:
        tasks.append(len(stepping.works))
        real_submit(self, stepping, first=first)

    monkeypatch.setattr(JobPipeline, "_submit", noting)

    def slow_for_the_blocker(_daemon: Any, item: Job) -> None:
        if item.jid in blocker:
            released.wait(120)

    daemon = Long(zk=zk, batch=8, workers=2, poll=0.05, action=slow_for_the_blocker)
    with running(daemon):
        jobs_in(zk, 3)  # timed first: a step of microseconds
        wait_for(lambda: in_state(zk, JobState.PROVISIONING) == 3)
        del tasks[:]
        queue_hold_set(zk, "ingest")
        first = jobs_in(zk, 1, priority=1)[0]
        blocker.append(first.jid)
        behind = jobs_in(zk, 5, priority=5)
        queue_hold_clear(zk, "ingest")
        # All six in one task; the five behind the long step go on without it.
        wait_for(lambda: all(job_load(zk, j.jid).state == JobState.PROVISIONING for j in behind))
        assert tasks[0] == 6 and tasks[1:] == [1] * 5, tasks
        assert job_load(zk, first.jid).state == JobState.ESTIMATING
        assert lock_owner(zk, first.jid) == zk.client_id[0]
        released.set()
        wait_for(lambda: job_load(zk, first.jid).state == JobState.PROVISIONING)
    assert job_load(zk, first.jid).lock is None


def test_a_long_steps_loop_is_not_held_back_by_a_full_next_loop(
    zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its jobs the next loop has no room for go on unlocked, for any consumer: the loop does
    not keep its jobs (locked) waiting for that room, as a short step's loop does."""
    monkeypatch.setattr(pipeline_module, "KEEP_ROOM", 1)
    jobs_in(zk, 1, state=JobState.PROVISIONING)
    jobs = jobs_in(zk, 4)
    keeper = LockKeeper()
    one = JobPipeline(Long(zk=zk, keeper=keeper, batch=1, workers=1), keeper=keeper)
    two = JobPipeline(Step2(zk=zk, keeper=keeper, batch=1), keeper=keeper)
    keeper.register(two)
    one.begin()
    try:
        cycled(one, lambda: in_state(zk, JobState.PROVISIONING) == 5)
        assert not one.throttled
        # The first went on with its lock (the next loop's room), the others without.
        owners = [lock_owner(zk, j.jid) for j in jobs]
        assert owners == [zk.client_id[0]] + [None] * 3
    finally:
        one.end()
