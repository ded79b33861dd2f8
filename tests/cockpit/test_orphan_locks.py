"""Orphan locks (issue 23, item 1): a lock held by a running console process's live session
that no thread of it claims is reported by the consistency check, ``queuecheck``,
/consumers/ and /api/consumers, and repaired by deleting that very node; a lock in the
process's ledger, a lock just taken and a lock of a session that is not a console process are
not orphans."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from queues.daemons.registration import ProcessObserver
from queues.operator import check, check_repairs
from queues.zk import client as zkmod
from queues.zk import consumers as zconsumers
from queues.zk import paths
from queues.zk.locks import lock_create

from .conftest import SlowStep, wait_for

STORAGE_LOCK = f"{paths.STORAGE_LOCKS}/{paths.object_lock_name('ark:/99999/fk4orphan')}"


class Consumer:
    """A registered console process: its own ZooKeeper session, its registration publishing
    the session's lock ledger every ``publish_seconds``."""

    def __init__(self, zk_hosts: str, *, publish_seconds: float = 0.2) -> None:
        self.zk = zkmod.connect(zk_hosts)
        self.observer = ProcessObserver(
            self.zk,
            [SlowStep(zk=self.zk)],
            record=False,
            publish_seconds=publish_seconds,
            host="worker9",
            pid=99,
        )
        self.observer.start()
        self.session = self.zk.client_id[0]

    def lock(self, path: str, *, in_ledger: bool) -> None:
        """Take a lock as a thread does (noted in the ledger), or as a create answered with
        ConnectionLoss that the server applied leaves it (held, noted nowhere)."""
        if in_ledger:
            assert lock_create(self.zk, path)
        else:
            self.zk.create(path, b"", ephemeral=True, makepath=True)

    def close(self) -> None:
        self.observer.stop()
        self.zk.stop()
        self.zk.close()


@pytest.fixture
def consumer(zk_hosts: str) -> Iterator[Consumer]:
    made = Consumer(zk_hosts)
    yield made
    made.close()


def _orphans(zk: Any) -> list[str]:
    return [
        f.path for f in check.run_check(zk, recheck_seconds=0).findings if f.kind == "orphan-lock"
    ]


@pytest.mark.django_db  # queuecheck records its run in the database
def test_the_check_reports_a_lock_no_thread_of_its_console_process_claims(
    zk, consumer, other_zk, make_job
) -> None:
    orphan, working, foreign = (make_job("Estimating") for _ in range(3))
    orphan_lock = paths.job_node(orphan.jid, "lock")
    working_lock = paths.job_node(working.jid, "lock")
    foreign_lock = paths.job_node(foreign.jid, "lock")
    consumer.lock(orphan_lock, in_ledger=False)
    consumer.lock(STORAGE_LOCK, in_ledger=False)
    consumer.lock(working_lock, in_ledger=True)
    # Merritt's own consumers do not register: their locks are theirs, never orphans.
    other_zk.create(foreign_lock, b"", ephemeral=True)

    wait_for(lambda: len(_orphans(zk)) == 2, timeout=20)
    # The registration publishes what the process's threads hold: the lock taken as a thread
    # takes it, not the two its session holds unawares.
    (entry,) = zconsumers.consumers_list(zk)
    assert (entry["locks"], entry["locks_count"]) == ([working_lock], 1)
    assert entry["session"] == f"{consumer.session:#x}"
    report = check.run_check(zk, stale_lock_seconds=0)
    found = {f.path: f for f in report.by_kind()["orphan-lock"]}
    assert sorted(found) == sorted([orphan_lock, STORAGE_LOCK])
    session = f"{consumer.session:#x}"
    assert found[orphan_lock].detail.startswith(
        f"orphan lock held by worker9-99 (session {session}) that no thread of it claims"
    )
    # Only its owner deletes a lock: the finding says the process deletes it itself.
    assert not found[orphan_lock].repairable
    assert "Its own process deletes it" in found[orphan_lock].advice
    stale = {f.path: f.detail for f in report.by_kind()["stale-lock"]}
    assert f"by worker9-99 (session {session})" in stale[working_lock]
    assert "a session that is not a console process" in stale[foreign_lock]

    out = StringIO()
    call_command("queuecheck", stdout=out, stderr=StringIO())
    assert "orphan-lock" in out.getvalue() and orphan_lock in out.getvalue()

    # A repair from another session deletes no lock, not even an orphan.
    assert check_repairs.repair(zk, report) == []
    assert zk.exists(orphan_lock).ephemeralOwner == consumer.session
    assert zk.exists(STORAGE_LOCK).ephemeralOwner == consumer.session
    assert zk.exists(working_lock).ephemeralOwner == consumer.session
    assert zk.exists(foreign_lock) is not None


def test_repair_leaves_a_lock_taken_again_since_the_check(zk, consumer, make_job) -> None:
    job = make_job("Estimating")
    lock = paths.job_node(job.jid, "lock")
    consumer.lock(lock, in_ledger=False)
    wait_for(lambda: _orphans(zk) == [lock], timeout=20)
    report = check.run_check(zk, recheck_seconds=0)
    # Released and taken again (now by a thread that claims it) before the repair runs.
    consumer.zk.delete(lock)
    consumer.lock(lock, in_ledger=True)
    assert check_repairs.repair(zk, report) == []
    assert zk.exists(lock).ephemeralOwner == consumer.session


def test_a_lock_taken_after_the_last_published_ledger_is_not_an_orphan(
    zk, zk_hosts, make_job
) -> None:
    # This process publishes once a minute: its ledger was written before the lock was taken.
    slow = Consumer(zk_hosts, publish_seconds=60)
    try:
        job = make_job("Estimating")
        slow.lock(paths.job_node(job.jid, "lock"), in_ledger=False)
        assert _orphans(zk) == []
    finally:
        slow.close()


@pytest.mark.django_db
def test_consumers_page_and_api_show_the_orphan_lock_under_its_process(
    zk, consumer, viewer, make_user, make_job
) -> None:
    from queues.operator.audit import ApiToken

    orphan, working = make_job("Estimating"), make_job("Estimating")
    orphan_lock = paths.job_node(orphan.jid, "lock")
    working_lock = paths.job_node(working.jid, "lock")
    consumer.lock(orphan_lock, in_ledger=False)
    consumer.lock(working_lock, in_ledger=True)
    # The process finds the lock in its own session at two publishes a second apart.
    wait_for(lambda: orphan_lock in viewer.get("/consumers/").content.decode(), timeout=20)

    response = viewer.get("/consumers/")
    assert response.status_code == 200
    page = response.content.decode()
    assert 'id="orphans-worker9-99"' in page
    assert f"<code>{orphan_lock}</code>" in page
    assert working_lock not in page
    assert 'id="orphan-total"' in page

    _token, key = ApiToken.issue(user=make_user("viewer", "api-viewer"), name="t")
    answer = viewer.get("/api/consumers", HTTP_AUTHORIZATION=f"Bearer {key}").json()
    (entry,) = answer["consumers"]
    assert [o["path"] for o in entry["orphan_locks"]] == [orphan_lock]
    assert entry["orphan_locks"][0]["session"] == f"{consumer.session:#x}"
    assert answer["orphan_total"] == 1
    assert answer["locks"]["held"] == 1


def test_a_process_deletes_an_orphan_of_its_own_session_after_showing_it(
    zk, consumer, make_job, monkeypatch
) -> None:
    """No operator needed: an orphan the reconciler never heard of (here a create nobody
    noted) is shown, then deleted by the process itself; the lock a thread works under stays."""
    monkeypatch.setattr(zconsumers, "ORPHAN_HEAL_SECONDS", 2.0)
    orphan, working = make_job("Estimating"), make_job("Estimating")
    orphan_lock = paths.job_node(orphan.jid, "lock")
    working_lock = paths.job_node(working.jid, "lock")
    consumer.lock(orphan_lock, in_ledger=False)
    consumer.lock(working_lock, in_ledger=True)

    wait_for(lambda: consumer.observer.orphans == [orphan_lock], timeout=20)
    wait_for(lambda: zk.exists(orphan_lock) is None, timeout=30)

    stat = zk.exists(working_lock)
    assert stat is not None and stat.ephemeralOwner == consumer.session
    wait_for(lambda: consumer.observer.orphans == [], timeout=20)


@pytest.mark.django_db
def test_the_consistency_page_leaves_the_orphan_lock_to_its_own_process(
    zk, consumer, admin, make_job
) -> None:
    job = make_job("Estimating")
    lock = paths.job_node(job.jid, "lock")
    consumer.lock(lock, in_ledger=False)
    wait_for(lambda: _orphans(zk) == [lock], timeout=20)
    from queues.daemons.consistency import ConsistencyCheck

    # Started by the admin, walked by the consistency daemon (queues/operator/consistency.py).
    assert admin.post("/consistency/").status_code == 303
    assert ConsistencyCheck(zk=zk).run_once()
    page = admin.get("/consistency/").content.decode()
    assert "orphan-lock (1)" in page and f"<code>{lock}</code>" in page
    assert "Its own process deletes it" in page
    # Nothing the console's own session may repair: a lock is deleted only by its owner.
    assert 'id="repair-button"' not in page
    admin.post("/consistency/repair/", {"reason": "orphan after a restart"})
    assert zk.exists(lock).ephemeralOwner == consumer.session
