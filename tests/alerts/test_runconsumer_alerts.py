"""``manage.py runconsumer alerts`` as real processes on one ZooKeeper and one database: two of
them announce an episode once and resolve it once by mail through a real SMTP server; when the
leader is killed, the other takes over and announces the next episode."""

from __future__ import annotations

import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemons.conftest import wait_for
from daemons.test_end_to_end import Consumers
from faults.test_mail_outage import SmtpServer

from queues.daemons.alert_rules import KINDS
from queues.daemons.alerts import ROLE
from queues.services.zkserver import free_port
from queues.zk.jobs import job_load, job_transition
from queues.zk.leader import leader_read

from .conftest import pending_job

pytestmark = pytest.mark.slow


@pytest.fixture
def processes(tmp_path: Path, zk_hosts: str) -> Iterator[tuple[Consumers, SmtpServer]]:
    smtp = SmtpServer(free_port())
    smtp.up()
    var = tmp_path / "alerts-var"
    var.mkdir()
    procs = Consumers(var, zk_hosts)
    procs.env.update(
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=str(smtp.port),
        MRT_ALERT_EMAIL="oncall@example.org",
        MRT_ALERT_EVERY="0.3",
        MRT_ALERT_DIGEST_HOUR="-1",
        ZK_TIMEOUT="4",
    )
    with sqlite3.connect(procs.db) as db:
        db.executemany(
            "INSERT INTO queues_alertrule "
            "(kind, enabled, threshold, quiet_seconds, fuse, updated, updated_by) "
            "VALUES (?, ?, 0, 0, 0, '2026-01-01 00:00:00', 'test')",
            [(kind, kind == "oldest-pending") for kind in KINDS],
        )
    try:
        yield procs, smtp
    finally:
        procs.close()
        smtp.down()


def alerts(smtp: SmtpServer, word: str) -> list[dict[str, Any]]:
    return [m for m in smtp.messages if word in m.get("data", "")]


def sent_rows(procs: Consumers) -> list[tuple[str, str]]:
    with sqlite3.connect(procs.db) as db:
        return db.execute(
            "SELECT event, channel FROM queues_alertmessage WHERE sent IS NOT NULL ORDER BY id"
        ).fetchall()


def test_two_alerts_processes_announce_once_resolve_once_and_survive_the_leaders_death(
    zk: Any, processes: tuple[Consumers, SmtpServer]
) -> None:
    procs, smtp = processes
    first, second = procs.start("alerts"), procs.start("alerts")
    wait_for(lambda: leader_read(zk, ROLE), timeout=60)
    job = pending_job(zk)
    wait_for(lambda: alerts(smtp, "ALERT"), timeout=60)
    job_transition(zk, job_load(zk, job.jid), "Estimating")
    wait_for(lambda: alerts(smtp, "RESOLVED"), timeout=60)
    assert len(alerts(smtp, "ALERT")) == 1, procs.logs()
    assert len(alerts(smtp, "RESOLVED")) == 1
    # A message is marked sent once the mail server took it: the mail can arrive first.
    wait_for(lambda: len(sent_rows(procs)) >= 2, timeout=30)
    assert sent_rows(procs) == [("fired", "email"), ("resolved", "email")]

    leader = leader_read(zk, ROLE)
    assert leader is not None
    dead, alive = (first, second) if leader["pid"] == first.pid else (second, first)
    dead.send_signal(signal.SIGKILL)
    dead.wait(timeout=30)
    wait_for(lambda: (leader_read(zk, ROLE) or {}).get("pid") == alive.pid, timeout=60)
    pending_job(zk)
    wait_for(lambda: len(alerts(smtp, "ALERT")) == 2, timeout=60)
    assert len(alerts(smtp, "RESOLVED")) == 1
    assert procs.stop(alive) == 0
    assert leader_read(zk, ROLE) is None  # given up at a clean stop
