"""SIGTERM stops a consumer within its stop timeout, even with a step stuck on a depositor that
never answers (issue 23: hung consumers ignored SIGTERM, so only SIGKILL ended them)."""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemons.conftest import make_job, wait_for
from daemons.test_end_to_end import Consumers

from queues.core.states import JobState

pytestmark = pytest.mark.slow


class SilentServer:
    """Accepts HTTP connections on loopback and never answers."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _address = self.listener.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.listener.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


def test_sigterm_stops_a_consumer_whose_step_is_stuck_within_its_stop_timeout(
    zk, zk_hosts: str, tmp_path: Path, silent: SilentServer
) -> None:
    var = tmp_path / "consumer-var"
    var.mkdir()
    consumers = Consumers(var, zk_hosts)
    make_job(
        zk,
        {"payload_url": f"http://127.0.0.1:{silent.port}/object.zip", "type": "file"},
        state=JobState.ESTIMATING,
    )
    # The step would wait an hour for the depositor's answer.
    proc = consumers.start(
        "estimating", "--poll", "0.2", "--stop-timeout", "2", MRT_HTTP_TIMEOUT="3600"
    )
    log = consumers.procs[-1][1]
    try:
        wait_for(lambda: silent.accepted, timeout=120)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        consumers.close()
    assert code == 1, consumers.logs()
    assert "exiting without them" in log.read_text()
