"""The project's own ZooKeeper server: several can run side by side and stop cleanly."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from queues.services.zkserver import (
    DEFAULT_JUTE_MAXBUFFER,
    LocalServerError,
    LocalZooKeeper,
    four_letter,
    free_port,
    heap_from_env,
    jute_maxbuffer_from_env,
    jvm_flags_from_env,
    local_server,
)
from queues.zk import client as zkmod
from queues.zk.client import configured_hosts
from queues.zk.errors import Unavailable


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
        # A start and a session warn of nothing (its config leaves no setting to a default
        # ZooKeeper warns of): a warning in this log is news. But one: a slow disk (a busy
        # machine) makes the server warn of a slow fsync, the machine's news.
        lines = server.log_file.read_text().splitlines()
        assert [line for line in lines if "WARN" in line and "fsync" not in line] == []
    finally:
        assert server.stop() is True
    assert not server.is_serving()
    assert four_letter(server.port) is None
    assert server.pid() is None
    assert not server.pid_file.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert zk_server.is_serving()


def servers_of(folder: Path) -> list[int]:
    """The processes running a ZooKeeper configured from ``folder``."""
    config = str(folder / "zoo.cfg").encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and config in (entry / "cmdline").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.zookeeper
def test_a_folder_runs_one_server_whatever_port_later_commands_ask_for(tmp_path: Path) -> None:
    folder = tmp_path / "zk"
    # Processes starting together, each with another idea of the port (a console, and shells
    # without its environment), end up on one server.
    servers = [LocalZooKeeper(folder, free_port()) for _ in range(3)]
    threads = [threading.Thread(target=s.start) for s in servers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    try:
        assert len(servers_of(folder)) == 1
        assert len({s.port for s in servers}) == 1
        assert all(s.is_serving() for s in servers)
        status = LocalZooKeeper(folder, free_port())
        status.follow_running()
        assert status.port == servers[0].port
    finally:
        assert LocalZooKeeper(folder, free_port()).stop() is True
    assert servers_of(folder) == []


def test_a_stale_pid_file_names_no_server(tmp_path: Path) -> None:
    server = LocalZooKeeper(tmp_path / "zk", free_port())
    server.directory.mkdir()
    server.pid_file.write_text(str(os.getpid()))  # alive, but not a ZooKeeper of this folder
    assert server.running() is None
    assert server.stop() is False  # and it is not signalled


# Which server a process uses: never one it started behind the operator's back ---------------


def test_an_empty_zk_hosts_starts_nothing_and_says_what_to_set(settings, tmp_path: Path) -> None:
    settings.ZK_HOSTS = ""
    settings.MRT_VAR_DIR = tmp_path
    with pytest.raises(Unavailable, match="ZK_HOSTS is not set: name the ensemble"):
        configured_hosts()
    assert not (tmp_path / "zookeeper").exists(), "no server folder, no server"


@pytest.mark.zookeeper
def test_local_starts_the_projects_server_and_an_empty_setting_then_follows_it(
    settings, tmp_path: Path
) -> None:
    settings.MRT_VAR_DIR = tmp_path
    settings.ZK_LOCAL_PORT = free_port()
    settings.ZK_HOSTS = "local"
    hosts = configured_hosts()
    server = local_server(tmp_path, settings.ZK_LOCAL_PORT)
    try:
        assert hosts == f"127.0.0.1:{settings.ZK_LOCAL_PORT}"
        assert server.is_serving()
        # A shell command beside bin/run-console (ZK_HOSTS unset) uses the running server,
        # even when it asks for another port.
        settings.ZK_HOSTS = ""
        settings.ZK_LOCAL_PORT = free_port()
        assert configured_hosts() == hosts
    finally:
        server.stop()


# jute.maxbuffer: the largest packet the server takes (and so the largest folder listing) -----


def test_the_server_is_started_with_jute_maxbuffer_and_a_raised_one_takes_packets_past_1_mib(
    zk_server: LocalZooKeeper, tmp_path: Path
) -> None:
    pid = zk_server.running()
    assert pid is not None
    arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert f"-Djute.maxbuffer={DEFAULT_JUTE_MAXBUFFER}".encode() in arguments
    # The default is ZooKeeper's own (1 MiB - 1), as Merritt's servers most likely run; a
    # server started with more takes more.
    big = b"x" * (2 * 1024 * 1024)
    server = LocalZooKeeper(tmp_path / "zk-big", free_port(), jute_maxbuffer=4 * 1024 * 1024)
    server.start()
    try:
        client = zkmod.connect(server.hosts)
        try:
            client.create("/big", big)
            assert client.get("/big")[0] == big
        finally:
            client.stop()
            client.close()
    finally:
        server.stop()


def test_zk_jute_maxbuffer_sets_it_and_a_bad_value_is_named(monkeypatch) -> None:
    monkeypatch.delenv("ZK_JUTE_MAXBUFFER", raising=False)
    assert jute_maxbuffer_from_env() == DEFAULT_JUTE_MAXBUFFER
    monkeypatch.setenv("ZK_JUTE_MAXBUFFER", " 67108864 ")
    assert jute_maxbuffer_from_env() == 64 * 1024 * 1024
    for bad in ("64m", "-1", "12"):
        monkeypatch.setenv("ZK_JUTE_MAXBUFFER", bad)
        with pytest.raises(LocalServerError, match="ZK_JUTE_MAXBUFFER"):
            jute_maxbuffer_from_env()


def test_local_heap_is_checked_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZK_LOCAL_HEAP", "2g")
    assert heap_from_env() == "2g"
    monkeypatch.setenv("ZK_LOCAL_HEAP", "")
    assert heap_from_env() == "512m"
    monkeypatch.setenv("ZK_LOCAL_HEAP", "lots")
    with pytest.raises(LocalServerError, match="ZK_LOCAL_HEAP"):
        heap_from_env()


def test_jvm_flags_reach_the_server_and_a_bad_value_is_named(
    zk_server: LocalZooKeeper, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The suite's servers run with the flags tests/conftest.py sets.
    pid = zk_server.running()
    assert pid is not None
    arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"-XX:TieredStopAtLevel=1" in arguments and b"-Dzookeeper.forceSync=no" in arguments
    monkeypatch.setenv("ZK_LOCAL_JVMFLAGS", " -Xss1m  '-Dx=a b' ")
    assert jvm_flags_from_env() == ["-Xss1m", "-Dx=a b"]
    monkeypatch.setenv("ZK_LOCAL_JVMFLAGS", "")
    assert jvm_flags_from_env() == []
    for bad in ("-Xss1m Main", "'-Dx=a"):
        monkeypatch.setenv("ZK_LOCAL_JVMFLAGS", bad)
        with pytest.raises(LocalServerError, match="ZK_LOCAL_JVMFLAGS"):
            jvm_flags_from_env()
