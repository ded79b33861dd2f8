"""A bulk run's heartbeat is written by the bulk-runs daemon's host and judged (30 s,
``STALE_AFTER``) by a web host: both on the database server's clock (``queues.models.db_now``),
so a web host whose own clock is ten minutes off neither calls a live run interrupted (and lets
a Continue take it from its daemon) nor a dead one alive. The judging process runs under
Debian's libfaketime against the test's real PostgreSQL (SQLite's clock is its one host's)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from queues.models import STALE_AFTER, BulkRun, ConsistencyRun, db_now
from queues.operator import bulkrun
from tests.pg import pg_cluster, pg_db, pg_url  # noqa: F401 - fixtures
from tests.retention.test_clock_skew import _env, _skewed

pytestmark = [
    pytest.mark.slow,  # a Django process started per look
    pytest.mark.postgres,
    pytest.mark.skipif(
        shutil.which("faketime") is None, reason="needs Debian's faketime (bin/install --tests)"
    ),
]

# Run in the skewed web host: how it shows the run, and whether its Continue takes the run.
JUDGE = """
import json
from django.contrib.auth import get_user_model
from queues.models import BulkRun, ConsistencyRun
from queues.operator import bulkrun
from queues.web.api import bulk_run_json
run = BulkRun.objects.get(pk=PK)
user = get_user_model().objects.get(username="bulk-admin")
shown = bulk_run_json(run)["state"]
taken = bulkrun.control(run, "continue", user=user)
check = ConsistencyRun.objects.get(pk=CHECK)
print(json.dumps({"shown": shown, "continued": taken, "check": check.shown_state}))
"""


def _runs(owner: str) -> tuple[BulkRun, ConsistencyRun]:
    """A bulk run and a consistency check, each claimed by a daemon just now (this process's
    clock is not skewed)."""
    user = get_user_model().objects.create_superuser("bulk-admin", "b@example.org", "x" * 20)
    run = BulkRun.objects.create(
        user=user, kind="job", action="delete", items=[["jid0000000001", None]], total=1
    )
    claimed = bulkrun.claim(owner)
    assert claimed is not None and claimed.pk == run.pk
    check = ConsistencyRun.objects.create(owner=owner, heartbeat=db_now())
    return claimed, check


def _judged(offset: str, run: BulkRun, check: ConsistencyRun, env: dict[str, str]) -> Any:
    script = JUDGE.replace("PK", str(run.pk)).replace("CHECK", str(check.pk))
    return _skewed(offset, script, env)


def test_a_web_host_ten_minutes_ahead_leaves_a_live_run_to_its_daemon(
    zk_hosts: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    env = _env(zk_hosts, tmp_path, DATABASE_URL=request.getfixturevalue("pg_db"))
    run, check = _runs("daemon-host:1:1")

    seen = _judged("+10m", run, check, env)

    assert seen == {"shown": "running", "continued": False, "check": "running"}, seen
    after = BulkRun.objects.get(pk=run.pk)
    assert after.owner == "daemon-host:1:1" and after.heartbeat == run.heartbeat


def test_a_web_host_ten_minutes_behind_sees_a_dead_daemons_run_interrupted(
    zk_hosts: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The daemon's last heartbeat is a minute old by the database's clock: a host whose clock
    is ten minutes behind still shows the run interrupted, and its Continue hands it on."""
    env = _env(zk_hosts, tmp_path, DATABASE_URL=request.getfixturevalue("pg_db"))
    run, check = _runs("daemon-host:1:1")
    old = db_now() - STALE_AFTER * 2
    BulkRun.objects.filter(pk=run.pk).update(heartbeat=old)
    ConsistencyRun.objects.filter(pk=check.pk).update(heartbeat=old)
    run = BulkRun.objects.get(pk=run.pk)

    seen = _judged("-10m", run, check, env)

    assert seen == {"shown": "interrupted", "continued": True, "check": "interrupted"}, seen
    after = BulkRun.objects.get(pk=run.pk)
    assert after.owner == "" and after.state == BulkRun.RUNNING  # for a daemon to claim
