"""An operator's write and its audit entry when the database is away (nothing unaudited).

Every console and API action moves ZooKeeper through ``actions.perform`` and writes its audit
entry in the database. With the database refusing writes before the action (SQLite held by
another writer, PostgreSQL stopped) the action is refused with the outage's 503 and nothing
moves; with it going away between the move and the entry (PostgreSQL stopped there), the entry
is kept and written once the database answers again, never lost. The database-only writes that
record a row and its entry (a note, a token, a bulk run) write both or neither.

The one hook, as in test_bulk_run_outage.py: the test holds the request at the audit until the
server is down, so the outage strikes between the move and the entry however fast the machine is.
"""

from __future__ import annotations

import io
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from daemons.conftest import DEMO, wait_for
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.urls import reverse

from queues.chaos.infra import Postgres
from queues.core.states import JOB_STEPS
from queues.models import ApiToken, AuditEntry, BulkRun, Note
from queues.operator import actions, audit
from queues.operator.auth import ensure_groups
from queues.zk.batches import batch_create
from queues.zk.jobs import job_create, job_load, job_transition

from .test_transient_database import on_pg, own_pg, sqlite_file  # noqa: F401


@pytest.fixture(autouse=True)
def _nothing_kept() -> Iterator[None]:
    """What one test kept through its outage is not written into the next test's database."""
    yield
    with audit._kept_lock:
        audit._kept.clear()


def pending_job(zk: Any) -> str:
    batch = batch_create(zk, submission={"profile": DEMO, "submitter": "tester"})
    return job_create(zk, bid=batch.bid, configuration={"profile": DEMO, "type": "file"}).jid


def failed_job(zk: Any) -> str:
    jid = pending_job(zk)
    job = job_transition(zk, job_load(zk, jid), JOB_STEPS[1])
    job_transition(zk, job, "Failed", message="HTTP 404 on payload")
    return jid


def operator(name: str = "operator-audit-outage") -> Any:
    user = get_user_model().objects.create_user(username=name)
    user.groups.add(ensure_groups()["operator"])
    return user


def signed_in(user: Any) -> Client:
    browser = Client()
    browser.force_login(user)
    return browser


# ---- SQLite held by another writer: refused before the move ---------------------------------


def test_a_job_hold_is_refused_with_nothing_moved_while_another_writer_holds_sqlite(
    zk: Any,
    sqlite_file: Path,  # noqa: F811
) -> None:
    user = operator()
    browser = signed_in(user)
    jid = pending_job(zk)
    holder = sqlite3.connect(sqlite_file, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        # The session is read (WAL lets a reader in); the audit entry is a write, which waits.
        answer = browser.post(reverse("job-action", args=[jid, "hold"]))
        assert answer.status_code == 503
        assert b'data-outage="database"' in answer.content
        assert job_load(zk, jid).state == "Pending"  # nothing moved without its entry
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert not AuditEntry.objects.filter(item_id=jid).exists()
    # The next request, the database back, works without a restart.
    again = browser.post(reverse("job-action", args=[jid, "hold"]))
    assert again.status_code in (200, 303)
    assert job_load(zk, jid).state == "Held"
    assert AuditEntry.objects.filter(item_id=jid, action="hold", ok=True).count() == 1


def test_the_api_refuses_a_resume_with_nothing_moved_while_another_writer_holds_sqlite(
    zk: Any,
    sqlite_file: Path,  # noqa: F811
) -> None:
    user = operator("operator-api-locked")
    _token, key = ApiToken.issue(user=user, name="locked")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    jid = failed_job(zk)
    holder = sqlite3.connect(sqlite_file, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        answer = api.post(f"/api/jobs/{jid}/resume", "{}", content_type="application/json")
        assert answer.status_code == 503
        assert answer.json()["error"].startswith("the database is unavailable")
        assert job_load(zk, jid).state == "Failed"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    answer = api.post(f"/api/jobs/{jid}/resume", "{}", content_type="application/json")
    assert answer.status_code == 200, answer.content
    assert AuditEntry.objects.filter(item_id=jid, action="resume", ok=True).count() == 1


# ---- PostgreSQL stopped between the move and its audit entry --------------------------------


def hold_after_the_move(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Hold the request once ``actions.apply`` has made its move, before the audit entry,
    until the test says the server is down; returns (held, go on)."""
    real: Callable[..., Any] = actions.apply
    held, resume = threading.Event(), threading.Event()

    def holding(*args: Any, **kwargs: Any) -> Any:
        outcomes = real(*args, **kwargs)
        if not held.is_set():
            held.set()
            assert resume.wait(60), "the test never took the server down"
        return outcomes

    monkeypatch.setattr(actions, "apply", holding)
    return held, resume


def test_a_move_whose_entry_meets_a_postgresql_stop_is_audited_once_the_database_is_back(
    zk: Any,
    on_pg: Postgres,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user = operator("operator-pg-stop")
    jid = failed_job(zk)
    held, resume = hold_after_the_move(monkeypatch)
    answers: list[Any] = []

    def post() -> None:
        answers.append(signed_in(user).post(reverse("job-action", args=[jid, "resume"])))

    request = threading.Thread(target=post, name="resume-under-outage")
    request.start()
    try:
        assert held.wait(60)
        assert job_load(zk, jid).state == JOB_STEPS[1]  # the move is made
        on_pg.stop()
        resume.set()
        request.join(60)
        assert not request.is_alive()
        assert answers[0].status_code == 303  # done: the answer is the view's own
        assert audit.kept(), "the entry the outage refused is kept, not dropped"
    finally:
        resume.set()
        if not on_pg.data.joinpath("postmaster.pid").exists():
            on_pg.start()
        connection.close()  # the test's own, cut by the stop
    # The database back, the next write in this process writes what was kept first.
    other = pending_job(zk)
    assert signed_in(user).post(reverse("job-action", args=[other, "hold"])).status_code in (
        200,
        303,
    )
    assert not audit.kept()
    entry = AuditEntry.objects.get(item_id=jid, action="resume")
    assert entry.ok and entry.username == "operator-pg-stop"
    assert entry.after == JOB_STEPS[1]
    assert "failed in" in entry.detail
    assert AuditEntry.objects.filter(item_id=other, action="hold").count() == 1


def test_an_inline_bulk_cut_by_a_postgresql_stop_says_what_it_did_and_audits_it_once_back(
    zk: Any,
    on_pg: Postgres,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user = operator("operator-bulk-cut")
    _token, key = ApiToken.issue(user=user, name="bulk-cut")
    jids = [failed_job(zk) for _ in range(3)]
    held, resume = hold_after_the_move(monkeypatch)
    answers: list[Any] = []

    def post() -> None:
        body = json.dumps({"action": "resume", "jobs": jids})
        answers.append(
            Client(HTTP_AUTHORIZATION=f"Bearer {key}").post(
                "/api/jobs/bulk", body, content_type="application/json"
            )
        )

    request = threading.Thread(target=post, name="bulk-under-outage")
    request.start()
    try:
        assert held.wait(60)
        on_pg.stop()
        resume.set()
        request.join(60)
        assert not request.is_alive()
    finally:
        resume.set()
        if not on_pg.data.joinpath("postmaster.pid").exists():
            on_pg.start()
        connection.close()
    # The first job was resumed; the second met the outage before its move, and the answer
    # says so rather than "nothing was changed".
    answer = answers[0]
    assert answer.status_code == 503
    error = answer.json()["error"]
    assert error.startswith("the database is unavailable")
    assert "part of what was asked was done" in error and "nothing was changed" not in error
    states = [job_load(zk, jid).state for jid in jids]
    assert states == [JOB_STEPS[1], "Failed", "Failed"]
    wait_for(lambda: Client().get("/healthz").status_code == 200, timeout=30)
    # The first request once the database answers writes what was kept, whatever it asks.
    assert not audit.kept()
    assert list(AuditEntry.objects.filter(action="resume").values_list("item_id", flat=True)) == [
        jids[0]
    ]


def test_the_outage_answer_of_a_request_that_changed_nothing_says_so(
    zk: Any,
    sqlite_file: Path,  # noqa: F811
) -> None:
    user = operator("operator-nothing")
    _token, key = ApiToken.issue(user=user, name="nothing")
    browser, jid = signed_in(user), pending_job(zk)
    holder = sqlite3.connect(sqlite_file, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        answer = Client(HTTP_AUTHORIZATION=f"Bearer {key}").get("/api/overview")
        page = browser.post(reverse("job-action", args=[jid, "hold"]))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert answer.status_code == 503
    assert answer.json()["error"].endswith("; nothing was changed")
    assert page.status_code == 503 and b"Nothing was changed." in page.content


# ---- Database-only writes: the row and its entry, both or neither ---------------------------


def hold_the_entry(
    monkeypatch: pytest.MonkeyPatch, owner: Any
) -> tuple[threading.Event, threading.Event]:
    """Hold the first ``owner.record`` (the audit entry written after the row) until the
    test says the server is down; returns (held, go on)."""
    real: Callable[..., Any] = owner.record
    held, resume = threading.Event(), threading.Event()

    def holding(*args: Any, **kwargs: Any) -> Any:
        if not held.is_set():
            held.set()
            assert resume.wait(60), "the test never took the server down"
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, "record", holding)
    return held, resume


def cut_between_row_and_entry(
    on_pg: Postgres,  # noqa: F811
    held: threading.Event,
    resume: threading.Event,
    write: Callable[[], Any],
) -> list[Any]:
    """Run ``write`` in a thread, stop PostgreSQL while it is held at its audit entry; the
    answers (or the exception) it gave."""
    answers: list[Any] = []

    def run() -> None:
        try:
            answers.append(write())
        except Exception as exc:
            answers.append(exc)

    thread = threading.Thread(target=run, name="write-under-outage")
    thread.start()
    try:
        assert held.wait(60)
        on_pg.stop()
        resume.set()
        thread.join(60)
        assert not thread.is_alive()
    finally:
        resume.set()
        if not on_pg.data.joinpath("postmaster.pid").exists():
            on_pg.start()
        connection.close()
    return answers


def test_a_note_and_its_entry_are_written_both_or_neither_across_a_postgresql_stop(
    zk: Any,
    on_pg: Postgres,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from queues.console import notes

    user = operator("operator-note-cut")
    jid = pending_job(zk)
    held, resume = hold_the_entry(monkeypatch, notes)
    answers = cut_between_row_and_entry(
        on_pg,
        held,
        resume,
        lambda: signed_in(user).post(
            reverse("note-add", kwargs={"kind": "job", "item_id": jid}),
            {"text": "waiting on the depositor"},
        ),
    )
    assert answers[0].status_code == 503
    assert not Note.objects.filter(item_id=jid).exists()  # not a note with no entry
    assert not AuditEntry.objects.filter(item_id=jid).exists()


def test_a_token_and_its_entry_are_written_both_or_neither_across_a_postgresql_stop(
    on_pg: Postgres,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user = operator("operator-token-cut")
    held, resume = hold_the_entry(monkeypatch, audit)
    answers = cut_between_row_and_entry(
        on_pg,
        held,
        resume,
        lambda: signed_in(user).post(reverse("token-create"), {"name": "cut"}),
    )
    assert answers[0].status_code == 503
    assert not ApiToken.objects.filter(name="cut").exists()  # not a token nobody audited


def test_a_bulk_run_and_its_entry_are_written_both_or_neither_across_a_postgresql_stop(
    zk: Any,
    on_pg: Postgres,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from queues.operator import bulkrun

    user = operator("operator-run-cut")
    jids = [failed_job(zk) for _ in range(2)]
    held, resume = hold_the_entry(monkeypatch, audit)
    answers = cut_between_row_and_entry(
        on_pg,
        held,
        resume,
        lambda: bulkrun.start(
            user=user, kind="job", action="resume", items=[(j, None) for j in jids]
        ),
    )
    assert isinstance(answers[0], Exception)
    assert not BulkRun.objects.exists()  # no run for a daemon to do with no entry of its own


# ---- The maintenance daemon: a window's release and its entry --------------------------------


def test_a_window_released_while_sqlite_is_held_is_audited_once_it_is_free(
    zk: Any,
    sqlite_file: Path,  # noqa: F811
) -> None:
    from datetime import UTC, datetime, timedelta

    from queues.daemons.maintenance import Maintenance
    from queues.zk.maintenance import node_held, node_hold_set, window_set

    node_hold_set(zk, 9511)
    window_set(zk, "node", "9511", until=datetime.now(UTC) - timedelta(seconds=1), reason="fix")
    daemon = Maintenance(zk=zk, poll=0.05)
    holder = sqlite3.connect(sqlite_file, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        assert daemon.run_once()
        assert not node_held(zk, 9511)  # the window's end is kept whatever the database does
        assert len(audit.kept()) == 1  # and its entry with it, not dropped
        daemon.run_once()  # still held: still kept
        assert len(audit.kept()) == 1
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    daemon.run_once()
    assert not audit.kept()
    entry = AuditEntry.objects.get(kind="node", item_id="9511")
    assert (entry.action, entry.after, entry.reason, entry.via) == (
        "release",
        "released",
        "fix",
        "daemon",
    )


def test_the_queue_commands_cleanup_moves_nothing_while_another_writer_holds_sqlite(
    zk: Any,
    sqlite_file: Path,  # noqa: F811
) -> None:
    # As the console's actions: a sweep of the operator command checks the database takes
    # writes before it takes anything away (before, every Completed batch went, unaudited).
    from django.core.management import call_command

    from queues.zk.batches import batch_ids, batch_load, batch_transition

    admin = get_user_model().objects.create_user(username="admin-sweep")
    admin.groups.add(ensure_groups()["admin"])
    batch = batch_create(zk, submission={"profile": DEMO, "submitter": "tester"})
    for state in ("Processing", "Reporting", "Completed"):
        batch = batch_transition(zk, batch_load(zk, batch.bid), state)
    args = ("queue", "cleanup", "--user", admin.username, "--reason", "housekeeping")
    holder = sqlite3.connect(sqlite_file, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(Exception, match=r"locked|unavailable"):
            call_command(*args, stdout=io.StringIO(), stderr=io.StringIO())
        assert batch_ids(zk) == [batch.bid]  # nothing taken away without its entry
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert not AuditEntry.objects.filter(item_id=batch.bid).exists()
    call_command(*args, stdout=io.StringIO(), stderr=io.StringIO())
    assert batch_ids(zk) == []
    assert AuditEntry.objects.filter(item_id=batch.bid, action="cleanup", ok=True).exists()
