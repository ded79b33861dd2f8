"""The project's own ZooKeeper server: several can run side by side and stop cleanly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from queues import zk as zkmod
from queues.zk.server import LocalZooKeeper, four_letter, free_port


def test_second_server_on_another_port_starts_serves_and_stops(
    zk_server: LocalZooKeeper, tmp_path: Path
) -> None:
    server = LocalZooKeeper(tmp_path / "zk2", free_port())
    assert server.port != zk_server.port
    assert not server.is_serving()
    assert server.stop() is False
    server.start()
    try:
        assert server.is_serving()
        pid = server.pid()
        assert pid is not None
        client = zkmod.connect(server.hosts)
        try:
            client.create("/hello", b"world")
            assert client.get("/hello")[0] == b"world"
            assert client.exists("/jobs/states") is not None
        finally:
            client.stop()
            client.close()
        server.start()  # already serving: nothing to do
        assert server.pid() == pid
    finally:
        assert server.stop() is True
    assert not server.is_serving()
    assert four_letter(server.port) is None
    assert server.pid() is None
    assert not server.pid_file.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert zk_server.is_serving()
