"""A consumer's registration node goes through the same size check as every node we write
(``queues/zk/sized.py``; the contract's "Sizes"): one past what a request carries is refused
before it is sent, with the sizes named. Sent, ZooKeeper would drop the connection at once (a
request past its ``jute.maxbuffer``), the start would log "not registered yet" as if the
ensemble were away, and every later publish would drop the connection again under the
process's locks and moves."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from queues.daemons import registration
from queues.daemons.registration import ProcessObserver
from queues.management.commands import runconsumer
from queues.zk import client as zkmod
from queues.zk import consumers as zconsumers
from queues.zk.kazoo_private import session_id
from queues.zk.sized import NODE_BUDGET, TooLarge
from tests.live.conftest import child_env, manage_py

from .conftest import SlowStep

pytestmark = pytest.mark.django_db

# Lock paths as long as a long ARK makes them: 2,000 of them (LOCKS_PUBLISHED) pass 1 MiB.
LONG = "/locks/storage/ark:/99999/" + "x" * 600
TOO_MANY = frozenset(f"{LONG}{n:05d}" for n in range(zconsumers.LOCKS_PUBLISHED))


@pytest.fixture
def other(zk_hosts):
    """The consumer process's own session."""
    client = zkmod.connect(zk_hosts)
    yield client
    client.stop()
    client.close()


def test_a_registration_too_large_is_refused_at_the_start_and_the_session_kept(zk, other) -> None:
    observer = ProcessObserver(
        other,
        [SlowStep(zk=other)],
        record=False,
        publish_seconds=0.2,
        host="big.example",
        pid=77,
        ledger=lambda: TOO_MANY,
    )
    assert sum(len(p) for p in TOO_MANY) > NODE_BUDGET
    session = session_id(other)
    with pytest.raises(TooLarge, match=r"registration of consumer big\.example-77: .* bytes"):
        observer.start(background=False)
    assert zk.exists(zconsumers.consumer_path("big.example-77")) is None
    # Nothing was sent: the connection was not dropped, the session is the same.
    assert other.connected and session_id(other) == session
    observer.stop()  # nothing started: nothing to stop


def test_a_publish_grown_too_large_is_refused_and_the_last_registration_stands(zk, other) -> None:
    held: frozenset[str] = frozenset()
    observer = ProcessObserver(
        other,
        [SlowStep(zk=other)],
        record=False,
        publish_seconds=3600,  # published here by hand
        host="grows.example",
        pid=78,
        ledger=lambda: held,
    )
    observer.start(background=False)
    try:
        (entry,) = zconsumers.consumers_list(zk)
        assert entry["name"] == "grows.example-78" and entry["locks"] == []
        session = session_id(other)
        held = TOO_MANY
        with pytest.raises(TooLarge, match=r"registration of consumer grows\.example-78"):
            observer.publish()
        assert other.connected and session_id(other) == session
        (entry,) = zconsumers.consumers_list(zk)
        assert entry["locks"] == [] and "error" not in entry
    finally:
        observer.stop()


def test_the_shared_folder_record_is_checked_too(zk) -> None:
    """Written by the first daemon from its host name and folder, before it registers."""
    record = {"token": "t", "path": "/" + "p" * NODE_BUDGET, "host": "h", "at": "now"}
    with pytest.raises(TooLarge, match="the shared folder's record"):
        zconsumers.var_dir_claim(zk, record)
    assert zconsumers.var_dir_read(zk) != record


# ---- runconsumer: a registration too large ends the start in one line ----------------------

# A version string (MRT_VERSION, or MRT_VERSION_FILE) alone past what one node holds.
HUGE_VERSION = "v" * (NODE_BUDGET + 1)
TOO_LARGE_LINE = re.compile(
    r"CommandError: cannot start: the registration of consumer \S+: [\d,]+ bytes is more than "
    r"one ZooKeeper node may hold \([\d,]+ bytes: the default jute\.maxbuffer less [\d,]+ for the "
    r"request around it\); its largest parts: version [\d,]+ bytes, .+"
)


def test_runconsumer_once_ends_in_one_line_when_its_registration_is_too_large(
    zk, settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What ``manage.py runconsumer pending --once`` does (run_from_argv): a traceback before."""
    settings.MRT_VERSION = HUGE_VERSION
    monkeypatch.setattr(registration, "_version", None)  # read again from the settings
    with pytest.raises(SystemExit) as exited:
        runconsumer.Command().run_from_argv(["manage.py", "runconsumer", "pending", "--once"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.splitlines()
    assert TOO_LARGE_LINE.fullmatch(line), line
    assert zconsumers.consumers_list(zkmod.client()) == []


@pytest.mark.slow
def test_a_running_consumer_process_ends_in_one_line_when_its_registration_is_too_large(
    zk, zk_hosts: str, tmp_path: Path
) -> None:
    """A real ``runconsumer all`` process (no ``--once``: the path that waits for outages),
    the version read from MRT_VERSION_FILE as an installation may give it."""
    version = tmp_path / "version"
    version.write_text(HUGE_VERSION)
    env = child_env(
        zk_hosts,
        tmp_path,
        MRT_VAR_DIR=str(tmp_path / "var"),
        MRT_VERSION_FILE=str(version),
        DJANGO_SECRET_KEY="k" * 50,
    )
    done = subprocess.run(
        [*manage_py(), "runconsumer", "all", "--poll", "0.5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    # The daemons' start logs its lines first; the last line is the refusal.
    assert TOO_LARGE_LINE.fullmatch(done.stderr.splitlines()[-1]), done.stderr
    assert zconsumers.consumers_list(zk) == []
