"""The consumers registry: a process's ephemeral node appears, says what each thread holds, and
vanishes with its ZooKeeper session, also when the process is killed."""

from __future__ import annotations

import signal
import subprocess

import pytest

from queues.daemons.registration import ProcessObserver
from queues.zk import client as zkmod
from queues.zk import consumers as zconsumers
from queues.zk.jobs import job_load
from tests.live.conftest import child_env, manage_py

from .conftest import SlowStep, held_consumer, wait_for


def _names(zk) -> list[str]:
    return [c["name"] for c in zconsumers.consumers_list(zk)]


def test_registration_appears_and_vanishes_with_the_session(zk, zk_hosts) -> None:
    other = zkmod.connect(zk_hosts)  # the consumer process's own session
    daemon = SlowStep(zk=other, poll=0.1)
    observer = ProcessObserver(
        other, [daemon], record=False, publish_seconds=0.2, host="host.example", pid=4242
    )
    observer.start()
    try:
        (entry,) = zconsumers.consumers_list(zk)
        assert entry["name"] == "host.example-4242"
        assert (entry["host"], entry["pid"]) == ("host.example", 4242)
        assert entry["steps"] == ["slow"]
        assert entry["version"] and entry["version"] != ""
        assert entry["started"] and entry["threads"] == [{"thread": "slow-0", "step": "slow"}]
        assert entry["draining"] is False
        # The node is outside the contract's folders, under the console's own subtree.
        assert zk.exists("/mrt-console/consumers/host.example-4242") is not None
    finally:
        # The process dies without a word: only its session ends.
        observer._stop.set()
        other.stop()
        other.close()
    wait_for(lambda: "host.example-4242" not in _names(zk), timeout=20)


def test_a_thread_says_which_item_it_holds_since_when(zk, zk_hosts, make_job) -> None:
    # Held until the test has seen it: a fixed time in hand could pass between two looks.
    with held_consumer(zk_hosts) as (daemon, _observer):
        job = make_job("Estimating")

        def holding():
            (entry,) = zconsumers.consumers_list(zk)
            return entry["threads"][0] if entry["threads"][0].get("item") else None

        thread = wait_for(holding, timeout=15)
        assert thread["item"] == job.jid
        assert (thread["kind"], thread["state"], thread["step"]) == ("job", "Estimating", "slow")
        assert thread["since"]
        daemon.until.set()
        wait_for(lambda: job_load(zk, job.jid).state == "Provisioning", timeout=15)
        # Once the step is done the thread is idle again (at the next write, within 0.2 s).
        wait_for(lambda: not zconsumers.consumers_list(zk)[0]["threads"][0].get("item"))
        assert zconsumers.consumers_list(zk)[0]["handled"] == 1
    assert _names(zk) == []  # a clean stop removes the node at once


def test_the_node_comes_back_after_a_lost_session(zk, zk_hosts) -> None:
    """A session that expired took the node with it; the process writes it anew."""
    other = zkmod.connect(zk_hosts)
    observer = ProcessObserver(
        other, [SlowStep(zk=other)], record=False, publish_seconds=0.2, host="h", pid=9
    )
    observer.start()
    try:
        zk.delete(zconsumers.consumer_path("h-9"))  # what the expiry does
        assert "h-9" not in _names(zk)
        wait_for(lambda: "h-9" in _names(zk), timeout=10)
    finally:
        observer.stop()
        other.stop()
        other.close()


@pytest.mark.slow
def test_a_killed_runconsumer_vanishes_when_its_session_expires(zk, zk_hosts, tmp_path) -> None:
    """A real ``runconsumer`` process registers itself; SIGKILL leaves ZooKeeper to expire its
    session (ZK_TIMEOUT), and its node goes with it."""
    env = child_env(
        zk_hosts,
        tmp_path,
        ZK_TIMEOUT="4",
        MRT_VAR_DIR=str(tmp_path),
        MRT_CONSUMER_PUBLISH_SECONDS="0.5",
    )
    proc = subprocess.Popen(
        [*manage_py(), "runconsumer", "pending", "--poll", "0.5"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: any(n.endswith(f"-{proc.pid}") for n in _names(zk)), timeout=60)
        (entry,) = zconsumers.consumers_list(zk)
        assert entry["pid"] == proc.pid and entry["steps"] == ["pending"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        wait_for(lambda: _names(zk) == [], timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_two_processes_with_one_host_and_pid_get_two_names(zk, zk_hosts) -> None:
    """Two containers on one host, each its own pid 1: neither overwrites the other."""
    sessions = [zkmod.connect(zk_hosts) for _ in range(2)]
    observers = [
        ProcessObserver(s, [SlowStep(zk=s)], record=False, host="box", pid=1) for s in sessions
    ]
    try:
        for observer in observers:
            observer.start()
        assert [o.name for o in observers] == ["box-1", "box-1-2"]
        assert _names(zk) == ["box-1", "box-1-2"]
    finally:
        for observer, session in zip(observers, sessions, strict=True):
            observer.stop()
            session.stop()
            session.close()
    assert _names(zk) == []


@pytest.mark.django_db
def test_the_api_lists_the_registered_processes_for_a_token(zk, zk_hosts, make_user) -> None:
    from django.test import Client

    from queues.operator.audit import ApiToken

    other = zkmod.connect(zk_hosts)
    daemon = SlowStep(zk=other, poll=0.1)
    observer = ProcessObserver(
        other, [daemon], record=False, publish_seconds=0.2, host="api.example", pid=7
    )
    observer.start()
    try:
        _token, key = ApiToken.issue(user=make_user("viewer", "api-viewer"), name="t")
        client = Client()
        assert client.get("/api/consumers").status_code == 401
        answer = client.get("/api/consumers", HTTP_AUTHORIZATION=f"Bearer {key}").json()
        (entry,) = answer["consumers"]
        assert (entry["name"], entry["steps"], entry["flagged"]) == ("api.example-7", ["slow"], 0)
        assert answer["flagged_total"] == 0
    finally:
        observer.stop()
        other.stop()
        other.close()
