"""A ZooKeeper outage in the middle of a consistency check walk does not fail the run: the
consistency daemon says on the run why it waits, and once ZooKeeper is back it walks the tree
again from the start, keeping each finding once."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from daemons.conftest import DEMO, wait_for
from django.test import Client
from django.urls import reverse

from queues.daemons.consistency import ConsistencyCheck
from queues.models import ConsistencyFinding, ConsistencyRun
from queues.operator import check, consistency
from queues.operator.auth import ensure_groups
from queues.services.zkserver import LocalZooKeeper
from queues.zk import client as zkmod
from queues.zk.batches import batch_create
from queues.zk.jobs import job_create

from .test_bulk_run_outage import own_zk  # noqa: F401


def _hold_the_job_pass(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Hold the first walk as it is about to read the jobs, until the test says ZooKeeper is
    down: the outage then strikes mid-walk however fast the machine is."""
    real = check.Checker._check_jobs
    held, resume = threading.Event(), threading.Event()

    def holding(self: check.Checker) -> None:
        if not held.is_set():
            held.set()
            assert resume.wait(60), "the test never stopped ZooKeeper"
        real(self)

    monkeypatch.setattr(check.Checker, "_check_jobs", holding)
    return held, resume


@pytest.mark.django_db(transaction=True)
def test_a_check_waits_out_a_zookeeper_stop_and_then_finishes(
    own_zk: LocalZooKeeper,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    django_user_model: Any,
) -> None:
    zk = zkmod.client()
    batch = batch_create(zk, submission={"profile": DEMO, "payload_url": "https://example.org/a"})
    made = [
        job_create(zk, bid=batch.bid, configuration={"profile": DEMO, "payload_url": "x"})
        for _ in range(6)
    ]
    zk.delete(made[2].index_path)
    run, _ = consistency.start(user=None)
    held, resume = _hold_the_job_pass(monkeypatch)
    daemon = ConsistencyCheck(zk=zk, poll=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=daemon.run, args=(stop,), name="consistency-under-test")
    thread.start()
    try:
        assert held.wait(60)
        own_zk.kill()
        wait_for(lambda: not zk.connected, timeout=30, every=0.05)
        resume.set()
        waiting = wait_for(
            lambda: ConsistencyRun.objects.filter(pk=run.pk, error__startswith="waiting: ").first(),
            timeout=60,
            every=0.05,
        )
        assert (waiting.state, waiting.owner) == ("running", daemon.owner)
        assert "ZooKeeper unavailable" in waiting.error
        admin = django_user_model.objects.create_user(username="admin-outage")
        admin.groups.add(ensure_groups()["admin"])
        browser = Client()
        browser.force_login(admin)
        page = browser.get(reverse("consistency")).content.decode()
        assert "Waiting: ZooKeeper unavailable" in page and 'hx-trigger="every 1s"' in page
        own_zk.start()
        ended = wait_for(
            lambda: ConsistencyRun.objects.filter(pk=run.pk).exclude(state="running").first(),
            timeout=90,
        )
    finally:
        resume.set()
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert (ended.state, ended.error, ended.jobs, ended.findings) == ("finished", "", 6, 1)
    rows = list(ConsistencyFinding.objects.filter(run=run).values_list("kind", "path"))
    assert rows == [("job-unindexed", f"/jobs/{made[2].jid}")]
