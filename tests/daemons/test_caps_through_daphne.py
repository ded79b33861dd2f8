"""The campaign incident end to end (issue 24): the console under daphne and two ``runconsumer
all`` processes on a real ZooKeeper. Through the API an operator moves a 100,000-object
campaign's waiting jobs behind everyone else's and caps its jobs in flight at 2; the processes
keep to both, and every job completes."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from queues.core.states import JOB_WORKING
from queues.zk import caps
from queues.zk.nodes import read_many
from tests.live.conftest import api_json, api_token, console_env, daphne, manage_py

from .conftest import DEMO, FileServer, make_job

pytestmark = [pytest.mark.live_server, pytest.mark.django_db(transaction=True)]

OTHER = "merritt_demo_priority"


def _api(url: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return dict(json.load(answer))


def _index_filled(url: str, key: str, timeout: float = 30.0) -> None:
    """Wait until the web process's read index has filled after its start: until then a
    collection's priority change is refused (503, try again), which is not what this test is
    about."""
    deadline = time.monotonic() + timeout
    while True:
        if api_json(f"{url}/api/overview", key).get("loading") == "":
            return
        assert time.monotonic() < deadline, "the read index did not fill"
        time.sleep(0.1)


def _statuses(zk: Any, jids: list[str]) -> dict[str, dict[str, Any]]:
    reads = read_many(zk, [f"/jobs/{j}/status" for j in jids])
    return {j: json.loads(reads[f"/jobs/{j}/status"][0]) for j in jids}


def _states(zk: Any, jids: list[str]) -> dict[str, str]:
    return {j: status["status"] for j, status in _statuses(zk, jids).items()}


def test_a_capped_campaign_behind_the_others_through_daphne_and_two_consumer_processes(
    zk, zk_hosts: str, files: FileServer, tmp_path: Path
) -> None:
    env = console_env(zk_hosts, tmp_path, user="ops", password="pw-" + "x" * 20)
    manage = manage_py()
    key = api_token(env, tmp_path / "key", user="ops", name="t")

    def job(profile: str, name: str, slow: float = 0.0) -> str:
        url = files.put(name, name * 2000)
        if slow:
            files.slow[f"/{name}"] = slow
        config = {"payload_url": url, "type": "file", "filename": name, "profile": profile}
        return make_job(zk, config).jid

    campaign = [job(DEMO, f"campaign-{i}.txt", slow=1.0) for i in range(6)]
    others = [job(OTHER, f"other-{i}.txt") for i in range(3)]
    with daphne(env, tmp_path / "daphne.log") as url:
        _index_filled(url, key)
        moved = _api(f"{url}/api/collections/{DEMO}/priority", key, {"priority": 9})
        assert moved["jobs"] == 6 and moved["summary"].startswith("6 done")
        capped = _api(f"{url}/api/holds/collection/{DEMO}/cap", key, {"limit": 2})
        assert capped["cap"]["limit"] == 2
        assert {f"09-{j}" for j in campaign} <= set(zk.get_children("/jobs/states/pending"))
        consumers = [
            subprocess.Popen(
                [*manage, "runconsumer", "all", "--poll", "0.2"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=(tmp_path / f"consumer-{n}.log").open("wb"),
            )
            for n in range(2)
        ]
        most = 0
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                states = _states(zk, campaign + others)
                most = max(most, sum(1 for j in campaign if states[j] in JOB_WORKING))
                if all(s in ("Completed", "Failed") for s in states.values()):
                    break
                time.sleep(0.02)
        finally:
            for proc in consumers:
                proc.terminate()
            for proc in consumers:
                proc.wait(timeout=60)
    failed = {
        j: status
        for j, status in _statuses(zk, campaign + others).items()
        if status["status"] != "Completed"
    }
    assert not failed, (
        failed,
        [(tmp_path / f"consumer-{n}.log").read_text()[-4000:] for n in range(2)],
    )
    assert most == 2
    caps.verify(zk, DEMO)
    assert caps.cap_of(zk, DEMO).counted == 0
