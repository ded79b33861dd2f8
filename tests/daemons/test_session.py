"""A real ZooKeeper outage: the daemons stop claiming while it is down and go on after."""

from __future__ import annotations

import threading

import pytest

from queues.daemons.runner import Host
from queues.zk.jobs import job_load

from .conftest import FileServer, make_job, wait_for

pytestmark = pytest.mark.slow


def test_daemon_pauses_while_zookeeper_is_down_and_resumes(
    zk, zk_server, files: FileServer
) -> None:
    host = Host("pending", poll=0.1)
    stop = threading.Event()
    thread = threading.Thread(target=host.run, args=(stop,))
    thread.start()
    try:
        zk_server.stop()
        try:
            wait_for(lambda: not host.gate.connected, timeout=30)
        finally:
            zk_server.start()
        wait_for(lambda: host.gate.connected, timeout=60)
        job = make_job(zk, {"payload_url": files.put("a", "x"), "type": "file"})
        wait_for(lambda: job_load(zk, job.jid).state == "Estimating", timeout=30)
    finally:
        stop.set()
        thread.join(timeout=30)
        host.close()
    assert not thread.is_alive()
