"""A database outage is not a job's failure (issue 23, item 4).

A PostgreSQL server of the test's own is stopped under the Recording daemon (local inventory
and the step history write to it) and started again; a SQLite file is held by a second, real
connection in ``BEGIN EXCLUSIVE`` while Recording writes. No job fails: each waits in its step,
the reason shown in the step's result and history, and completes once the database is back.
While PostgreSQL is down the console answers 503 with the outage banner (pages, htmx, the API)
and ``/healthz`` says the database is unreachable.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from daemons.conftest import FileServer, daemon, drive, make_job, wait_for
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connections
from django.db.utils import load_backend
from django.test import Client, override_settings
from live.conftest import api_token, console_env, daphne

from queues.chaos.infra import InfraError, Postgres
from queues.core.transient import is_transient
from queues.daemons.bulk_runs import BulkRuns
from queues.daemons.registration import ProcessObserver
from queues.daemons.stephistory import StepRecorder
from queues.models import ApiToken, BulkRun, InventoryObject, StepRecord
from queues.operator.auth import ensure_groups
from queues.zk.jobs import job_load
from queues.zk.records import Job
from tests.pg import default_database

from .conftest import SSO_SETTINGS

# One worker runs this module's tests (tests/workers.py's TOGETHER): its module fixture is made
# once, not once on each worker that is given one of them.


@contextlib.contextmanager
def database(settings_dict: dict[str, Any]) -> Iterator[None]:
    """Django's default database is ``settings_dict`` for this thread and every thread started
    meanwhile (the daemon's, its step history writer, the health probe)."""
    complete = connections.configure_settings({"default": settings_dict})["default"]
    old_connection, old_settings = connections["default"], connections.settings["default"]
    connections.settings["default"] = complete
    connections["default"] = load_backend(complete["ENGINE"]).DatabaseWrapper(complete, "default")
    try:
        yield
    finally:
        connections["default"].close()
        connections.settings["default"] = old_settings
        connections["default"] = old_connection


@pytest.fixture(scope="module")
def own_pg(django_db_blocker: Any) -> Iterator[tuple[Postgres, str]]:
    """A PostgreSQL cluster this module may stop and start, with a migrated database."""
    try:
        cluster = Postgres.started()
    except InfraError as exc:
        pytest.skip(str(exc))
    try:
        url = cluster.create_database("mrt_outage")
        with django_db_blocker.unblock(), default_database(url):
            call_command("migrate", verbosity=0, interactive=False)
        yield cluster, url
    finally:
        cluster.stop()
        cluster.remove()


@pytest.fixture
def on_pg(own_pg: tuple[Postgres, str], django_db_blocker: Any) -> Iterator[Postgres]:
    cluster, url = own_pg
    with django_db_blocker.unblock(), default_database(url):
        try:
            yield cluster
        finally:
            if not cluster.data.joinpath("postmaster.pid").exists():
                cluster.start()
            call_command("flush", verbosity=0, interactive=False)


def recording_job(zk: Any, files: FileServer, name: str) -> Job:
    """A job Storing has stored, waiting in Recording."""
    job = make_job(
        zk,
        {"payload_url": files.put(name, f"content of {name}"), "type": "file", "filename": name},
        state="Downloading",
    )
    drive(
        zk,
        lambda: job_load(zk, job.jid).state == "Recording",
        names=["downloading", "processing", "storing"],
    )
    return job_load(zk, job.jid)


@pytest.mark.parametrize("batch", [1, 4], ids=["one-job-loop", "batched-loop"])
def test_jobs_wait_out_a_postgresql_stop_in_recording_and_all_complete(
    zk: Any, files: FileServer, on_pg: Postgres, batch: int
) -> None:
    jobs = [recording_job(zk, files, f"file-{n}.txt") for n in range(4)]
    recording = daemon(zk, "recording", batch=batch)
    assert recording.batched() == (batch > 1)
    observer = ProcessObserver(zk, [recording], record=True, publish_seconds=0.5)
    recording.observer = observer
    stop = threading.Event()
    thread = threading.Thread(
        target=recording.run, args=(stop,), name="recording-under-test", daemon=True
    )
    on_pg.stop()
    observer.start()
    thread.start()
    try:
        try:
            wait_for(lambda: observer.handled >= 1, timeout=60, every=0.05)
            assert observer.failed == 0
            assert {job_load(zk, j.jid).state for j in jobs} == {"Recording"}
        finally:
            on_pg.start()
        wait_for(lambda: {job_load(zk, j.jid).state for j in jobs} == {"Notify"}, timeout=60)
    finally:
        stop.set()
        thread.join(timeout=30)
        observer.stop()
    arks = {job_load(zk, j.jid).primary_id for j in jobs}
    assert set(InventoryObject.objects.filter(ark__in=arks).values_list("ark", flat=True)) == arks
    # The history kept the waits it could not write during the outage, with their reason.
    records = StepRecord.objects.filter(step="recording")
    assert set(records.filter(outcome="ok").values_list("item_id", flat=True)) == {
        j.jid for j in jobs
    }
    waits = records.filter(outcome="waiting")
    assert waits.exists()
    assert all(
        d.startswith("database unavailable:") for d in waits.values_list("detail", flat=True)
    )
    assert not records.filter(outcome="failed").exists()


def test_pages_and_the_api_answer_503_with_the_banner_while_postgresql_is_down(
    zk: Any, on_pg: Postgres
) -> None:
    user = get_user_model().objects.create_user(username="viewer-outage", password="x" * 20)
    user.groups.add(ensure_groups()["viewer"])
    _token, key = ApiToken.issue(user=user, name="outage")
    browser = Client()
    browser.force_login(user)
    htmx = Client(HTTP_HX_REQUEST="true")
    htmx.force_login(user)
    assert browser.get("/").status_code == 200
    on_pg.stop()
    try:
        page = browser.get("/")
        assert page.status_code == 503
        assert page["Retry-After"]
        assert b"database is unreachable" in page.content
        assert b'data-outage="database"' in page.content  # the banner, which polls by itself
        fragment = htmx.get("/jobs/")
        assert fragment.status_code == 503
        assert b'hx-swap-oob="true"' in fragment.content
        assert b'data-outage="database"' in fragment.content
        # The banner every page polls shows the outage too (and goes on polling).
        polled = htmx.get("/health/zk/")
        assert b'data-outage="database"' in polled.content
        assert b"hx-get=" in polled.content
        api = Client().get("/api/overview", HTTP_AUTHORIZATION=f"Bearer {key}")
        assert api.status_code == 503
        assert api.json()["error"].startswith("the database is unavailable")
        health = Client().get("/healthz")
        assert health.status_code == 503
        assert health.json()["database"] == "unreachable"
        assert health.json()["zookeeper"] == "connected"
    finally:
        on_pg.start()
    wait_for(lambda: Client().get("/healthz").status_code == 200, timeout=30)
    assert browser.get("/").status_code == 200


@override_settings(**SSO_SETTINGS)
def test_a_single_sign_on_page_answers_503_while_postgresql_is_down(
    zk: Any, on_pg: Postgres
) -> None:
    # The SSO login runs in a middleware, before any view: Django makes its error a 500 page,
    # which the outage middleware answers as the 503.
    user = get_user_model().objects.create_user(username="sso-outage")
    user.groups.add(ensure_groups()["viewer"])
    browser = Client(raise_request_exception=False)
    assert browser.get("/", HTTP_X_REMOTE_USER="sso-outage").status_code == 200
    on_pg.stop()
    try:
        page = Client(raise_request_exception=False).get("/", HTTP_X_REMOTE_USER="sso-outage")
        assert page.status_code == 503
        assert b'data-outage="database"' in page.content
    finally:
        on_pg.start()


def _get(url: str, token: str = "") -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.live_server
def test_daphne_answers_503_while_postgresql_is_down_and_200_after(
    zk_hosts: str, own_pg: tuple[Postgres, str], tmp_path: Path
) -> None:
    # The console as it runs, under daphne (ASGI), on a database of its own in the cluster.
    cluster, _url = own_pg
    env = console_env(
        zk_hosts,
        tmp_path,
        user="admin-outage",
        password="p" * 20,
        DATABASE_URL=cluster.create_database("mrt_outage_daphne"),
    )
    key = api_token(env, tmp_path / "key", user="admin-outage", name="outage")
    with daphne(env, tmp_path / "daphne.log") as base:
        assert _get(f"{base}/api/overview", key)[0] == 200
        cluster.stop()
        try:
            # Whichever part meets the outage first (daphne's body limit checks a token's
            # sender before Django sees the request) says it is the database.
            status, text = _get(f"{base}/api/overview", key)
            assert status == 503, text
            assert "database" in text
            status, text = _get(f"{base}/healthz")
            assert status == 503
            assert json.loads(text)["database"] == "unreachable"
        finally:
            cluster.start()
        wait_for(lambda: _get(f"{base}/api/overview", key)[0] == 200, timeout=60)
        assert _get(f"{base}/healthz")[0] == 200


def test_the_step_history_logs_an_outage_once_and_writes_what_it_kept(
    on_pg: Postgres, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = StepRecorder(consumer="outage-test", host="here")
    on_pg.stop()
    try:
        for n in range(5):
            recorder.add(
                kind="job",
                item_id=f"jid{n:010d}",
                step="recording",
                state="Recording",
                outcome="waiting",
                started=time.time(),
                duration=0.1,
                detail="database unavailable: test",
            )
            with caplog.at_level(logging.INFO, logger="queues.daemons"):
                assert recorder.flush() == 0
    finally:
        on_pg.start()
    with caplog.at_level(logging.INFO, logger="queues.daemons"):
        assert wait_for(recorder.flush, timeout=30) == 5
    lines = [r for r in caplog.records if r.getMessage().startswith("step history")]
    assert [r.levelno for r in lines] == [logging.WARNING, logging.INFO], [
        r.getMessage() for r in lines
    ]
    assert StepRecord.objects.filter(consumer="outage-test").count() == 5


def test_the_bulk_runs_daemon_waits_out_a_database_outage_then_does_its_run(
    zk: Any, on_pg: Postgres, caplog: pytest.LogCaptureFixture
) -> None:
    operator = get_user_model().objects.create_user(username="operator-outage")
    operator.groups.add(ensure_groups()["operator"])
    run = BulkRun.objects.create(
        user=operator, kind="job", action="resume", items=[["jid0000000001", None]], total=1
    )
    loop = BulkRuns(zk=zk, poll=0.05)
    on_pg.stop()
    try:
        with caplog.at_level(logging.INFO, logger="queues.daemons"):
            for _attempt in range(3):
                assert loop.run_once() is False
    finally:
        on_pg.start()
    with caplog.at_level(logging.INFO, logger="queues.daemons"):
        wait_for(loop.run_once, timeout=60)
    run.refresh_from_db()
    assert run.owner == loop.owner
    assert run.state == BulkRun.FINISHED, run.error  # its one item skipped: no such job
    # Only the daemon's own words: a client another test left behind may still log its
    # reconnects (kazoo's "Connection dropped") into the same capture.
    outage = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("queues.")
    ]
    assert len(outage) == 1 and "database unavailable" in outage[0], outage


def test_only_errors_a_wait_cures_count_as_an_outage(
    on_pg: Postgres, own_pg: tuple[Postgres, str], tmp_path: Path
) -> None:
    from django.db import IntegrityError, ProgrammingError, connection

    InventoryObject.objects.create(ark="ark:/99999/fk4outage")
    with pytest.raises(IntegrityError) as duplicate:
        InventoryObject.objects.create(ark="ark:/99999/fk4outage")
    assert not is_transient(duplicate.value)
    with pytest.raises(ProgrammingError) as missing, connection.cursor() as cursor:
        cursor.execute("SELECT * FROM no_such_table")
    assert not is_transient(missing.value)
    # Two serializable transactions that each read what the other writes: one must retry.
    _cluster, url = own_pg
    with psycopg.connect(url) as first, psycopg.connect(url) as second:
        first.execute("CREATE TABLE pair (id int PRIMARY KEY, v int)")
        first.execute("INSERT INTO pair VALUES (1, 0), (2, 0)")
        first.commit()
        for conn in (first, second):
            conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            conn.execute("SELECT sum(v) FROM pair").fetchall()
        first.execute("UPDATE pair SET v = 1 WHERE id = 1")
        second.execute("UPDATE pair SET v = 1 WHERE id = 2")
        first.commit()
        with pytest.raises(psycopg.errors.SerializationFailure) as raced:
            second.commit()
        second.rollback()
        first.execute("DROP TABLE pair")
        first.commit()
    assert is_transient(raced.value)
    plain = sqlite3.connect(tmp_path / "plain.sqlite3")
    with pytest.raises(sqlite3.OperationalError) as no_table:
        plain.execute("SELECT * FROM no_such_table")
    plain.close()
    assert not is_transient(no_table.value)
    with pytest.raises(FileNotFoundError) as absent:
        (tmp_path / "absent").open()
    assert not is_transient(absent.value)


# ---- SQLite held by another writer ---------------------------------------------------------


@pytest.fixture
def sqlite_file(tmp_path: Path, django_db_blocker: Any) -> Iterator[Path]:
    """The console's SQLite settings on a file of the test's own, migrated, with a short busy
    timeout (the wait a writer gives another before "database is locked")."""
    path = tmp_path / "console.sqlite3"
    configured = settings.DATABASES["default"]
    own = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": path,
        "OPTIONS": {**configured.get("OPTIONS", {}), "timeout": 0.5},
    }
    with django_db_blocker.unblock(), database(own):
        call_command("migrate", verbosity=0, interactive=False)
        yield path


def test_recording_waits_while_another_writer_holds_sqlite_then_completes(
    zk: Any, files: FileServer, sqlite_file: Path
) -> None:
    job = recording_job(zk, files, "locked.txt")
    recording = daemon(zk, "recording")
    holder = sqlite3.connect(sqlite_file, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        recording.run_once()
        waited = recording.last
        assert waited is not None
        assert waited.outcome == "waiting", waited.line()
        assert "database is locked" in waited.detail
        assert job_load(zk, job.jid).state == "Recording"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    recording.run_once()
    assert recording.last is not None and recording.last.outcome == "ok", recording.last
    done = job_load(zk, job.jid)
    assert done.state == "Notify"
    assert InventoryObject.objects.filter(ark=done.primary_id).exists()


def test_the_api_and_healthz_answer_503_while_another_writer_holds_sqlite(
    zk: Any, sqlite_file: Path
) -> None:
    user = get_user_model().objects.create_user(username="viewer-locked")
    user.groups.add(ensure_groups()["viewer"])
    _token, key = ApiToken.issue(user=user, name="locked")
    api = Client()
    assert api.get("/api/overview", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    holder = sqlite3.connect(sqlite_file, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        # Reading the token is fine; noting its use is a write, which waits and is refused.
        answer = api.get("/api/overview", HTTP_AUTHORIZATION=f"Bearer {key}")
        assert answer.status_code == 503
        assert "database is locked" in answer.json()["error"]
        health = Client().get("/healthz")
        assert health.status_code == 503
        assert health.json()["database"] == "locked"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert api.get("/api/overview", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    wait_for(lambda: Client().get("/healthz").status_code == 200, timeout=30)


def test_the_api_under_a_url_prefix_answers_its_outage_in_json(zk: Any, sqlite_file: Path) -> None:
    """Served under ``/queue`` (daphne's ``--root-path``), an API request's path has the prefix
    in front of ``/api/``: its 503 was the console's HTML page, not the API's JSON."""
    user = get_user_model().objects.create_user(username="viewer-prefixed")
    user.groups.add(ensure_groups()["viewer"])
    _token, key = ApiToken.issue(user=user, name="prefixed")
    api = Client(SCRIPT_NAME="/queue", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert api.get("/api/overview").status_code == 200
    holder = sqlite3.connect(sqlite_file, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        answer = api.get("/api/overview")
        assert answer.status_code == 503
        assert answer["Content-Type"] == "application/json"
        assert "database is locked" in answer.json()["error"]
    finally:
        holder.execute("ROLLBACK")
        holder.close()


@pytest.mark.slow
def test_a_consumer_started_while_the_database_is_down_waits_for_it(
    own_pg: tuple[Postgres, str], zk_hosts: str, tmp_path: Path
) -> None:
    """Chaos run: consumers started (after a SIGKILL) while PostgreSQL was down exited with a
    traceback from their migration check, and their steps waited on whatever restarted them."""
    from daemons.test_end_to_end import Consumers

    cluster, url = own_pg
    consumers = Consumers(tmp_path / "var", zk_hosts)
    consumers.env["DATABASE_URL"] = url
    cluster.stop()
    try:
        proc = consumers.start("estimating", "--poll", "0.5")
        log = consumers.procs[-1][1]
        wait_for(lambda: "retrying in" in log.read_text(), timeout=60)
        assert "database unavailable" in log.read_text()
        assert proc.poll() is None, consumers.logs()
    finally:
        cluster.start()
    try:
        wait_for(lambda: "estimating: started" in log.read_text(), timeout=120)
        assert "Traceback" not in log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, consumers.logs()
    finally:
        consumers.close()
