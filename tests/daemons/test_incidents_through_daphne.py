"""The incident console through daphne with the daemons running (issue 24): a token made by
``manage.py apitoken``; a storage node held through the API with a maintenance window a few
seconds long, released by a ``runconsumer maintenance`` process at its end; the backlog in
``/api/overview``; the environment named on the pages daphne serves; README's storage-node
outage walked on the pages as an operator clicks them (hold, the overview, release, "Resume
what failed on a storage node between two times")."""

from __future__ import annotations

import re
import signal
import subprocess
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from queues.zk.jobs import job_load, job_transition
from tests.jobnodes import set_job_nodes
from tests.live.conftest import api_json, api_token, console_env, daphne, log_in, manage_py

from .conftest import make_job, wait_for

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


def _failed_storing(zk: Any, node: int, n: int) -> Any:
    """A job bound for storage ``node`` whose Storing failed (the node did not answer)."""
    job = make_job(zk, {"payload_url": f"https://example.org/{n}.pdf"}, state="Storing")
    ark = urllib.parse.quote(f"ark:/99999/fk4n{n}", safe="")  # as Merritt's ingest writes it
    job = set_job_nodes(zk, job, store={"mode": f"add/{node}/{ark}"})
    return job_transition(zk, job, "Failed", message=f"storage node {node}: connection refused")


def _form_fields(html: str, form_id: str) -> list[tuple[str, str]]:
    """The named inputs of the form ``form_id`` as the page drew them, as a browser posts them."""
    found = re.search(rf'<form[^>]*id="{form_id}".*?</form>', html, re.S)
    assert found, f"no form {form_id}"
    inputs = re.findall(r"<input[^>]*>", found.group(0))
    fields = []
    for tag in inputs:
        name = re.search(r'name="([^"]+)"', tag)
        value = re.search(r'value="([^"]*)"', tag)
        if name:
            fields.append((name.group(1), value.group(1) if value else ""))
    return fields


def test_a_storage_node_outage_walked_on_the_pages_through_daphne(
    zk: Any, zk_hosts: str, tmp_path: Path
) -> None:
    """README, "A storage node goes down": hold the node on /holds/ with a reason, the overview
    shows the held node; release it; "Resume what failed on a storage node between two times"
    lists the jobs the node failed in that window, and its button resumes them in one audited
    bulk action, the page's own form posted as a browser posts it (its CSRF token and all)."""
    password = "pw-" + "x" * 20
    env = console_env(zk_hosts, tmp_path, user="ops", password=password)
    key = api_token(env, tmp_path / "key", user="ops", name="ops")
    since = timezone.localtime() - timedelta(minutes=2)
    on_a = [_failed_storing(zk, 9501, n) for n in (1, 2)]
    on_b = _failed_storing(zk, 9502, 3)
    before = timezone.localtime() + timedelta(minutes=2)
    with daphne(env, tmp_path / "daphne.log") as url:
        ops = log_in(url, "ops", password)

        def csrf() -> str:
            return str(ops.cookies["csrftoken"])

        held = ops.post(
            f"{url}/holds/node/",
            data={"node": "9501", "reason": "disk swap", "csrfmiddlewaretoken": csrf()},
            timeout=30,
        )
        assert held.status_code == 200, held.text[-2000:]
        overview = ops.get(url, timeout=30).text
        card = re.search(r'id="node-holds-card".*?Manage holds', overview, re.S)
        assert card, overview[-3000:]
        assert 'id="node-hold-9501"' in card.group(0) and "disk swap, by ops" in card.group(0)
        released = ops.post(
            f"{url}/holds/node/9501/release/", data={"csrfmiddlewaretoken": csrf()}, timeout=30
        )
        assert released.status_code == 200, released.text[-2000:]
        assert api_json(f"{url}/api/holds", key)["nodes"] == {}

        window = {
            "node": "9501",
            "since": since.strftime("%Y-%m-%d %H:%M"),
            "before": before.strftime("%Y-%m-%d %H:%M"),
        }
        page = ops.get(f"{url}/holds/node-failed/", params=window, timeout=30)
        assert page.status_code == 200, page.text[-2000:]
        assert "2 jobs failed on node 9501" in page.text
        listed = set(re.findall(r'id="node-failed-(jid[0-9]{10})"', page.text))
        assert listed == {j.jid for j in on_a}
        resumed = ops.post(
            f"{url}/failed/bulk/", data=_form_fields(page.text, "node-failed-resume"), timeout=30
        )
        assert resumed.status_code == 200, resumed.text[-2000:]
        assert {job_load(zk, j.jid).state for j in on_a} == {"Storing"}
        assert job_load(zk, on_b.jid).state == "Failed"
        entries = api_json(f"{url}/api/audit", key)["items"]
        resumes = [e for e in entries if e["action"] == "resume" and e["ok"]]
        assert sorted(e["item_id"] for e in resumes) == sorted(j.jid for j in on_a)
        assert {e["reason"] for e in resumes} == {"storage node 9501 outage"}
        node = sorted(e["action"] for e in entries if e["kind"] == "node" and e["ok"])
        assert node == ["hold", "release"]
