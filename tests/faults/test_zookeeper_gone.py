"""A caller that must go on whatever ZooKeeper does (the chaos run's monitor and judge) is not
held by a connection that never comes back.

kazoo keeps a request made while its connection is down until the connection is back, its
caller waiting: a chaos run whose ensemble elected no leader after a leader kill printed
nothing more and was killed by hand, its monitor waiting in a read, its stall check never
reached. ``FailWhileDown`` fails such requests (ConnectionLoss) once the connection has been
down for its grace; the run then fails as stalled, and says that ZooKeeper did not answer.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from daemons.conftest import wait_for
from kazoo.exceptions import ConnectionLoss

from queues.chaos import judge
from queues.services.zkserver import LocalZooKeeper
from queues.zk.client import FailWhileDown
from queues.zk.kazoo_private import fail_unsent
from tests.workers import with_ports
from tests.zkproxy import ZkProxy

MANAGE = Path(__file__).resolve().parents[2] / "manage.py"
# Guards against a hung test only: what is tested ends on conditions, not on these.
JOIN_GUARD = 120
HANG_GUARD = 900


def test_a_read_while_the_connection_is_down_fails_instead_of_waiting(
    proxied_client: Any, proxy: ZkProxy
) -> None:
    monitor = proxied_client(timeout=4)
    guard = FailWhileDown(monitor, grace=0.5)
    try:
        assert judge.progress(monitor, {}) is not None  # answered while connected
        proxy.blackhole()  # nothing passes, new connections hang: as an ensemble with no leader
        wait_for(lambda: not monitor.connected, timeout=60)
        answers: list[Any] = []
        reading = threading.Thread(target=lambda: answers.append(judge.progress(monitor, {})))
        reading.start()
        reading.join(JOIN_GUARD)
        assert not reading.is_alive(), "the read waited for the connection"
        assert answers == [None]  # "ZooKeeper cannot answer": the monitor goes on
        assert guard.failed >= 1
        proxy.heal()
        wait_for(lambda: monitor.connected, timeout=60)
        assert judge.progress(monitor, {}) is not None  # and answered again once it is back
    finally:
        guard.stop()


def test_a_request_is_taken_only_under_the_connection_threads_lock(
    proxied_client: Any, proxy: ZkProxy
) -> None:
    """The connection thread looks at the queue's head, serializes it, then pops it: a request
    taken from between the two would leave another's answer unsent. ``fail_unsent`` waits for
    the same lock (it can only be red if the lock is not taken, never slow-red)."""
    monitor = proxied_client(timeout=4)
    proxy.blackhole()
    wait_for(lambda: not monitor.connected, timeout=60)
    waiting = monitor.exists_async("/")
    failed: list[int] = []
    taker = threading.Thread(target=lambda: failed.append(fail_unsent(monitor)))
    with monitor._connection.taking:
        taker.start()
        taker.join(1.0)
        assert taker.is_alive() and not waiting.ready()  # held off while the lock is held
    taker.join(JOIN_GUARD)
    assert failed == [1]
    with pytest.raises(ConnectionLoss):
        waiting.get(timeout=JOIN_GUARD)


def test_nothing_is_failed_while_connected(zk: Any) -> None:
    pending = zk.exists_async("/")
    assert fail_unsent(zk) == 0
    assert pending.get(timeout=JOIN_GUARD) is not None


@pytest.mark.slow
@pytest.mark.timeout(HANG_GUARD)
def test_a_chaos_run_whose_zookeeper_never_comes_back_fails_saying_so(
    tmp_path: Path, zk_server: LocalZooKeeper
) -> None:
    proxy = ZkProxy(zk_server.port)
    env = {k: v for k, v in os.environ.items() if k != "ZK_HOSTS"}
    env.update(ZK_HOSTS=proxy.hosts, MRT_VAR_DIR=str(tmp_path / "var"), PYTHONUNBUFFERED="1")
    arguments = ("--jobs", "4", "--batches", "1", "--consumers", "1", "--no-kills")
    arguments += ("--zk-restarts", "0", "--no-hostile", "--stall", "10", "--stop-timeout", "60")
    run = subprocess.Popen(
        with_ports([sys.executable, str(MANAGE), "chaosrun", *arguments, "--seed", "5"]),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    said: list[str] = []
    try:
        assert run.stdout is not None
        for line in run.stdout:
            said.append(line)
            if "submitted 1 batches" in line:
                proxy.blackhole()  # for good: the run's ZooKeeper never answers again
                break
        said.append(run.communicate(timeout=HANG_GUARD)[0])
    finally:
        if run.poll() is None:
            run.kill()
        proxy.close()
    output = "".join(said)
    kept = re.search(r"scratch folder kept, with each consumer's log: (\S+)", output)
    if kept:  # kept for a failed run's reader: this failure is the one the test asks for
        shutil.rmtree(kept.group(1), ignore_errors=True)
    assert run.returncode != 0, output[-6000:]
    assert "VERDICT: FAILED" in output, output[-6000:]
    assert "stalled: no job moved and no fault acted for 10s" in output, output[-6000:]
    assert "ZooKeeper did not answer within 10s of the run's end" in output, output[-6000:]
