"""Retention against a real ZooKeeper and both databases (SQLite, PostgreSQL): finished batches
and their jobs are archived into the database, then removed from ZooKeeper in the contract's
order; locked or unfinished items are left alone; a crash between the two steps archives once;
archived jobs stay viewable and searchable; the daemon honours the age setting."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from kazoo.protocol.states import EventType

from queues.core.roles import ADMIN
from queues.daemons.registry import DAEMONS
from queues.daemons.retention import Retention
from queues.models import ArchivedBatch, ArchivedJob, ArchivedLocalId
from queues.operator import archive
from queues.operator.audit import ApiToken, AuditEntry
from queues.operator.auth import ensure_groups
from queues.zk import client as zkmod
from queues.zk import jobs as zjobs
from queues.zk import paths

NOW = timedelta(0)


def exists(zk: Any, path: str) -> bool:
    return zk.exists(path) is not None


def test_archives_rows_then_removes_in_contract_order(
    database: str, zk: Any, other_zk: Any, finished_batch: Any
) -> None:
    batch, made = finished_batch(("Completed", "Completed", "Failed"))
    AuditEntry.objects.create(
        action="resume", kind="job", item_id=made[2].jid, before="Failed", after="Estimating"
    )
    # Another client watches every node that must go, as Merritt's services would see them go.
    deleted: list[str] = []
    gone = threading.Event()
    watched = [paths.job(j.jid) for j in made]
    watched += [paths.batch(batch.bid), paths.uuid_entry(batch.uuid)]

    def seen(event: Any) -> None:
        if event.type == EventType.DELETED:
            deleted.append(event.path)
            if len(deleted) == len(watched):
                gone.set()

    for path in watched:
        assert other_zk.exists(path, watch=seen) is not None

    outcomes = list(archive.sweep(older_than=NOW))

    assert [(o.bid, o.done, o.jobs) for o in outcomes] == [(batch.bid, True, 3)]
    assert gone.wait(10), f"not every node was removed: {deleted}"
    # Jobs first (each its own transaction), then the batch with its /batch-uuids entry.
    assert set(deleted[:3]) == {paths.job(j.jid) for j in made}
    assert set(deleted[3:]) == {paths.batch(batch.bid), paths.uuid_entry(batch.uuid)}
    for job in made:
        assert not exists(zk, job.index_path)
    assert zk.get_children(paths.JOBS + "/states/completed") == []

    row = ArchivedBatch.objects.get(bid=batch.bid)
    assert (row.batch_uuid, row.final_state, row.profile) == (batch.uuid, "Failed", batch.profile)
    assert row.submitter == "dpr/Ada Lovelace" and row.title == batch.title
    assert row.failed_jobs == [made[2].jid]
    assert row.successful_jobs == sorted(j.jid for j in made[:2])
    assert row.report_modified is not None and row.last_modified is not None
    assert row.job_ids == sorted(j.jid for j in made)

    failed = ArchivedJob.objects.get(jid=made[2].jid)
    assert failed.bid == batch.bid
    assert failed.primary_id == made[2].primary_id
    assert failed.local_ids == made[2].local_ids
    assert (failed.final_state, failed.final_message) == ("Failed", "HTTP 404 on payload")
    assert failed.last_successful_status == "Provisioning"
    assert failed.retry_count == 0
    assert [s["state"] for s in failed.states] == [
        "Pending",
        "Estimating",
        "Provisioning",
        "Downloading",
        "Failed",
    ]
    assert failed.states[0]["at"] and failed.states[-1]["at"]
    assert [(a["action"], a["after"]) for a in failed.audit] == [("resume", "Estimating")]
    assert failed.nodes["configuration"]["localID"] == made[2].configuration["localID"]
    done = ArchivedJob.objects.get(jid=made[0].jid)
    assert done.final_state == "Completed"
    assert done.states[-2:][0]["state"] == "Notify" and done.states[-1]["state"] == "Completed"
    assert ArchivedJob.objects.count() == 3
    assert ArchivedLocalId.objects.filter(value=made[1].local_ids[1]).count() == 1


def test_locked_or_unfinished_items_are_left_alone(
    database: str, zk: Any, other_zk: Any, finished_batch: Any
) -> None:
    locked_job_batch, locked_jobs = finished_batch(("Completed", "Completed"), tag="lj")
    locked_batch, _ = finished_batch(("Completed",), tag="lb")
    working, _ = finished_batch(("Completed", "Storing"), batch_state="Processing", tag="w")
    # A Failed batch one of whose jobs an operator resumed: the batch is finished, a job is not.
    resumed_batch, resumed_jobs = finished_batch(("Completed", "Failed"), tag="r")
    zjobs.job_transition(zk, resumed_jobs[1], "Downloading", admin=True)
    # Consumers of another process hold these locks (ephemeral, as the contract says).
    other_zk.create(paths.job_node(locked_jobs[1].jid, "lock"), b"", ephemeral=True)
    other_zk.create(paths.batch_node(locked_batch.bid, "lock"), b"", ephemeral=True)
    ready, ready_jobs = finished_batch(("Completed",), tag="ok")

    outcomes = {o.bid: o for o in archive.sweep(older_than=NOW)}

    assert outcomes[ready.bid].done
    assert f"job {locked_jobs[1].jid} is locked" in outcomes[locked_job_batch.bid].detail
    assert outcomes[locked_batch.bid].detail == "locked"
    assert "not finished" in outcomes[resumed_batch.bid].detail
    assert working.bid not in outcomes  # a Processing batch is not even considered
    left = [locked_job_batch, locked_batch, working, resumed_batch]
    for batch in left:
        assert not outcomes.get(batch.bid, archive.ArchiveOutcome(batch.bid, "", False)).done
        assert exists(zk, paths.batch(batch.bid))
        assert not ArchivedBatch.objects.filter(bid=batch.bid).exists()
    for job in [*locked_jobs, *resumed_jobs]:
        assert exists(zk, paths.job(job.jid))
        assert not ArchivedJob.objects.filter(jid=job.jid).exists()
    assert list(ArchivedBatch.objects.values_list("bid", flat=True)) == [ready.bid]
    assert not exists(zk, paths.job(ready_jobs[0].jid))

    # Once the lock is gone, the next sweep archives that batch.
    other_zk.delete(paths.job_node(locked_jobs[1].jid, "lock"))
    again = {o.bid: o for o in archive.sweep(older_than=NOW)}
    assert again[locked_job_batch.bid].done
    assert ArchivedJob.objects.filter(bid=locked_job_batch.bid).count() == 2


def test_crash_between_archive_and_removal_archives_once(
    database: str, zk: Any, finished_batch: Any
) -> None:
    batch, made = finished_batch(("Completed", "Completed", "Failed"))
    # The first run wrote the rows, removed one job, and died.
    archive.write_rows(batch, made)
    zjobs.job_remove(zk, made[0])
    assert ArchivedJob.objects.count() == 3

    outcomes = list(archive.sweep(older_than=NOW))

    assert [(o.bid, o.done, o.jobs) for o in outcomes] == [(batch.bid, True, 2)]
    assert not exists(zk, paths.batch(batch.bid))
    assert ArchivedBatch.objects.count() == 1
    assert ArchivedJob.objects.count() == 3
    assert ArchivedLocalId.objects.count() == 6  # two local ids per job, none twice
    # The batch row still names every job, the one removed before the crash too.
    assert ArchivedBatch.objects.get().job_ids == sorted(j.jid for j in made)
    assert list(archive.sweep(older_than=NOW)) == []


def test_archived_job_and_batch_pages_search_and_api(
    database: str, zk: Any, finished_batch: Any, viewer_client: Client
) -> None:
    batch, made = finished_batch(("Completed", "Failed"))
    _live, live_jobs = finished_batch(("Completed",), batch_state="Processing", tag="live")
    list(archive.sweep(older_than=NOW))
    job = made[1]

    page = viewer_client.get(f"/jobs/{job.jid}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "read-only" in html and 'id="archived-banner"' in html
    day = ArchivedJob.objects.get(jid=job.jid).archived_at
    assert "Archived on <time" in html and f"{day.astimezone():%Y-%m-%d}" in html
    assert job.primary_id in html and "HTTP 404 on payload" in html
    assert 'id="job-actions"' not in html
    for action in ("hold", "release", "resume", "fail", "delete", "remove"):
        assert reverse("job-action", args=[job.jid, action]) not in html

    page = viewer_client.get(f"/batches/{batch.bid}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="archived-banner"' in html and made[0].jid in html and batch.uuid in html
    for action in ("release", "update-reporting", "delete", "remove"):
        assert reverse("batch-action", args=[batch.bid, action]) not in html

    for q in (job.local_ids[1], job.primary_id, job.configuration["localID"]):
        found = viewer_client.get("/jobs/", {"q": q})
        assert found.status_code == 200, q
        assert f'id="archived-row-{job.jid}"' in found.content.decode(), q
        assert f'id="archived-row-{made[0].jid}"' not in found.content.decode(), q
    by_batch = viewer_client.get("/jobs/", {"q": batch.bid}).content.decode()
    assert f'id="archived-row-{made[0].jid}"' in by_batch
    assert f'id="archived-row-{job.jid}"' in by_batch
    # An htmx search (the filter form) updates the archived section out of band.
    swapped = viewer_client.get("/jobs/", {"q": job.primary_id}, HTTP_HX_REQUEST="true",
                                HTTP_HX_TARGET="job-table").content.decode()  # fmt: skip
    assert 'hx-swap-oob="true"' in swapped and f"archived-row-{job.jid}" in swapped
    # A job still in ZooKeeper is shown live, never from the archive.
    assert (
        viewer_client.get(f"/jobs/{live_jobs[0].jid}/").content.decode().count("archived-banner")
        == 0
    )
    assert viewer_client.get("/jobs/jid9999999999/").status_code == 404
    assert viewer_client.get("/batches/bid9999999999/").status_code == 404

    user = viewer_client.get("/jobs/").wsgi_request.user
    _token, key = ApiToken.issue(user=user, name="retention")
    api = viewer_client.get(f"/api/jobs/{job.jid}", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert api.status_code == 200
    data = api.json()
    assert data["archived"] is True
    assert (data["id"], data["batch"], data["state"]) == (job.jid, batch.bid, "Failed")
    assert data["primary_id"] == job.primary_id and data["local_ids"] == job.local_ids
    batch_api = viewer_client.get(f"/api/batches/{batch.bid}", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert batch_api.json()["archived"] is True
    assert batch_api.json()["failed_jobs"] == [job.jid]


def _stopped_at(at: datetime) -> type[datetime]:
    """``datetime`` whose ``now()`` is always ``at`` (local time, as the real one's)."""

    class Stopped(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            return at if tz is None else at.astimezone(tz)

    return Stopped


def test_daemon_sweep_respects_the_age_setting(
    database: str, zk: Any, finished_batch: Any, settings: Any, caplog: Any, monkeypatch: Any
) -> None:
    older, _ = finished_batch(("Completed",), tag="a")
    # Time must pass between the two (the contract's stamps are whole seconds); the age limit
    # is then set to fall halfway, measured when it is set, so a slow first sweep cannot move
    # the newer batch past it.
    time.sleep(1.5)
    halfway = time.time()
    time.sleep(1.5)
    newer, _ = finished_batch(("Completed",), tag="b")
    daemon = Retention(zk=zk)

    settings.MRT_RETENTION_DAYS = 30
    daemon.run_once()
    assert daemon.last is not None and daemon.last.outcome == "ok"
    assert not ArchivedBatch.objects.exists()
    assert exists(zk, paths.batch(older.bid)) and exists(zk, paths.batch(newer.bid))

    # Finished before halfway: the older batch yes, the newer one not yet. The sweep's clock
    # stops where the setting is measured: on the running one the newer batch (its stamp cut
    # to the second) came inside the age 0.5 to 1.5 s later, and the sweep reaches it only
    # after archiving the older one, which can take that long on a busy machine.
    now = datetime.now()
    monkeypatch.setattr(archive, "datetime", _stopped_at(now))
    settings.MRT_RETENTION_DAYS = (now.timestamp() - halfway) / 86400
    with caplog.at_level(logging.INFO, logger="queues.daemons"):
        daemon.run_once()
    assert list(ArchivedBatch.objects.values_list("bid", flat=True)) == [older.bid]
    assert not exists(zk, paths.batch(older.bid)) and exists(zk, paths.batch(newer.bid))
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith(f"{older.bid} retention archived Completed batch, 1 jobs")
               for line in lines), lines  # fmt: skip
    assert any("1 batches (1 jobs) archived" in line for line in lines), lines


def test_queue_archive_command_and_runconsumer(database: str, zk: Any, finished_batch: Any) -> None:
    first, _ = finished_batch(("Completed", "Failed"), tag="c")
    out = StringIO()
    # By hand, archiving is made as a console user (admin, as a batch's remove) and says why.
    admin = get_user_model().objects.create_user(username="ops")
    admin.groups.add(ensure_groups()[ADMIN])
    as_ops = ("--user", "ops", "--reason", "disk space")
    call_command("queue", "archive", "--older-than-days", "30", *as_ops, stdout=out)
    assert "0 batches (0 jobs) archived" in out.getvalue()
    assert exists(zk, paths.batch(first.bid))

    call_command("queue", "archive", "--older-than-days", "0", *as_ops, stdout=out)
    assert f"batch {first.bid}: Failed, archived with 2 jobs" in out.getvalue()
    assert "1 batches (2 jobs) archived and removed from ZooKeeper" in out.getvalue()
    assert ArchivedJob.objects.filter(bid=first.bid).count() == 2
    [entry] = AuditEntry.objects.filter(action="archive")
    assert (entry.user, entry.kind, entry.item_id, entry.before, entry.after) == (
        admin,
        "batch",
        first.bid,
        "Failed",
        "archived",
    )
    assert (entry.reason, entry.via, entry.ok) == ("disk space", "command", True)

    second, _ = finished_batch(("Completed",), tag="d")
    assert "retention" in DAEMONS
    # The daemon's own one-shot pass, with the age setting at 0.
    from django.conf import settings

    old = settings.MRT_RETENTION_DAYS
    settings.MRT_RETENTION_DAYS = 0
    try:
        call_command("runconsumer", "retention", "--once")
    finally:
        settings.MRT_RETENTION_DAYS = old
    assert ArchivedBatch.objects.filter(bid=second.bid).exists()
    # runconsumer closed the process's client on its way out: ask a new one.
    assert not exists(zkmod.client(), paths.batch(second.bid))


def test_item_changed_between_archive_and_removal_stays_live(
    database: str, zk: Any, finished_batch: Any
) -> None:
    """A job that changes after the rows were written is not removed, and its row goes."""
    batch, made = finished_batch(("Completed", "Failed"))
    ready, jobs = archive.ready_to_archive(zk, batch.bid, older_than=NOW)
    archive.write_rows(ready, jobs)
    # An operator resumes the Failed job before the removal runs.
    zjobs.job_transition(zk, made[1], "Downloading", admin=True)

    done, removed, detail = archive.remove_archived(zk, ready, jobs)

    # Every job is checked before the first write: nothing is removed, the batch is as it was.
    assert not done and removed == 0 and "changed while being archived" in detail
    assert "nothing removed" in detail
    assert exists(zk, paths.job(made[0].jid)) and exists(zk, paths.job(made[1].jid))
    assert zk.get(paths.batch_node(batch.bid, "status"))[1].version == ready.status.version
    assert ArchivedJob.objects.filter(jid=made[0].jid).exists()  # unchanged: its row is right
    assert not ArchivedJob.objects.filter(jid=made[1].jid).exists()
    # Live again: shown from ZooKeeper, and the next sweep leaves the batch to its work.
    outcomes = {o.bid: o for o in archive.sweep(older_than=NOW)}
    assert "not finished" in outcomes[batch.bid].detail


@pytest.mark.parametrize("days", ["-1"])
def test_archive_refuses_negative_age(db: None, days: str) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="must be a number from 0 to 36,500"):
        call_command("queue", "archive", "--older-than-days", days)


def test_odd_text_is_archived_and_shown_as_text(
    database: str, zk: Any, finished_batch: Any, viewer_client: Client
) -> None:
    """A NUL (which PostgreSQL stores nowhere) and markup in a depositor's title and ids."""
    _batch, made = finished_batch(("Completed",), tag="<i>x</i>\x00")
    [outcome] = archive.sweep(older_than=NOW)
    assert outcome.done, outcome.detail
    row = ArchivedJob.objects.get(jid=made[0].jid)
    assert "\x00" not in row.title and row.title.startswith("Letter 0 <i>x</i>")
    html = viewer_client.get(f"/jobs/{made[0].jid}/").content.decode()
    assert "&lt;i&gt;x&lt;/i&gt;" in html and "<i>x</i>" not in html


class WaitsRecorded(threading.Event):
    """A stop event that notes how long each wait on it was asked to last."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        return super().wait(timeout)


def test_daemon_loop_sweeps_at_start_then_every_interval(
    database_for_threads: str,
    zk: Any,
    finished_batch: Any,
    settings: Any,
    django_db_blocker: Any,
) -> None:
    first, _ = finished_batch(("Completed",), tag="e")
    settings.MRT_RETENTION_DAYS = 0
    settings.MRT_RETENTION_SWEEP_SECONDS = 3600
    daemon = Retention(zk=zk, poll=0.1)
    stop = WaitsRecorded()

    def run() -> None:
        with django_db_blocker.unblock():  # the test's database, from the daemon's thread
            daemon.run(stop)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while exists(zk, paths.batch(first.bid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not exists(zk, paths.batch(first.bid))
        # The next sweep is an hour away: the loop waits the whole interval after a sweep, so a
        # batch finished now stays until then.
        second, _ = finished_batch(("Completed",), tag="f")
        while 3600 not in stop.timeouts and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stop.timeouts[-1] == 3600  # parked for the interval after its sweep
        assert exists(zk, paths.batch(second.bid))
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert ArchivedBatch.objects.filter(bid=first.bid).exists()


def test_a_lock_taken_part_way_leaves_a_deleted_batch_the_run_reports_and_the_next_finishes(
    database: str,
    zk: Any,
    other_zk: Any,
    finished_batch: Any,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    caplog: Any,
) -> None:
    """A consumer takes a job's lock after the sweep looked: the batch is not left Failed with
    jobs gone, and the run does not say "archived"; the next sweep finishes it."""
    from queues.zk import batches
    from tests.core.test_partway_removals import lock_taken_at_listing

    batch, made = finished_batch(("Completed", "Completed", "Failed"))
    made = sorted(made, key=lambda j: j.jid)
    lock_taken_at_listing(monkeypatch, other_zk, made[1].jid)
    settings.MRT_RETENTION_DAYS = 0
    daemon = Retention(zk=zk)
    with caplog.at_level(logging.INFO, logger="queues.daemons"):
        daemon.run_once()
    assert daemon.last is not None
    assert "0 batches (0 jobs) archived" in daemon.last.detail
    assert "1 batches stopped part-way" in daemon.last.detail
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        line.startswith(f"{batch.bid} retention stopped part-way: Failed batch, 1 jobs removed")
        and made[0].jid in line
        for line in lines
    ), lines
    assert batches.batch_load(zk, batch.bid).state == "Deleted"
    assert [exists(zk, paths.job(j.jid)) for j in made] == [False, True, True]
    row = ArchivedBatch.objects.get(bid=batch.bid)
    assert row.final_state == "Failed"
    assert ArchivedJob.objects.filter(bid=batch.bid).count() == 3

    # Once the lock is gone the next sweep finishes it, whatever the age asked: its row keeps
    # what was archived (not the Deleted mark).
    other_zk.delete(paths.job_node(made[1].jid, "lock"))
    [again] = list(archive.sweep(older_than=timedelta(days=30)))
    assert (again.bid, again.done, again.jobs) == (batch.bid, True, 2)
    assert not exists(zk, paths.batch(batch.bid))
    assert not any(exists(zk, paths.job(j.jid)) for j in made)
    row = ArchivedBatch.objects.get(bid=batch.bid)
    assert (row.final_state, row.job_ids) == ("Failed", sorted(j.jid for j in made))
