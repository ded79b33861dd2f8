"""Every page and every API answer from the read index says what is still loading after a
start (issue 27), through a real daphne serving the console: its read index's fill is held at
its first step (``held_fill_asgi``: a file in ``MRT_VAR_DIR``) as the in-process tests of the
loading state hold it, and let go; afterwards none says so.

Before, only the overview, /stuck/ and a few lists said it: the batch page, the job list, the
job page, holds, consumers and ``/api/batches`` answered from a half-read index in silence.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from bench.loader import bulk_load
from tests.live.conftest import api_json, api_token, console_env, daphne, log_in

pytestmark = [pytest.mark.live_server, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

USER, PASSWORD = "ops", "pw-" + "x" * 20
PAGES = [
    "/",
    "/batches/",
    "/batches/{bid}/",
    "/batches/fixed/",
    "/jobs/?state=Completed",
    "/jobs/?state=Failed&q={local}",
    "/jobs/{jid}/",
    "/failed/",
    "/failed/causes/",
    "/reports/",
    "/holds/",
    "/holds/node-failed/",
    "/collections/",
    "/access/",
    "/consumers/",
    "/history/",
    "/stuck/",
    "/search/?q=object",
    "/alerts/",
    "/audit/",
    "/bulk/",
    "/tokens/",
    "/consistency/",
]
# Every API answer that comes from the read index.
API = [
    "/api/overview",
    "/api/jobs?state=Completed",
    "/api/failed",
    "/api/failed/causes",
    "/api/batches",
    "/api/batches/{bid}",
    "/api/holds",
    "/api/reports",
    "/api/caps",
]
# Requests polling for the fill's end, at most (its end is counted in requests, not timed).
POLLS = 600


@contextmanager
def held_console(
    env: dict[str, str], tmp_path: Path, gate_name: str
) -> Iterator[tuple[str, requests.Session, Path]]:
    """daphne serving the console with its fill held while the file ``gate_name`` exists in
    ``MRT_VAR_DIR`` (``held_fill_asgi``), logged in: (its URL, the session, the gate)."""
    gate = tmp_path / "var" / gate_name
    gate.parent.mkdir(parents=True, exist_ok=True)
    gate.touch()
    with daphne(
        env, tmp_path / "daphne.log", app="tests.console.held_fill_asgi:application"
    ) as url:
        yield url, log_in(url, USER, PASSWORD), gate


def test_every_page_and_index_answer_says_what_is_still_loading_until_the_fill_is_done(
    zk: Any, zk_hosts: str, tmp_path: Path
) -> None:
    loaded = bulk_load(
        zk, batches=10, jobs=100, distribution={"Completed": 0.4, "Failed": 0.3, "Pending": 0.3}
    )
    jid = loaded.jobs_by_state["Failed"][0]
    local = json.loads(zk.get(f"/jobs/{jid}/configuration")[0])["localID"]
    names = {"bid": loaded.batches[0], "jid": jid, "local": local}
    env = console_env(zk_hosts, tmp_path, user=USER, password=PASSWORD)
    key = api_token(env, tmp_path / "key", user=USER, name="cold")
    with held_console(env, tmp_path, "hold-fill") as (url, session, gate):
        for page in PAGES:
            answer = session.get(url + page.format(**names), timeout=60)
            assert answer.status_code == 200, (page, answer.status_code)
            # Said once, by the base template's notice (a page's own note then says only
            # what it means there).
            assert answer.text.count('id="index-loading"') == 1, page
            assert "Still loading after a start" in answer.text, page
        for path in API:
            body = api_json(url + path.format(**names), key)
            assert body["loading"], (path, body.get("loading"))
        gate.unlink()  # the fill goes on; the pages say it until it is done
        polls = 0
        while (
            api_json(f"{url}/api/failed", key)["loading"]
            or 'id="index-loading"' in session.get(f"{url}/stuck/", timeout=60).text
        ):
            polls += 1
            assert polls < POLLS, "the fill did not end"
            time.sleep(0.1)
        for page in PAGES:
            answer = session.get(url + page.format(**names), timeout=60)
            assert answer.status_code == 200, (page, answer.status_code)
            assert 'id="index-loading"' not in answer.text, page
        for path in API:
            assert api_json(url + path.format(**names), key)["loading"] == "", path


def test_a_page_that_needs_what_the_fill_is_reading_answers_at_once_that_it_is_loading(
    zk: Any, zk_hosts: str, tmp_path: Path
) -> None:
    """Issue 51: right after a start at a million jobs the fill reads a folder of 600,000 jobs
    for seconds, and a page that needs it waited as long. It now waits at most
    ``MRT_LOADING_WAIT``, then answers 503 naming what is loading, with a page that asks again
    by itself; an API read answers the same in JSON. A page that does not need it answers."""
    loaded = bulk_load(zk, batches=2, jobs=20, distribution={"Completed": 0.5, "Pending": 0.5})
    env = {
        **console_env(zk_hosts, tmp_path, user=USER, password=PASSWORD),
        "MRT_LOADING_WAIT": "0.2",
    }
    key = api_token(env, tmp_path / "key", user=USER, name="cold")
    with held_console(env, tmp_path, "hold-listing") as (url, session, gate):
        page = session.get(f"{url}/jobs/?state=Pending", timeout=60)
        assert page.status_code == 503
        assert page.headers["Retry-After"] == "2"
        assert page.text.count('id="index-loading"') == 1  # its own notice, not the base's too
        assert "reading the queue from ZooKeeper after it started (job counts" in page.text
        assert '<meta http-equiv="refresh" content="2">' in page.text
        answer = requests.get(
            f"{url}/api/jobs?state=Pending",
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "2"
        assert answer.json()["loading"].startswith("job counts")
        # Pages that need nothing the fill holds answer meanwhile.
        assert session.get(f"{url}/audit/", timeout=60).status_code == 200
        assert session.get(f"{url}/health/zk/", timeout=60).status_code == 200
        gate.unlink()
        polls = 0
        while (page := session.get(f"{url}/jobs/?state=Pending", timeout=60)).status_code == 503:
            polls += 1
            assert polls < POLLS, "the fill did not read the folder"
            time.sleep(0.1)
        assert page.status_code == 200
        assert loaded.jobs_by_state["Pending"][0] in page.text
    # A console just started is not failing: no ERROR line for each of those 503s.
    assert "Service Unavailable" not in (tmp_path / "daphne.log").read_text()
