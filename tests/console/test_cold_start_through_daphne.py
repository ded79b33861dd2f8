"""Every page and every API answer from the read index says what is still loading after a
start (issue 27), through a real daphne serving the console: its read index's fill is held at
its first step (``held_fill_asgi``: a file in ``MRT_VAR_DIR``) as the in-process tests of the
loading state hold it, and let go; afterwards none says so.

Before, only the overview, /stuck/ and a few lists said it: the batch page, the job list, the
job page, holds, consumers and ``/api/batches`` answered from a half-read index in silence.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.conf import settings

from bench.loader import bulk_load
from queues.zkserver import free_port
from tests.live.conftest import DAPHNE, console_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

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


@contextlib.contextmanager
def _daphne(env: dict[str, str], log: Path) -> Iterator[str]:
    """daphne serving the console with its fill held (``held_fill_asgi``), once it answers."""
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*DAPHNE, "-p", str(port), "tests.console.held_fill_asgi:application"],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(POLLS):
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/healthz") as answer:
                if answer.status == 200:
                    break
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
        else:
            pytest.fail(f"daphne did not start:\n{log.read_text()[-3000:]}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _log_in(url: str) -> requests.Session:
    session = requests.Session()
    form = session.get(f"{url}/login/", timeout=30)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
    assert token is not None
    answer = session.post(
        f"{url}/login/",
        data={"username": USER, "password": PASSWORD, "csrfmiddlewaretoken": token.group(1)},
        headers={"Referer": f"{url}/login/"},
        timeout=30,
        allow_redirects=False,
    )
    assert answer.status_code == 302, answer.status_code
    return session


def _api(url: str, key: str) -> dict[str, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return dict(json.load(answer))


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
    manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
    key_file = tmp_path / "key"
    subprocess.run(
        [
            *manage,
            "apitoken",
            "create",
            "--user",
            USER,
            "--name",
            "cold",
            "--key-file",
            str(key_file),
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    key = key_file.read_text().strip()
    gate = tmp_path / "var" / "hold-fill"
    gate.parent.mkdir(parents=True, exist_ok=True)
    gate.touch()
    with _daphne(env, tmp_path / "daphne.log") as url:
        session = _log_in(url)
        for page in PAGES:
            answer = session.get(url + page.format(**names), timeout=60)
            assert answer.status_code == 200, (page, answer.status_code)
            # Said once, by the base template's notice (a page's own note then says only
            # what it means there).
            assert answer.text.count('id="index-loading"') == 1, page
            assert "Still loading after a start" in answer.text, page
        for path in API:
            body = _api(url + path.format(**names), key)
            assert body["loading"], (path, body.get("loading"))
        gate.unlink()  # the fill goes on; the pages say it until it is done
        polls = 0
        while (
            _api(f"{url}/api/failed", key)["loading"]
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
            assert _api(url + path.format(**names), key)["loading"] == "", path
