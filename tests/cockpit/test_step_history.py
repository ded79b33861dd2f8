"""Step records: written by a background thread in batches, never one insert per step; what a
real daemon run records; pruned after MRT_STEP_HISTORY_DAYS."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from queues.daemons.runner import Host
from queues.daemons.stephistory import StepRecorder, prune
from queues.models import StepRecord
from queues.zk.jobs import job_load

from .conftest import record, wait_for


def _add(recorder: StepRecorder, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        recorder.add(
            kind="job",
            item_id=f"jid{i:010d}",
            step="estimating",
            state="Estimating",
            outcome="ok",
            started=time.time(),
            duration=0.01,
            waited=0.5,
        )


@pytest.mark.django_db(transaction=True)
def test_records_are_written_in_batches_by_row_count(database_for_threads) -> None:
    recorder = StepRecorder(consumer="h-1", host="h", flush_seconds=60, flush_rows=5)
    recorder.start()
    try:
        _add(recorder, 4)
        # Nothing written per step: the rows wait in memory (a flush would have taken them),
        # and the one batch counted below holds all five.
        assert recorder.pending == 4
        assert StepRecord.objects.count() == 0
        _add(recorder, 1, start=4)
        wait_for(lambda: StepRecord.objects.count() == 5, timeout=10)
        assert recorder.batches == 1
        _add(recorder, 3, start=5)
    finally:
        recorder.stop()  # writes what waits
    assert StepRecord.objects.count() == 8
    assert recorder.batches == 2
    row = StepRecord.objects.get(item_id="jid0000000000")
    assert (row.kind, row.step, row.state, row.outcome, row.host) == (
        "job",
        "estimating",
        "Estimating",
        "ok",
        "h",
    )
    assert row.hour == int(row.started.timestamp() // 3600)


@pytest.mark.django_db(transaction=True)
def test_records_are_written_in_batches_by_time(database_for_threads) -> None:
    recorder = StepRecorder(flush_seconds=0.3, flush_rows=500)
    recorder.start()
    try:
        _add(recorder, 7)
        wait_for(lambda: StepRecord.objects.count() == 7, timeout=10)
        assert recorder.batches == 1  # one statement for the seven
    finally:
        recorder.stop()


@pytest.mark.django_db(transaction=True)
def test_a_daemon_run_records_every_step(zk, make_job, settings) -> None:
    settings.MRT_CONSUMER_PUBLISH_SECONDS = 0.2
    job = make_job("Pending")
    host = Host("pending", poll=0.1)
    stop = threading.Event()
    thread = threading.Thread(target=host.run, args=(stop,))
    thread.start()
    try:
        wait_for(lambda: job_load(zk, job.jid).state == "Estimating", timeout=30)
    finally:
        stop.set()
        thread.join(timeout=30)
        host.close()
    (row,) = StepRecord.objects.filter(item_id=job.jid)
    assert (row.kind, row.step, row.state, row.outcome) == ("job", "pending", "Pending", "ok")
    assert row.duration >= 0 and row.waited is not None and row.waited >= 0
    assert row.consumer == host.observer.name and row.host == host.observer.host
    assert "Estimating" in row.detail


def test_records_older_than_the_retention_are_pruned(database, settings) -> None:
    settings.MRT_STEP_HISTORY_DAYS = 30
    now = datetime.now(UTC)
    StepRecord.objects.bulk_create(
        [
            record(item_id="jid0000000001", started=now - timedelta(days=40)),
            record(item_id="jid0000000002", started=now - timedelta(days=31)),
            record(item_id="jid0000000003", started=now - timedelta(days=29)),
            record(item_id="jid0000000004", started=now - timedelta(hours=1)),
        ]
    )
    assert prune() == 2
    assert sorted(StepRecord.objects.values_list("item_id", flat=True)) == [
        "jid0000000003",
        "jid0000000004",
    ]
    settings.MRT_STEP_HISTORY_DAYS = 0.5
    assert prune() == 1


@pytest.mark.django_db
def test_the_job_timeline_puts_steps_and_operator_actions_in_one_time_order(
    admin, zk, make_job
) -> None:
    import re
    from datetime import UTC, datetime, timedelta

    from django.urls import reverse

    from queues.models import AuditEntry, StepRecord

    from .conftest import record

    job = make_job("Failed")
    now = datetime.now(UTC)
    StepRecord.objects.bulk_create(
        [
            record(item_id=job.jid, step="estimating", started=now - timedelta(minutes=9)),
            record(
                item_id=job.jid,
                step="downloading",
                state="Downloading",
                outcome="failed",
                started=now - timedelta(minutes=7),
                duration=12.0,
                host="ingest-9",
                detail="-> Failed: HTTP 404",
            ),
        ]
    )
    AuditEntry.objects.create(
        username="admin-user",
        action="hold",
        kind="job",
        item_id=job.jid,
        at=now - timedelta(minutes=8),
    )
    page = admin.get(reverse("job", args=[job.jid])).content.decode()
    timeline = page[page.index('id="job-timeline"') :]
    timeline = timeline[: timeline.index("</ol>")]
    order = re.findall(r"<strong>([^<]+)</strong>", timeline)
    steps = [i for i, what in enumerate(order) if what.startswith(("estimating", "downloading"))]
    held = next(i for i, what in enumerate(order) if what.startswith("hold"))
    assert steps[0] < held < steps[1], order
    assert "downloading in Downloading: failed, 12.0 s" in timeline
    assert "ingest-9" in timeline and "HTTP 404" in timeline


@pytest.mark.django_db
def test_a_start_is_written_as_django_would_write_it() -> None:
    """The start's database value, made without Django's time zone checks where the database
    is SQLite in UTC, is the one Django's own adaptation gives, to the microsecond."""
    from django.db import connection

    from queues.daemons import stephistory
    from queues.daemons.stephistory import started_value

    stamp = started_value()
    if connection.vendor == "sqlite":  # the settings' UTC: the text made here, not by Django
        assert stamp is stephistory._sqlite_utc
    adapt = connection.ops.adapt_datetimefield_value
    instants = [0.0, 1.5, -1.25, 1_764_806_400.0, 1_764_806_400.000_001, 1_764_806_400.999_9995]
    instants += [1_764_806_400 + n / 7 for n in range(200)]  # fractions of every rounding
    instants += [1_764_806_400 + n / 2_000_000 for n in range(1, 8)]  # halves of a microsecond
    instants += [1_764_806_400.999_999_6, 1_764_806_399.999_999_5, 4_102_444_800.5]
    for started in instants:
        assert stamp(started) == adapt(datetime.fromtimestamp(started, UTC)), started
        assert stamp(started) == adapt(datetime.fromtimestamp(started, UTC)), started  # kept


@pytest.mark.django_db(transaction=True)
def test_a_record_reads_back_with_its_start(database_for_threads) -> None:
    recorder = StepRecorder(consumer="h-1", host="h", flush_seconds=60)
    started = 1_764_806_400.123_456
    recorder.add("job", "jid0000000001", "estimating", "Estimating", "ok", started, 0.01)
    assert recorder.flush() == 1
    row = StepRecord.objects.get(item_id="jid0000000001")
    assert row.started == datetime.fromtimestamp(started, UTC)
    assert row.hour == int(started // 3600)


def _rows(n: int, start: int = 0) -> list[tuple]:
    now = time.time()
    return [
        ("job", f"jid{i:010d}", "storing", "Storing", "ok", now, 0.01, 0.5, 4096, "")
        for i in range(start, start + n)
    ]


def test_a_batch_of_rows_wakes_the_writer_once_as_they_reach_the_flush_size() -> None:
    """``add_many`` (a batched loop's batch): the writer is woken when the rows waiting reach
    ``flush_rows``, once; rows added past that do not wake it again (each wake-up was a thread
    switch), and a flush that takes them starts the count again."""
    recorder = StepRecorder(consumer="h-1", host="h", flush_seconds=60, flush_rows=5)
    recorder.add_many(_rows(3))
    assert not recorder._wake.is_set()
    recorder.add_many(_rows(4, start=3))  # 3 -> 7: crosses 5
    assert recorder._wake.is_set() and recorder.pending == 7
    recorder._wake.clear()
    recorder.add_many(_rows(2, start=7))  # already past: no second wake-up
    assert not recorder._wake.is_set()
    with recorder._lock:
        recorder._rows = []  # what a flush does with them
    recorder.add_many(_rows(5, start=9))
    assert recorder._wake.is_set()


def test_rows_past_the_pending_limit_are_counted_dropped(monkeypatch) -> None:
    from queues.daemons import stephistory

    monkeypatch.setattr(stephistory, "MAX_PENDING", 10)
    recorder = StepRecorder(consumer="h-1", host="h", flush_seconds=60, flush_rows=500)
    recorder.add_many(_rows(8))
    recorder.add_many(_rows(5, start=8))
    recorder.add(
        kind="job", item_id="jid9", step="s", state="S", outcome="ok", started=0.0, duration=0.0
    )
    assert recorder.pending == 10
    assert recorder.dropped == 4
    with recorder._lock:
        kept = [row[1] for row in recorder._rows]
    assert kept == [f"jid{i:010d}" for i in range(10)]  # the first ones, in order


@pytest.mark.django_db(transaction=True)
def test_an_observer_ends_a_batch_of_jobs_in_one_hand_over(
    zk, make_job, database_for_threads
) -> None:
    """A batched loop's records: ``begin_many`` / ``end_many`` count and record each job as
    ``begin`` / ``end`` one by one would, failures included."""
    from queues.daemons.estimating import Estimating
    from queues.daemons.registration import ProcessObserver
    from queues.daemons.shared import ItemResult

    daemon = Estimating(zk=zk)
    observer = ProcessObserver(zk, [daemon], record=True, host="h", pid=1)
    jobs = [job_load(zk, make_job("Estimating").jid) for _ in range(3)]
    tokens = observer.begin_many(daemon, jobs)
    assert observer.snapshot()["threads"][0]["item"] == jobs[-1].jid  # the last one taken on
    outcomes = ["ok", "failed", "ok"]
    observer.end_many(
        [
            (token, ItemResult(job.jid, "estimating", outcome, 0.02, "detail"))
            for token, job, outcome in zip(tokens, jobs, outcomes, strict=True)
        ]
    )
    assert (observer.handled, observer.failed) == (3, 1)
    assert "item" not in observer.snapshot()["threads"][0]
    assert observer.recorder is not None
    assert observer.recorder.flush() == 3
    rows = {r.item_id: r for r in StepRecord.objects.all()}
    assert {jid: rows[jid].outcome for jid in rows} == {
        job.jid: outcome for job, outcome in zip(jobs, outcomes, strict=True)
    }
    assert {r.state for r in rows.values()} == {"Estimating"}
    assert all(r.waited is not None and r.waited >= 0 for r in rows.values())
