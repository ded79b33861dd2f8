"""One MRT_VAR_DIR for every daemon (issue 23, item 8): the first daemon process writes a marker
file into its folder and names it in ZooKeeper; a process whose folder lacks that marker
refuses to start, saying what to share and how to name a new folder."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from queues.daemons.registration import ProcessObserver
from queues.daemons.vardir import MARKER, VarDirNotShared
from queues.zk import consumers as zconsumers
from tests.cockpit.conftest import SlowStep
from tests.live.conftest import child_env, manage_py


def _observer(zk, folder: Path, host: str = "daemon-host") -> ProcessObserver:
    return ProcessObserver(zk, [SlowStep(zk=zk)], record=False, host=host, var_dir=folder)


def test_the_first_daemon_writes_the_marker_and_names_its_folder(zk, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    _observer(zk, shared, host="first-host")
    token = (shared / MARKER).read_text().strip()
    assert len(token) == 32
    record = json.loads(zk.get(zconsumers.VAR_DIR)[0])
    assert (record["token"], record["path"], record["host"]) == (
        token,
        str(shared.resolve()),
        "first-host",
    )
    # The node is persistent: it outlives the session that wrote it.
    assert zk.exists(zconsumers.VAR_DIR).ephemeralOwner == 0
    # A second process on the same folder starts, and changes nothing.
    _observer(zk, shared, host="second-host")
    assert (shared / MARKER).read_text().strip() == token
    assert json.loads(zk.get(zconsumers.VAR_DIR)[0])["host"] == "first-host"


def test_a_daemon_with_a_folder_of_its_own_refuses_to_start(zk, other_zk, tmp_path: Path) -> None:
    shared, own = tmp_path / "shared", tmp_path / "own"
    _observer(zk, shared)
    with pytest.raises(VarDirNotShared) as refused:
        _observer(other_zk, own)
    message = str(refused.value)
    assert f"MRT_VAR_DIR {own.resolve()} is not the folder the other consumer daemons share" in (
        message
    )
    assert str(shared.resolve()) in message and "/mrt-console/var-dir" in message
    assert "DJANGO_SECRET_KEY" in message and f"{own.resolve() / MARKER} is missing" in message
    assert refused.value.returncode == 2
    # A folder whose marker is another queue's is refused as well.
    own.mkdir()
    (own / MARKER).write_text("0" * 32 + "\n")
    with pytest.raises(VarDirNotShared, match="holds another token"):
        _observer(other_zk, own)


def test_a_folder_that_moved_with_its_marker_is_accepted(zk, tmp_path: Path) -> None:
    old, moved = tmp_path / "old", tmp_path / "moved"
    _observer(zk, old)
    moved.mkdir()
    shutil.copy(old / MARKER, moved / MARKER)
    _observer(zk, moved)


def test_removing_the_node_lets_the_next_daemon_name_a_new_folder(zk, tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    _observer(zk, old)
    zk.delete(zconsumers.VAR_DIR)
    _observer(zk, new)
    assert json.loads(zk.get(zconsumers.VAR_DIR)[0])["path"] == str(new.resolve())
    with pytest.raises(VarDirNotShared):
        _observer(zk, old)


@pytest.mark.slow
def test_runconsumer_on_another_folder_exits_with_the_reason(
    zk, zk_hosts: str, tmp_path: Path
) -> None:
    """A real ``runconsumer`` process: the refusal is its last word and exit status 2, before
    it claims anything."""
    shared, own = tmp_path / "shared", tmp_path / "own"
    _observer(zk, shared)
    env = child_env(zk_hosts, tmp_path, MRT_VAR_DIR=str(own), DJANGO_SECRET_KEY="k" * 50)
    done = subprocess.run(
        [*manage_py(), "runconsumer", "pending", "--poll", "0.5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "is not the folder the other consumer daemons share" in done.stderr
    assert "Traceback" not in done.stderr
    assert zconsumers.consumers_list(zk) == []
