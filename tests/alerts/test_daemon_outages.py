"""The alerts daemon across hosts and through outages, each caused for real: two daemons on two
ZooKeeper sessions evaluate once (the leader) and the other takes over when the leader's
session ends; ZooKeeper cut off from both behind a partition is announced once, by the daemons
that lost it, and resolved once when it is back; ZooKeeper gone for good in the middle of a
round is announced by the next round; a stopped PostgreSQL is announced from memory and resolved
once it answers again."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from daemons.conftest import wait_for
from faults.test_mail_outage import SmtpServer

from queues.chaos.infra import Postgres
from queues.daemons.alert_rules import KINDS, Context, Finding, rule
from queues.daemons.alerts import ROLE, Alerts
from queues.models import AlertEpisode
from queues.zk import client as zkmod
from queues.zk.leader import leader_read
from tests.zkproxy import ZkProxy
from tests.zktree import shared_client_on

from .conftest import a_moment, later, mails_with, only, pending_job


@pytest.fixture
def sessions(zk_hosts: str) -> Iterator[list[Any]]:
    """Two clients of their own, as the alerts daemons of two hosts hold them."""
    made = [zkmod.connect(zk_hosts), zkmod.connect(zk_hosts)]
    yield made
    for c in made:
        c.stop()
        c.close()


@pytest.fixture
def no_digest(settings: Any) -> None:
    settings.MRT_ALERT_DIGEST_HOUR = -1


@pytest.mark.django_db
def test_only_the_leader_evaluates_and_another_takes_over_when_its_session_ends(
    zk: Any, sessions: list[Any], smtp: SmtpServer, no_digest: None
) -> None:
    only("oldest-pending", threshold=0.0, quiet_seconds=0.0)
    pending_job(zk)
    first, second = (Alerts(zk=c, poll=0.05) for c in sessions)
    t = a_moment()
    said = first.round(now=t) + second.round(now=t)
    assert first.leading and not second.leading
    assert sum("fired" in line for line in said) == 1, said
    assert AlertEpisode.objects.count() == 1
    assert len(mails_with(smtp, "ALERT")) == 1
    assert leader_read(zk, ROLE)["pid"] > 0

    sessions[0].stop()  # the leader's host goes away, and its session with it
    sessions[0].close()
    second.round(now=later(t, 1))
    assert second.leading
    # The episode the first leader opened is the second's to follow: no second alert.
    assert len(mails_with(smtp, "ALERT")) == 1
    assert AlertEpisode.objects.filter(resolved__isnull=True).count() == 1


@pytest.mark.django_db(transaction=True)
def test_zookeeper_cut_off_is_announced_once_by_the_daemons_that_lost_it_and_resolved_once(
    zk_server: Any, zk_hosts: str, smtp: SmtpServer, no_digest: None
) -> None:
    only("zookeeper", threshold=0.0, quiet_seconds=0.0)
    chroot = zk_hosts[zk_hosts.index("/") :]
    proxies = [ZkProxy(zk_server.port), ZkProxy(zk_server.port)]
    clients = [zkmod.connect(f"{p.hosts}{chroot}", timeout=3.0) for p in proxies]
    try:
        daemons = [Alerts(zk=c, poll=0.05) for c in clients]
        t = a_moment()
        for d in daemons:
            assert d.round(now=t) == []
        for p in proxies:
            p.blackhole()
        wait_for(lambda: not any(c.connected for c in clients), timeout=30)
        fired = [line for d in daemons for line in d.round(now=later(t, 1))]
        assert [line for line in fired if "fired" in line] == [
            "alert zookeeper[] fired: ZooKeeper is unreachable"
        ], fired
        for d in daemons:
            d.round(now=later(t, 2))
        [alert] = mails_with(smtp, "ZooKeeper is unreachable")
        assert "ALERT" in alert["data"]

        for p in proxies:
            p.heal()
        wait_for(lambda: all(c.connected for c in clients), timeout=60)
        said = [line for n in (3, 4, 5) for d in daemons for line in d.round(now=later(t, n))]
        assert [line for line in said if "resolved" in line] == [
            "alert zookeeper[] resolved: ZooKeeper is unreachable"
        ], said
        assert len(mails_with(smtp, "RESOLVED")) == 1
        assert len(mails_with(smtp, "ALERT")) == 1
    finally:
        for c in clients:
            c.stop()
            c.close()
        for p in proxies:
            p.close()


@pytest.mark.django_db(transaction=True)
def test_zookeeper_gone_in_the_middle_of_a_round_is_announced_by_the_next_round(
    zk_server: Any, zk_hosts: str, smtp: SmtpServer, no_digest: None, settings: Any
) -> None:
    """kazoo keeps a request asked for while its connection is down until the connection is
    back. A rule that read again after the connection went down held its round, and the alerts
    daemon with it, for as long as ZooKeeper stayed away: the alert that says so never came.
    The process's shared client fails such a request once the connection has been down for a
    session timeout (``queues.zk.client.client``)."""
    asked_once, went_away = threading.Event(), threading.Event()

    @rule("reads-twice", title="Reads twice", threshold=0.0, threshold_help="-", quiet=0.0)
    def reads_twice(ctx: Context, _threshold: float) -> list[Finding]:
        ctx.zk.exists("/")
        asked_once.set()
        went_away.wait(120)
        ctx.zk.exists("/")  # asked with the connection down
        return []

    proxy = ZkProxy(zk_server.port)
    settings.ZK_TIMEOUT = 2.0
    try:
        with shared_client_on(proxy.hosts + zk_hosts[len(zk_server.hosts) :]):
            only("reads-twice", "zookeeper", threshold=0.0, quiet_seconds=0.0)
            shared = zkmod.client()
            daemon = Alerts(zk=shared, poll=0.05)
            t = a_moment()
            first = threading.Thread(target=daemon.round, kwargs={"now": t})
            first.start()
            wait_for(asked_once.is_set, timeout=30)
            proxy.blackhole()  # for the rest of the test: it never comes back
            wait_for(lambda: not shared.connected, timeout=30)
            went_away.set()
            first.join(120)  # a guard: the round ends about a session timeout later
            assert not first.is_alive(), "the round waited for ZooKeeper to come back"
            said = daemon.round(now=later(t, 1))
            assert "alert zookeeper[] fired: ZooKeeper is unreachable" in said, said
            [alert] = mails_with(smtp, "ZooKeeper is unreachable")
            assert "ALERT" in alert["data"]
    finally:
        KINDS.pop("reads-twice", None)
        went_away.set()
        proxy.close()


def test_a_stopped_database_is_announced_from_memory_and_resolved_when_it_is_back(
    zk: Any,
    on_pg: Postgres,
    smtp: SmtpServer,
    no_digest: None,
) -> None:
    only("database", "oldest-pending", threshold=0.0, quiet_seconds=0.0)
    daemon = Alerts(zk=zk, poll=0.05)
    pending_job(zk)
    t = a_moment()
    # The rules are read while the database answers; the waiting job's alert is written there.
    assert [s for s in daemon.round(now=t) if "fired" in s] == [
        "alert oldest-pending[] fired: the oldest Pending job has waited 0 minutes"
    ]
    on_pg.stop()
    try:
        said = daemon.round(now=later(t, 1))
        assert "alert database[] fired (kept in memory): the database is unreachable" in said
        assert daemon.round(now=later(t, 2)) == []
        [alert] = mails_with(smtp, "the database is unreachable")
        assert "ALERT" in alert["data"]
        assert len(mails_with(smtp, "oldest Pending job")) == 1
    finally:
        on_pg.start()
    assert daemon.round(now=later(t, 3)) == []  # clear since now
    said = daemon.round(now=later(t, 4))
    assert said[0] == "alert database[] resolved: the database is unreachable", said
    assert len(mails_with(smtp, "RESOLVED")) == 1
    # The waiting job's alert, open in the database all along, was not announced again.
    assert len(mails_with(smtp, "ALERT")) == 2
    assert len(mails_with(smtp, "oldest Pending job")) == 1
    # Written to the history once the database is back.
    episode = AlertEpisode.objects.get(kind="database")
    assert episode.resolved is not None
    assert AlertEpisode.objects.get(kind="oldest-pending").resolved is None
