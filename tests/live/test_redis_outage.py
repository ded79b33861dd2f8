"""A Redis outage under an open console page: the page backs off, does not reload, and catches up.

The console runs under daphne with channels-redis on a real redis-server that the test stops
and starts again on the same port while a Chromium tab shows a batch page. Measured on the code
before this test: the tab reconnected about once a second (every socket opened, so the back-off
started again from one second), refreshed its live part at every open, and the worker logged a
traceback for every attempt.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from queues.services.zkserver import free_port
from queues.zk import jobs
from queues.zk.records import Batch, Job
from tests.browser import log_in

from .conftest import console_env, daphne

pytestmark = [pytest.mark.live_server, pytest.mark.browser, pytest.mark.slow]

USER, PASSWORD = "ada", "a-long-test-password-1"
WAIT_MS = 20_000
OUTAGE_MS = 20_000
# live.js waits 0.5-1 s, 1-2 s, 2-4 s, 4-8 s, 8-16 s ... between attempts (the lower bound is
# half the doubling delay): at most 5 attempts fit in 20 s. A reset back-off makes about 20.
MOST_ATTEMPTS_IN_OUTAGE = 7
LAYER_DOWN = re.compile(r"channel layer .*unreachable")
LAYER_BACK = re.compile(r"channel layer .*reachable again")


class Redis:
    """A redis-server on a fixed loopback port that the test can stop and start again."""

    def __init__(self, folder: Path) -> None:
        server = shutil.which("redis-server")
        if server is None:
            if os.environ.get("CI"):
                pytest.fail("redis-server is not installed: bin/run-tests installs it")
            pytest.skip("redis-server is not installed (bin/run-tests installs it)")
        self.server = server
        self.folder = folder
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        options = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(
            [self.server, "--port", str(self.port), *options],
            cwd=self.folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while not self.answers():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                pytest.fail("redis-server did not start")
            time.sleep(0.1)

    def answers(self) -> bool:
        ping = ["redis-cli", "-p", str(self.port), "ping"]
        return subprocess.run(ping, capture_output=True, text=True).stdout.strip() == "PONG"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[Redis]:
    server = Redis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Watched:
    """What one tab does: websocket attempts, live refreshes (htmx requests), page loads."""

    def __init__(self, page: Any, refresh_path: str) -> None:
        self.sockets = 0
        self.refreshes = 0
        self.loads = 0
        page.on("websocket", lambda _ws: self._socket())
        page.on("request", lambda request: self._request(request, refresh_path))
        page.on("load", lambda _page: self._load())

    def _socket(self) -> None:
        self.sockets += 1

    def _request(self, request: Any, path: str) -> None:
        if request.headers.get("hx-request") and request.url.split("?")[0].endswith(path):
            self.refreshes += 1

    def _load(self) -> None:
        self.loads += 1

    def counts(self) -> tuple[int, int, int]:
        return self.sockets, self.refreshes, self.loads


def test_a_redis_outage_backs_off_without_reloads_and_the_page_catches_up(
    zk_hosts: str,
    tmp_path: Path,
    redis: Redis,
    browser: Any,
    other_zk: KazooClient,
    make_batch: Callable[[], Batch],
    make_job: Callable[[Batch], Job],
) -> None:
    batch = make_batch()
    job = make_job(batch)
    env = console_env(
        zk_hosts, tmp_path, user=USER, password=PASSWORD, REDIS_URL=redis.url, LOG_LEVEL="INFO"
    )
    log = tmp_path / "daphne.log"
    with daphne(env, log) as url:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.set_default_timeout(WAIT_MS)
        try:
            page = context.new_page()
            log_in(page, url, USER, PASSWORD)
            batch_path = f"/batches/{batch.bid}/"
            page.goto(f"{url}{batch_path}")
            page.wait_for_function("() => window.mrtLive && window.mrtLive.following()")
            page.evaluate("window.__notReloaded = true")
            watched = Watched(page, batch_path)
            logged_before = log.read_text()

            redis.stop()
            # A change the page cannot hear of while Redis is away.
            jobs.job_transition(other_zk, job, "Estimating")
            page.wait_for_timeout(OUTAGE_MS)
            sockets, refreshes, loads = watched.counts()
            state_in_outage = page.evaluate("window.mrtLive.state()")
            row_in_outage = page.get_attribute(f"#job-row-{job.jid}", "data-state")

            redis.start()
            page.wait_for_selector(
                f"#job-row-{job.jid}[data-state=Estimating]", state="attached", timeout=90_000
            )
            page.wait_for_function("() => window.mrtLive.state() === 'live'")
            _, refreshes_after, loads_after = watched.counts()
            not_reloaded = page.evaluate("window.__notReloaded === true")
        finally:
            context.close()
    logged = log.read_text()[len(logged_before) :]

    assert 1 <= sockets <= MOST_ATTEMPTS_IN_OUTAGE, f"{sockets} websocket attempts in the outage"
    assert refreshes == 0, f"{refreshes} live refreshes while no socket could be live"
    assert loads == 0 and loads_after == 0 and not_reloaded
    assert state_in_outage == "reconnecting"
    assert row_in_outage == "Pending"
    # Caught up by one fetch of the live part once the socket was live again.
    assert refreshes_after == 1
    assert "Traceback" not in logged, logged
    assert len(LAYER_DOWN.findall(logged)) == 1, logged
    assert len(LAYER_BACK.findall(logged)) == 1, logged
