"""The job list's filters answered by the read index (issue 51 item 4) take exactly the jobs,
in exactly the order, that a pass over every entry of the states takes: a priority, a batch,
the stuck jobs, the jobs in their state at least some hours, one submitter in every state,
and these together, in run order, oldest first and newest first.

The reference here is worked out from the nodes themselves (each index entry's creation time,
each job's status mtime, its configuration), not from the index. "Now" is pinned for the
stuck and age filters (the modules' clocks patched to one instant), and the cut falls between
the two loads, so no job sits on it.
"""

from __future__ import annotations

import time
import types
from typing import Any

import pytest

from bench import loader
from queues.console import job_reads
from queues.core.states import JOB, JobState
from queues.operator import stuck
from queues.zk import index as zindex
from queues.zk import paths as zpaths
from queues.zk import servertime
from queues.zk.codecs import decode_json
from queues.zk.nodes import exists_many, read_many

pytestmark = pytest.mark.django_db

QUEUE = {
    JobState.COMPLETED: 0.3,
    JobState.FAILED: 0.2,
    JobState.PENDING: 0.2,
    JobState.HELD: 0.1,
    JobState.DOWNLOADING: 0.1,
    JobState.STORING: 0.1,
}


def _clock(at: float) -> Any:
    return types.SimpleNamespace(time=lambda: at, monotonic=time.monotonic, sleep=time.sleep)


@pytest.fixture
def queue(zk: Any, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    zindex.reset()
    stuck.reset()
    monkeypatch.setattr(loader, "SUBMITTERS", ("user007", "user008", "user009"))
    first = loader.bulk_load(zk, batches=40, jobs=240, distribution=QUEUE, seed=5)
    # The second load's entries are made after every one of the first's (ZooKeeper's clock
    # moves on in ms): wait for it to move past the first load's last entry.
    last = max(
        s.ctime
        for s in exists_many(
            zk, [zpaths.job_node(j, "status") for js in first.jobs_by_state.values() for j in js]
        ).values()
        if s is not None
    )
    probe = zpaths.JOBS + "/clock-probe"
    while True:
        zk.create(probe, b"")
        made = zk.exists(probe).ctime
        zk.delete(probe)
        if made > last:
            break
    second = loader.bulk_load(zk, batches=40, jobs=240, distribution=QUEUE, seed=6)
    idx = zindex.for_client(zk)
    idx.settle()
    idx.sync()
    rows = []  # (state, priority, number, jid, entry ctime s, status mtime s, submitter, bid)
    for state in JOB.states:
        entries = idx.job_entries(state)
        names = [f"{zpaths.job_state_folder(state)}/{entries.name(k)}" for k in entries.keys]
        stats = exists_many(zk, names)
        jids = [jid for _p, jid in entries]
        reads = read_many(
            zk, [zpaths.job_node(j, n) for j in jids for n in ("status", "configuration", "bid")]
        )
        for (priority, jid), name in zip(entries, names, strict=True):
            config = decode_json("c", reads[zpaths.job_node(jid, "configuration")][0])
            rows.append(
                (
                    state,
                    priority,
                    int(jid[3:]),
                    jid,
                    stats[name].ctime / 1000.0,
                    reads[zpaths.job_node(jid, "status")][1].mtime / 1000.0,
                    config["submitter"],
                    reads[zpaths.job_node(jid, "bid")][0].decode(),
                )
            )
    between = last / 1000.0 + 0.0005  # after the first load, before the second
    now = max(r[4] for r in rows) + 100.0
    settings.MRT_STUCK_SECONDS = now - between
    monkeypatch.setattr(stuck, "time", _clock(now))
    # The stuck times are judged by the ZooKeeper server's clock (queues/zk/servertime.py).
    monkeypatch.setattr(stuck, "server_now", lambda _zk: now)
    # The age filter's too (job_reads asks servertime, shown_now included).
    monkeypatch.setattr(servertime, "server_now", lambda _zk: now)
    yield types.SimpleNamespace(
        rows=rows, now=now, between=between, batches=first.batches + second.batches
    )
    zindex.reset()
    stuck.reset()


def _expected(queue: Any, flt: job_reads.JobFilter) -> list[tuple[int, str]]:
    states = [flt.state] if flt.state else [s for s in JOB.states if s != JobState.DELETED]
    found = []
    for state, priority, number, jid, ctime, mtime, submitter, bid in queue.rows:
        if state not in states:
            continue
        if flt.submitter and flt.submitter.lower() not in submitter.lower():
            continue
        if flt.priority is not None and priority != flt.priority:
            continue
        if flt.bid and bid != flt.bid:
            continue
        if flt.stuck and not (state in stuck.STATES and ctime < queue.between):
            continue
        if flt.min_age_hours and queue.now - mtime < flt.min_age_hours * 3600:
            continue
        found.append((priority, number, jid))
    if flt.sort in ("oldest", "newest"):
        found.sort(key=lambda r: (r[1], r[0]), reverse=flt.sort == "newest")
    else:
        found.sort()
    return [(p, jid) for p, _n, jid in found]


def test_every_filter_takes_the_jobs_a_pass_over_the_entries_takes(zk: Any, queue: Any) -> None:
    hours = (queue.now - queue.between) / 3600
    bid = queue.batches[len(queue.batches) // 3]
    filters = []
    for sort in ("run", "oldest", "newest"):
        for state in ("", JobState.COMPLETED, JobState.DOWNLOADING, JobState.PENDING):
            filters += [
                job_reads.JobFilter(state=state, sort=sort, priority=5),
                job_reads.JobFilter(state=state, sort=sort, priority=3),
                job_reads.JobFilter(state=state, sort=sort, bid=bid),
                job_reads.JobFilter(state=state, sort=sort, stuck=True),
                job_reads.JobFilter(state=state, sort=sort, min_age_hours=hours),
                job_reads.JobFilter(state=state, sort=sort, submitter="USER007"),
                job_reads.JobFilter(state=state, sort=sort, submitter="user007", priority=5),
                job_reads.JobFilter(state=state, sort=sort, submitter="user008", stuck=True),
                job_reads.JobFilter(state=state, sort=sort, min_age_hours=hours, priority=5),
                job_reads.JobFilter(state=state, sort=sort, min_age_hours=hours, bid=bid),
                job_reads.JobFilter(state=state, sort=sort, stuck=True, min_age_hours=hours),
            ]
    nonempty = 0
    for flt in filters:
        expected = _expected(queue, flt)
        for _again in range(3):  # picked in C, then ordered by time, then kept
            got = list(job_reads._job_entries(zk, flt))
            assert got == expected, flt
        nonempty += bool(expected)
    assert nonempty > len(filters) * 0.6
    # The cut between the loads splits them: some jobs older, some younger.
    older = _expected(queue, job_reads.JobFilter(min_age_hours=hours))
    assert 0 < len(older) < len(_expected(queue, job_reads.JobFilter()))


def test_one_batch_in_every_state_is_looked_up_not_merged_from_every_state(
    zk: Any, queue: Any
) -> None:
    """The job list of one batch in every state merged every state's entries first, then
    kept the batch's: at a million jobs a million keys sorted as ints, and 25 MiB the web
    process kept. The batch's jobs are now looked up in each state's entries."""
    idx = zindex.for_client(zk)
    bid = queue.batches[0]
    for sort in ("run", "oldest", "newest"):
        flt = job_reads.JobFilter(bid=bid, sort=sort)
        assert list(job_reads._job_entries(zk, flt)) == _expected(queue, flt)
    assert not idx._all_kept  # no merge of every state was made (or kept)


def test_the_age_filter_follows_a_job_that_moves(zk: Any, queue: Any) -> None:
    """A job moved to another state is in it from the move: off the older jobs of its old
    state at once, and not among the older ones of its new state."""
    from queues.zk import jobs as zjobs

    hours = (queue.now - queue.between) / 3600
    flt = job_reads.JobFilter(state=JobState.PENDING, min_age_hours=hours)
    before = list(job_reads._job_entries(zk, flt))
    assert before
    _p, jid = before[0]
    zjobs.job_transition(zk, zjobs.job_load(zk, jid), JobState.HELD)
    zindex.for_client(zk).settle()
    assert list(job_reads._job_entries(zk, flt)) == before[1:]
    held = job_reads.JobFilter(state=JobState.HELD, min_age_hours=hours)
    assert jid not in {j for _p, j in job_reads._job_entries(zk, held)}


def test_the_age_filter_reads_many_unknown_times_in_the_background(
    zk: Any, queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More entry times unknown than a request reads itself (a state never asked about since
    a start): the page answers from those known (none), says what is being read, and a thread
    reads them; once it is done, the answer is whole. An action on every match refuses
    meanwhile (it would miss jobs)."""
    from queues.zk.errors import StillLoading

    monkeypatch.setattr(stuck, "READ_IN_REQUEST", 10)
    stuck.reset()
    hours = (queue.now - queue.between) / 3600
    flt = job_reads.JobFilter(state=JobState.COMPLETED, min_age_hours=hours)
    entries, loading = job_reads._job_entries_loading(zk, flt)
    assert "Completed" in loading and "read" in loading
    assert len(entries) < len(_expected(queue, flt))
    reader = stuck._age_reader[0]
    if reader is not None:
        reader.join(timeout=60)
        assert not reader.is_alive()
    with pytest.raises(StillLoading):
        # Another state, unknown too: read in the background again.
        job_reads.jobs_matching(flt=job_reads.JobFilter(min_age_hours=hours))
    reader = stuck._age_reader[0]
    if reader is not None:
        reader.join(timeout=60)
    entries, loading = job_reads._job_entries_loading(zk, flt)
    assert loading == "" and list(entries) == _expected(queue, flt)
    every = job_reads.JobFilter(min_age_hours=hours)
    assert job_reads.jobs_matching(flt=every) == ([j for _p, j in _expected(queue, every)], False)


def test_the_stuck_filter_reads_many_unknown_times_in_the_background(
    zk: Any, queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The "stuck only" filter with more entry times unknown than a request reads itself (the
    first look after a start: it took 10.7 s at 1,000,000 jobs) answers from the times known
    (none), says what is being read, and a thread reads them; then the answer is whole. An
    action on every match refuses meanwhile (it would miss jobs)."""
    from queues.zk.errors import StillLoading

    monkeypatch.setattr(stuck, "READ_IN_REQUEST", 10)
    stuck.reset()
    flt = job_reads.JobFilter(state=JobState.DOWNLOADING, stuck=True)
    assert _expected(queue, flt)
    entries, loading = job_reads._job_entries_loading(zk, flt)
    assert "Downloading" in loading and "read" in loading
    assert list(entries) == []
    reader = stuck._age_reader[0]
    if reader is not None:
        reader.join(timeout=60)
        assert not reader.is_alive()
    with pytest.raises(StillLoading):
        # Another state, unknown too: read in the background again.
        job_reads.jobs_matching(flt=job_reads.JobFilter(state=JobState.STORING, stuck=True))
    reader = stuck._age_reader[0]
    if reader is not None:
        reader.join(timeout=60)
    entries, loading = job_reads._job_entries_loading(zk, flt)
    assert loading == "" and list(entries) == _expected(queue, flt)
