"""An outage in the middle of a bulk run does not fail it (issue 23, "transient is not permanent").

The bulk-runs daemon runs in a thread over Failed jobs of a real ZooKeeper, resuming them one by
one. Part-way through, the test stops ZooKeeper (a server of its own) or PostgreSQL (a cluster
of its own). The run is not Failed and skips nothing: it waits at the item it was on, its page
saying why, and once the server is back the same daemon finishes it, every job resumed once
and audited once.

The one hook: the test holds the daemon at one item until the server is down, so that the
outage strikes mid-run (before that item's move, or between its move and its audit) however
fast or slow the machine is.
"""

from __future__ import annotations

import logging
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
from queues.daemons.bulk_runs import BulkRuns
from queues.models import AuditEntry, BulkRun
from queues.operator import actions
from queues.operator.auth import ensure_groups
from queues.services.zkserver import LocalZooKeeper, free_port
from queues.zk import client as zkmod
from queues.zk.batches import batch_create
from queues.zk.jobs import job_create, job_load, job_transition

from .test_transient_database import on_pg, own_pg  # noqa: F401

ITEMS = 6
HELD_AT = 3  # the item (1-based) the daemon is held at while the server goes away


def failed_jobs(zk: Any, count: int) -> list[str]:
    """Jobs that failed in Downloading, for a bulk resume."""
    batch = batch_create(zk, submission={"profile": DEMO, "submitter": "tester"})
    jids = []
    for _ in range(count):
        job = job_create(zk, bid=batch.bid, configuration={"profile": DEMO, "type": "file"})
        job = job_transition(zk, job, JOB_STEPS[1])
        job = job_transition(zk, job, "Failed", message="HTTP 404 on payload")
        jids.append(job.jid)
    return jids


def operator() -> Any:
    user = get_user_model().objects.create_user(username="operator-bulk-outage")
    user.groups.add(ensure_groups()["operator"])
    return user


def hold_at(
    monkeypatch: pytest.MonkeyPatch, name: str, nth: int
) -> tuple[threading.Event, threading.Event]:
    """Hold the ``nth`` call of ``actions.<name>`` until the test says the server is down;
    returns (held, go on)."""
    real: Callable[..., Any] = getattr(actions, name)
    held, resume = threading.Event(), threading.Event()
    calls = 0

    def holding(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == nth:
            held.set()
            assert resume.wait(60), "the test never took the server down"
        return real(*args, **kwargs)

    monkeypatch.setattr(actions, name, holding)
    return held, resume


def daemon_thread(zk: Any) -> tuple[BulkRuns, threading.Event, threading.Thread]:
    loop = BulkRuns(zk=zk, poll=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,), name="bulk-runs-under-test")
    thread.start()
    return loop, stop, thread


def assert_each_resumed_and_audited_once(zk: Any, run: BulkRun, jids: list[str]) -> None:
    assert (run.state, run.position, run.done, run.skips) == (BulkRun.FINISHED, ITEMS, ITEMS, 0)
    assert run.error == ""
    for jid in jids:
        job = job_load(zk, jid)
        assert job.state == JOB_STEPS[1], jid
        assert job.status.retry_count == 1, jid  # one resume each, not two
    audited = AuditEntry.objects.filter(action="resume", ok=True)
    assert sorted(audited.values_list("item_id", flat=True)) == sorted(jids)


@pytest.fixture
def own_zk(tmp_path: Path) -> Iterator[LocalZooKeeper]:
    """A ZooKeeper server this test may stop and start, the process's client pointed at it."""
    from django.conf import settings

    server = LocalZooKeeper(tmp_path / "zookeeper", free_port())
    server.start()
    old = settings.ZK_HOSTS
    settings.ZK_HOSTS = server.hosts
    zkmod.close()
    try:
        yield server
    finally:
        zkmod.close()
        settings.ZK_HOSTS = old
        server.stop()


@pytest.mark.django_db(transaction=True)
def test_a_bulk_run_waits_out_a_zookeeper_stop_and_finishes_every_item_once(
    own_zk: LocalZooKeeper, monkeypatch: pytest.MonkeyPatch
) -> None:
    zk = zkmod.client()
    jids = failed_jobs(zk, ITEMS)
    user = operator()
    run = BulkRun.objects.create(
        user=user, kind="job", action="resume", items=[[j, None] for j in jids], total=ITEMS
    )
    held, resume = hold_at(monkeypatch, "apply", HELD_AT)
    loop, stop, thread = daemon_thread(zk)
    try:
        assert held.wait(60)
        own_zk.kill()
        wait_for(lambda: not zk.connected, timeout=30, every=0.05)
        resume.set()
        waiting = wait_for(
            lambda: BulkRun.objects.filter(pk=run.pk, error__startswith="waiting: ").first(),
            timeout=60,
            every=0.05,
        )
        assert waiting.state == BulkRun.RUNNING
        assert waiting.owner == loop.owner
        assert waiting.position == HELD_AT - 1
        assert "ZooKeeper unavailable" in waiting.error
        browser = Client()
        browser.force_login(user)
        page = browser.get(reverse("bulk-run", args=[run.pk])).content.decode()
        assert "Waiting: ZooKeeper unavailable" in page
        own_zk.start()
        finished = wait_for(
            lambda: BulkRun.objects.filter(pk=run.pk).exclude(state=BulkRun.RUNNING).first(),
            timeout=90,
        )
    finally:
        resume.set()
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert_each_resumed_and_audited_once(zkmod.client(), finished, jids)


@pytest.mark.parametrize(
    "held_in", ["apply", "audit_outcomes"], ids=["before-move", "before-audit"]
)
def test_a_bulk_run_waits_out_a_postgresql_stop_and_finishes_every_item_once(
    zk: Any,
    on_pg: Postgres,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    held_in: str,
) -> None:
    jids = failed_jobs(zk, ITEMS)
    run = BulkRun.objects.create(
        user=operator(),
        kind="job",
        action="resume",
        items=[[j, None] for j in jids],
        total=ITEMS,
    )
    held, resume = hold_at(monkeypatch, held_in, HELD_AT)
    loop, stop, thread = daemon_thread(zk)
    try:
        assert held.wait(60)
        on_pg.stop()
        resume.set()
        # The daemon meets the outage at the held item and says so; it cannot write it now.
        said = f"bulk run {run.pk} waits at item "
        with caplog.at_level(logging.WARNING, logger="queues.bulk"):
            wait_for(
                lambda: any(
                    said in r.getMessage() and "database unavailable" in r.getMessage()
                    for r in caplog.records
                ),
                timeout=30,
            )
        assert thread.is_alive() and loop.interrupted == run.pk
        on_pg.start()
        connection.close()  # the test's own, cut by the stop
        finished = wait_for(
            lambda: BulkRun.objects.filter(pk=run.pk).exclude(state=BulkRun.RUNNING).first(),
            timeout=90,
        )
    finally:
        resume.set()
        if not on_pg.data.joinpath("postmaster.pid").exists():
            on_pg.start()
            connection.close()
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert_each_resumed_and_audited_once(zk, finished, jids)
