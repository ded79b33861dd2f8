"""A web host whose clock is ten minutes off the ZooKeeper server's: the console under daphne,
run by Debian's libfaketime against the test's real ZooKeeper. Node times are the server's
clock, so the ages a page or the API shows, the job list's "in state at least" filter and a new
maintenance window's "is its end past" take "now" from the server (``queues/zk/servertime.py``),
not from the web host."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sqlite3
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from queues.zk import paths, servertime
from queues.zk.batches import batch_create
from queues.zk.jobs import job_create, job_transition
from queues.zk.locks import lock_create
from queues.zk.maintenance import node_holds, windows
from tests.live.conftest import api_json, api_token, console_env, daphne, log_in
from tests.retention.test_clock_skew import _env, _libfaketime, _skewed

pytestmark = [
    pytest.mark.slow,  # a daphne process per test
    pytest.mark.live_server,
    pytest.mark.django_db,
    pytest.mark.skipif(
        shutil.which("faketime") is None, reason="needs Debian's faketime (bin/install --tests)"
    ),
]

USER, PASSWORD = "skewed-admin", "skewed-admin-password-1"


def _skewed_env(zk_hosts: str, tmp_path: Path, offset: str) -> dict[str, str]:
    """A console's environment whose processes (migrate, apitoken, daphne) see the wall clock
    ``offset`` from the true one; their monotonic clock is left alone, as NTP leaves it."""
    return console_env(
        zk_hosts,
        tmp_path,
        user=USER,
        password=PASSWORD,
        LD_PRELOAD=_libfaketime(),
        FAKETIME=offset,
        DONT_FAKE_MONOTONIC="1",
    )


def _post(url: str, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(json.load(answer))
    except urllib.error.HTTPError as refused:
        return refused.code, dict(json.load(refused))


def _assert_ahead(tmp_path: Path, zk: Any) -> None:
    """The web process is skewed: the log-in it just took is stamped (``last_login``, by
    its own clock) ten minutes past the server's time."""
    with contextlib.closing(sqlite3.connect(tmp_path / "console.sqlite3")) as db:
        (stamped,) = db.execute("SELECT last_login FROM auth_user WHERE username = ?", [USER])
    at = datetime.fromisoformat(stamped[0]).replace(tzinfo=UTC).timestamp()
    ahead = at - servertime.server_now(zk)
    assert 500 < ahead < 700, f"the web process's clock is {ahead:.0f} s ahead"


def test_a_web_host_ten_minutes_ahead_shows_the_servers_ages(
    zk: Any, zk_hosts: str, tmp_path: Path
) -> None:
    """A job that entered Estimating just now, locked just now: the API says seconds, not ten
    minutes, in the state and of its lock; the "in state at least 6 minutes" filter leaves it
    out; its page and the job list say seconds."""
    env = _skewed_env(zk_hosts, tmp_path, "+10m")
    key = api_token(env, tmp_path / "key", user=USER, name="skew")
    batch = batch_create(zk, submission={"profile": "demo", "submitter": "t"})
    job = job_create(zk, bid=batch.bid, configuration={"profile": "demo", "submitter": "t"})
    job_transition(zk, job, "Estimating")
    assert lock_create(zk, paths.job_node(job.jid, "lock"))

    with daphne(env, tmp_path / "daphne.log") as base:
        session = log_in(base, USER, PASSWORD)
        _assert_ahead(tmp_path, zk)

        seen = api_json(f"{base}/api/jobs/{job.jid}", key)
        assert seen["state"] == "Estimating" and seen["locked"], seen
        assert 0 <= seen["seconds_in_state"] < 300, seen
        assert 0 <= seen["lock_age_seconds"] < 300, seen

        query = urllib.parse.urlencode({"state": "Estimating", "min_age_hours": "0.1"})
        older = api_json(f"{base}/api/jobs?{query}", key)
        assert [j["id"] for j in older["items"]] == [], older
        every = api_json(f"{base}/api/jobs?state=Estimating", key)
        assert [j["id"] for j in every["items"]] == [job.jid], every
        assert every["items"][0]["seconds_in_state"] < 300, every

        page = session.get(f"{base}/jobs/{job.jid}/", timeout=30).text
        state = re.search(r'id="job-state">(.*?)</dd>', page, re.S)
        assert state is not None and re.search(r"for \d+s$", state.group(1).strip()), state
        held = re.search(r"held by session \d+ for (\d+\w+)<", page)
        assert held is not None and re.fullmatch(r"\d+s", held.group(1)), held
        listing = session.get(f"{base}/jobs/?state=Estimating", timeout=30).text
        cells = re.findall(r'data-label="in state">([^<]*)<', listing)
        assert cells and all(re.fullmatch(r"\d+s", c) for c in cells), cells


def test_a_web_host_ten_minutes_ahead_judges_a_windows_end_by_the_servers_clock(
    zk: Any, zk_hosts: str, tmp_path: Path
) -> None:
    """An end five minutes ahead by the server is before now on the host's clock: the hold is
    placed with its window all the same. An end a minute past by the server is refused, and
    nothing is held; the holds page shows the window as ahead, not ended."""
    env = _skewed_env(zk_hosts, tmp_path, "+10m")
    key = api_token(env, tmp_path / "key", user=USER, name="skew")
    server = datetime.fromtimestamp(servertime.server_now(zk), UTC)
    soon = (server + timedelta(minutes=5)).isoformat()
    past = (server - timedelta(minutes=1)).isoformat()

    with daphne(env, tmp_path / "daphne.log") as base:
        code, said = _post(
            f"{base}/api/holds/node/9801/hold", key, {"reason": "disk swap", "until": past}
        )
        assert code == 400 and "in the future" in said["error"], (code, said)
        assert 9801 not in node_holds(zk) and windows(zk) == []

        code, said = _post(
            f"{base}/api/holds/node/9802/hold", key, {"reason": "disk swap", "until": soon}
        )
        assert code == 200, (code, said)
        assert 9802 in node_holds(zk)
        assert [w.key for w in windows(zk)] == ["node:9802"]

        session = log_in(base, USER, PASSWORD)
        _assert_ahead(tmp_path, zk)
        page = session.get(f"{base}/holds/", timeout=30).text
        shown = re.search(r'data-window="node:9802".*?</div>', page, re.S)
        assert shown is not None, page[-2000:]
        assert "ended" not in shown.group(0) and "past its end" not in shown.group(0), shown
        assert re.search(r"in \d+\xa0minutes?", shown.group(0)), shown.group(0)


# Run on a host ten minutes behind: a node hold asked with an end that is past by the server.
HOLD_PAST_END = """
import json
from datetime import UTC, datetime
from queues.services.hold_moves import node_hold
try:
    node_hold(node="9803", until=datetime.fromtimestamp(UNTIL, UTC), reason="disk swap")
    said = "held"
except ValueError as exc:
    said = f"refused: {exc}"
print(json.dumps({"said": said}))
"""


def test_a_host_ten_minutes_behind_refuses_an_end_past_by_the_servers_clock(
    zk: Any, zk_hosts: str, tmp_path: Path
) -> None:
    """An end a minute past by the server is nine minutes ahead on a host ten minutes behind:
    refused all the same, and nothing is held (else the hold would be released at once)."""
    until = servertime.server_now(zk) - 60
    script = HOLD_PAST_END.replace("UNTIL", repr(until))

    seen = _skewed("-10m", script, _env(zk_hosts, tmp_path))

    assert seen["said"].startswith("refused: ") and "in the future" in seen["said"], seen
    assert 9803 not in node_holds(zk) and windows(zk) == []
