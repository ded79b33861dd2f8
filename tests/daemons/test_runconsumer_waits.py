"""A long-running consumer started before ZooKeeper waits for it instead of exiting."""

from __future__ import annotations

import signal
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from kazoo.exceptions import ConnectionLoss

from queues.management.commands import runconsumer
from queues.services.zkserver import LocalZooKeeper, free_port

from .conftest import wait_for
from .test_end_to_end import Consumers

pytestmark = pytest.mark.slow


@pytest.mark.zookeeper
def test_consumer_waits_for_zookeeper_then_works(tmp_path: Path) -> None:
    port = free_port()
    consumers = Consumers(tmp_path / "var", f"127.0.0.1:{port}")
    consumers.env["ZK_TIMEOUT"] = "2"
    server = LocalZooKeeper(tmp_path / "zk", port)
    proc = consumers.start("estimating", "--poll", "0.5")
    log = consumers.procs[-1][1]
    try:
        wait_for(lambda: "retrying in" in log.read_text(), timeout=60)
        assert proc.poll() is None, consumers.logs()
        server.start()
        wait_for(lambda: "estimating: started" in log.read_text(), timeout=120)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, consumers.logs()
    finally:
        consumers.close()
        server.stop()


def test_once_fails_at_once_without_zookeeper(tmp_path: Path) -> None:
    consumers = Consumers(tmp_path / "var", f"127.0.0.1:{free_port()}")
    result = subprocess.run(
        [sys.executable, "manage.py", "runconsumer", "estimating", "--once"],
        cwd=settings.BASE_DIR,
        env={**consumers.env, "ZK_TIMEOUT": "2"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "cannot reach ZooKeeper" in result.stderr


def test_a_connection_lost_while_starting_up_is_waited_out_too(monkeypatch, db) -> None:
    # Chaos run: a consumer restarted while ZooKeeper restarted connected, then lost the
    # connection while its first nodes were checked, and exited with ConnectionLoss.
    started = []

    class FlakyHost:
        def __init__(self, name: str, **_kwargs) -> None:
            started.append(name)
            if len(started) == 1:
                raise ConnectionLoss()

        def run(self, stop) -> None:
            started.append("ran")

        def close(self) -> None:
            pass

    monkeypatch.setattr(runconsumer, "Host", FlakyHost)
    monkeypatch.setattr(runconsumer.signal, "signal", lambda *_args: None)  # pytest's own stay
    err = StringIO()
    call_command("runconsumer", "estimating", stderr=err)
    assert started == ["estimating", "estimating", "ran"]
    assert "ConnectionLoss; retrying in 1s" in err.getvalue()
