"""Hosts whose clocks disagree with the ZooKeeper server's: a real process run under Debian's
libfaketime (``faketime``, installed by ``bin/install --tests``) against the test's real
ZooKeeper. Node times are the server's clock, so a decision on them takes "now" from the server
(``queues/zk/servertime.py``), not from the host: a host ten minutes ahead archives nothing
early, and a host whose clock is stepped while it runs keeps the server's time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from queues.core import retries
from queues.zk import jobs as zjobs
from queues.zk import paths, servertime
from queues.zk.maintenance import node_hold_set, window_set

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,  # a Django process started per test
    pytest.mark.skipif(
        shutil.which("faketime") is None, reason="needs Debian's faketime (bin/install --tests)"
    ),
]

# Run in the skewed process: the retention decision on one batch, and that host's clocks.
DECIDE = """
import json, time
from datetime import timedelta
from queues.operator import archive
from queues.zk.client import client
from queues.zk.servertime import server_now
zk = client()
try:
    archive.ready_to_archive(zk, BID, older_than=timedelta(minutes=5))
    verdict = "ready"
except archive.LeftAlone as exc:
    verdict = f"left alone: {exc}"
print(json.dumps({"verdict": verdict, "local": time.time(), "server": server_now(zk)}))
"""

# Run in the skewed process: ``queue cleanup``'s sweep of batches (five minutes' age).
CLEANUP = """
import json
from datetime import timedelta
from queues.services.moves import batches_cleanup
done = [o.id for o in batches_cleanup(older_than=timedelta(minutes=5))]
print(json.dumps({"removed": done}))
"""

# Run in the skewed process: the windows the maintenance daemon's sweep would release now.
DUE = """
import json
from queues.zk.client import client
from queues.zk.maintenance import due
print(json.dumps({"due": [w.key for w in due(client())]}))
"""

# Run in the skewed process: the Storing daemon meets a storage outage on a job it locked and
# writes the job's next try, as its step's failure does.
WRITE_WAIT = """
import json
from queues.core.retries import ServiceUnavailable
from queues.daemons.retrying import retry_later
from queues.zk import paths
from queues.zk.client import client
from queues.zk.jobs import job_unlock, jobs_load
from queues.zk.locks import lock_create
zk = client()
assert lock_create(zk, paths.job_node(JID, "lock"))
(job,) = jobs_load(zk, [JID])
outage = ServiceUnavailable("storage", "HTTP 503")
again, message, until = retry_later(zk, job, "Storing", outage, "HTTP 503")
job_unlock(zk, job)
print(json.dumps({"again": again, "until": until}))
"""

# Run in the skewed process: whether the Storing daemon's listing passes the job over, the
# question its loops ask of a job found with a next try on its status.
READ_WAIT = """
import json
from queues.daemons.registry import DAEMONS
from queues.zk.client import client
from queues.zk.jobs import jobs_load
zk = client()
daemon = DAEMONS["storing"](zk=zk)
(job,) = jobs_load(zk, [JID])
print(json.dumps({"waits": daemon.retry_waits.due_later(job)}))
"""

# Run in the skewed process: one round of the alerts daemon (its own database, migrated).
ALERTS_ROUND = """
import json
from django.core.management import call_command
call_command("migrate", verbosity=0)
import queues.daemons.registry  # every daemon's module, and so every rule
from queues.daemons.alerts import Alerts
from queues.zk.client import client
daemon = Alerts(zk=client())
said = daemon.round()
print(json.dumps({"said": said, "leading": daemon.leading}))
"""

# Run in a process whose clock is stepped while it runs: one line out per line in.
WATCH = """
import json, sys, time
from queues.zk.client import client
from queues.zk.servertime import server_now
zk = client()
for _ in sys.stdin:
    print(json.dumps({"local": time.time(), "server": server_now(zk)}), flush=True)
"""


def _env(zk_hosts: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    # The host's wall clock only: a real NTP step leaves the monotonic clock alone.
    return {
        **os.environ,
        "ZK_HOSTS": zk_hosts,
        "MRT_VAR_DIR": str(tmp_path),
        "DONT_FAKE_MONOTONIC": "1",
        **extra,
    }


def _skewed(offset: str, script: str, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        ["faketime", "-f", offset, sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_host_ten_minutes_ahead_archives_nothing_early(
    zk: Any, zk_hosts: str, finished_batch: Any, tmp_path: Path
) -> None:
    """A batch finished just now is five minutes short of a five-minute retention on every
    clock but the skewed host's own: that host leaves it alone."""
    batch, _ = finished_batch(("Completed",))
    # manage.py shell -c passes no arguments on: the batch id goes into the script.
    script = DECIDE.replace("BID", repr(batch.bid))

    seen = _skewed("+10m", script, env=_env(zk_hosts, tmp_path))

    assert seen["local"] - seen["server"] > 500, f"the process was not skewed: {seen}"
    assert seen["verdict"] == "left alone: finished too recently", seen


def test_a_cleanup_on_a_host_ten_minutes_ahead_removes_nothing_early(
    zk: Any, zk_hosts: str, finished_batch: Any, tmp_path: Path
) -> None:
    """``queue cleanup --older-than-days`` on a skewed host: a batch Completed just now is not
    five minutes old by the server's clock, and stays."""
    batch, _ = finished_batch(("Completed",))

    seen = _skewed("+10m", CLEANUP, env=_env(zk_hosts, tmp_path))

    assert seen == {"removed": []}
    assert zk.exists(paths.batch(batch.bid)) is not None


def test_a_host_ten_minutes_ahead_releases_no_hold_before_its_end(
    zk: Any, zk_hosts: str, tmp_path: Path
) -> None:
    """A storage node held for five more minutes: the maintenance daemon's sweep on a host
    whose clock runs ten minutes ahead finds no window due; one past its end it does find."""
    node_hold_set(zk, 9601)
    window_set(zk, "node", "9601", until=datetime.now(UTC) + timedelta(minutes=5))
    node_hold_set(zk, 9602)
    window_set(zk, "node", "9602", until=datetime.now(UTC) - timedelta(seconds=1))

    seen = _skewed("+10m", DUE, env=_env(zk_hosts, tmp_path))

    assert seen["due"] == ["node:9602"], seen


def test_a_wait_written_by_a_host_ten_minutes_ahead_is_as_long_as_its_policy_says(
    zk: Any, zk_hosts: str, finished_batch: Any, tmp_path: Path
) -> None:
    """Storage's first wait is 30 s (with jitter): written by a host ten minutes ahead, every
    other host still tries the job again within the policy's wait, not ten minutes later."""
    _, (job,) = finished_batch(("Storing",), batch_state="Processing")
    script = WRITE_WAIT.replace("JID", repr(job.jid))

    seen = _skewed("+10m", script, env=_env(zk_hosts, tmp_path))

    assert seen["again"], seen
    (written,) = zjobs.jobs_load(zk, [job.jid])
    left = retries.next_try(written.status.raw) - servertime.server_now(zk)
    first = retries.DEFAULT_POLICIES["storage"].first
    assert 0 < left <= 2 * first + 5, f"the next try is {left:.0f} s away by the server"


def test_a_host_ten_minutes_ahead_honours_a_wait_another_host_wrote(
    zk: Any, zk_hosts: str, finished_batch: Any, tmp_path: Path
) -> None:
    """A job whose next try is five minutes away by the server's clock: a Storing daemon on a
    host ten minutes ahead passes it over."""
    _, (job,) = finished_batch(("Storing",), batch_state="Processing")
    later = servertime.server_now(zk) + 300
    path = paths.job_node(job.jid, "status")
    raw = json.loads(zk.get(path)[0])
    raw[retries.RETRY_KEY] = {
        "state": "Storing",
        "service": "storage",
        "attempt": 1,
        "first": later - 330,
        "next": later,
        "reasons": [],
    }
    zk.set(path, json.dumps(raw).encode())
    script = READ_WAIT.replace("JID", repr(job.jid))

    seen = _skewed("+10m", script, env=_env(zk_hosts, tmp_path))

    assert seen == {"waits": True}


def test_an_alerts_daemon_ten_minutes_ahead_reports_no_overrun_before_its_time(
    zk: Any, zk_hosts: str, tmp_path: Path
) -> None:
    """A storage node's window ended a minute ago and its hold is still there: the
    ``hold-overrun`` rule waits five minutes past the end. The alerts daemon of a host ten
    minutes ahead leads and evaluates, and reports nothing yet; of an end six minutes ago,
    it does."""
    node_hold_set(zk, 9701)
    window_set(
        zk, "node", "9701", until=datetime.now(UTC) - timedelta(minutes=1), auto_release=False
    )
    node_hold_set(zk, 9702)
    window_set(
        zk, "node", "9702", until=datetime.now(UTC) - timedelta(minutes=6), auto_release=False
    )

    seen = _skewed("+10m", ALERTS_ROUND, env=_env(zk_hosts, tmp_path))

    assert seen["leading"], seen
    said = " ".join(seen["said"])
    assert "hold-overrun[node:9702] fired" in said, seen
    assert "hold-overrun[node:9701]" not in said, seen


def test_a_clock_stepped_while_running_keeps_the_server_time(
    zk: Any, zk_hosts: str, tmp_path: Path
) -> None:
    """The host's clock is stepped a day ahead, then an hour behind, while the process runs;
    its idea of the server's time follows the server, never the step."""
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")
    env = _env(
        zk_hosts,
        tmp_path,
        LD_PRELOAD=_libfaketime(),
        FAKETIME_TIMESTAMP_FILE=str(offset),
        FAKETIME_NO_CACHE="1",
    )
    child = subprocess.Popen(
        [sys.executable, "manage.py", "shell", "-c", WATCH],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def ask() -> dict[str, Any]:
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write("\n")
            child.stdin.flush()
            line = child.stdout.readline()
            while line and not line.startswith("{"):  # the shell's own words at its start
                line = child.stdout.readline()
            assert line, child.stderr.read() if child.stderr else "no answer"
            return json.loads(line)

        first = ask()
        assert abs(first["local"] - first["server"]) < 60, first
        for step, shift in (("+1d", 86400), ("-1h", -3600)):
            offset.write_text(f"{step}\n")
            seen = ask()
            assert abs(seen["local"] - seen["server"] - shift) < 60, seen
            # The server's time as this test's host reads it (its clock is not skewed).
            here = servertime.server_now(zk)
            assert abs(seen["server"] - here) < 60, (seen, here)
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(timeout=60)


def _libfaketime() -> str:
    for folder in ("/usr/lib/x86_64-linux-gnu/faketime", "/usr/lib/aarch64-linux-gnu/faketime"):
        found = Path(folder) / "libfaketime.so.1"
        if found.exists():
            return str(found)
    pytest.skip("libfaketime.so.1 not found")
    raise AssertionError  # unreachable
