"""A long-running consumer started before ZooKeeper waits for it instead of exiting."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from queues.zk.server import LocalZooKeeper, free_port

from .conftest import wait_for
from .test_end_to_end import Consumers

pytestmark = pytest.mark.slow


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
