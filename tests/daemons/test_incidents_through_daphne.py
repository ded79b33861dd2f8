"""The incident console through daphne with the daemons running (issue 24): a token made by
``manage.py apitoken``; a storage node held through the API with a maintenance window a few
seconds long, released by a ``runconsumer maintenance`` process at its end; the backlog in
``/api/overview``; the environment named on the pages daphne serves."""

from __future__ import annotations

import signal
import subprocess
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.live.conftest import api_json, api_token, console_env, daphne, manage_py

from .conftest import wait_for

pytestmark = [pytest.mark.live_server, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_node_hold_with_a_window_through_daphne_ends_by_itself(
    zk: Any, zk_hosts: str, tmp_path: Path
) -> None:
    env = console_env(
        zk_hosts, tmp_path, user="ops", password="pw-" + "x" * 20, MRT_ENVIRONMENT="stage"
    )
    manage = manage_py()
    key = api_token(env, tmp_path / "key", user="ops", name="ops")
    log = tmp_path / "maintenance.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen(
            [*manage, "runconsumer", "maintenance"],
            cwd=settings.BASE_DIR,
            env={**env, "LOG_LEVEL": "INFO"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        with daphne(env, tmp_path / "daphne.log") as url:
            login = urllib.request.urlopen(f"{url}/login/", timeout=30).read().decode()
            assert "STAGE · not production" in login and "<title>[STAGE] " in login
            end = datetime.now(UTC) + timedelta(seconds=4)
            held = api_json(
                f"{url}/api/holds/node/9501/hold",
                key,
                {"reason": "node 9501 patch", "until": end.isoformat()},
            )
            assert held, held
            holds = api_json(f"{url}/api/holds", key)
            assert holds["nodes"]["9501"]["reason"] == "node 9501 patch"
            assert [(w["kind"], w["name"]) for w in holds["windows"]] == [("node", "9501")]
            overview = api_json(f"{url}/api/overview", key)
            assert "backlog" in overview and "disk" in overview["backlog"]
            # Released by the maintenance process at the window's end, not before.
            assert api_json(f"{url}/api/holds", key)["nodes"]
            wait_for(lambda: not api_json(f"{url}/api/holds", key)["nodes"], timeout=60)
            assert datetime.now(UTC) >= end
            assert api_json(f"{url}/api/holds", key)["windows"] == []
            entries = api_json(f"{url}/api/audit", key)
            actions = sorted(e["action"] for e in entries["items"] if e["kind"] == "node")
            assert actions == ["hold", "release"], entries
        assert "node:9501 maintenance released" in log.read_text()
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
