"""Two daphne workers behind one address, sharing channels-redis: each page hears a change once.

Every worker watches ZooKeeper itself and its hub's groups carry the hub's identity, so a
socket gets its own worker's message and not one more per other worker through Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from kazoo.client import KazooClient

from queues.services.zkserver import free_port
from queues.zk import jobs
from queues.zk.records import Batch, Job

from .conftest import console_env, daphne, run

pytestmark = [pytest.mark.live_server, pytest.mark.slow]

USER, PASSWORD = "ada", "a-long-test-password-1"
TOPIC = "jobs:state:Failed"


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    server = shutil.which("redis-server")
    if server is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed: bin/run-tests installs it")
        pytest.skip("redis-server is not installed (bin/run-tests installs it)")
    port = free_port()
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while (
            subprocess.run(
                ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True
            ).stdout.strip()
            != "PONG"
        ):
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail("redis-server did not start")
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


def login(url: str) -> str:
    session = requests.Session()
    session.get(f"{url}/login/", timeout=10)
    answer = session.post(
        f"{url}/login/",
        data={"username": USER, "password": PASSWORD},
        headers={"X-CSRFToken": session.cookies["csrftoken"], "Referer": f"{url}/login/"},
        timeout=10,
    )
    answer.raise_for_status()
    return session.cookies["sessionid"]


@contextlib.asynccontextmanager
async def subscribed(url: str, cookie: str) -> AsyncIterator[Any]:
    """A live-console socket on ``url``, logged in and subscribed to TOPIC."""
    import websockets

    async with websockets.connect(
        url.replace("http://", "ws://") + "/ws/live/",
        additional_headers={"Cookie": f"sessionid={cookie}", "Origin": url},
    ) as ws:
        assert json.loads(await ws.recv())["kind"] == "hello"
        await ws.send(json.dumps({"subscribe": [TOPIC]}))
        assert json.loads(await ws.recv())["kind"] == "subscribed"
        yield ws


async def page_messages(url: str, cookie: str, moved: asyncio.Event) -> list[dict]:
    """Subscribe on one worker; after the move, collect until the window has long closed."""
    async with subscribed(url, cookie) as ws:
        moved.set()
        seen: list[dict] = []
        message = json.loads(await asyncio.wait_for(ws.recv(), 20))
        seen.append(message)
        # A duplicate through Redis would arrive about as fast as the first message; wait
        # well past the coalescing window for any.
        with contextlib.suppress(TimeoutError):
            while True:
                seen.append(json.loads(await asyncio.wait_for(ws.recv(), 1.5)))
        return seen


def test_each_worker_tells_its_own_pages_once(
    zk_hosts: str,
    tmp_path: Path,
    redis_url: str,
    other_zk: KazooClient,
    make_batch: Callable[[], Batch],
    make_job: Callable[[Batch], Job],
) -> None:
    job = make_job(make_batch())
    other_zk.ensure_path("/jobs/states/failed")  # one move = one change of that folder
    env = console_env(zk_hosts, tmp_path, user=USER, password=PASSWORD, REDIS_URL=redis_url)
    with daphne(env, tmp_path / "a.log") as worker_a, daphne(env, tmp_path / "b.log") as worker_b:
        cookie = login(worker_a)

        async def scenario() -> tuple[list[dict], list[dict]]:
            ready_a, ready_b = asyncio.Event(), asyncio.Event()
            a = asyncio.create_task(page_messages(worker_a, cookie, ready_a))
            b = asyncio.create_task(page_messages(worker_b, cookie, ready_b))
            await ready_a.wait()
            await ready_b.wait()
            await asyncio.to_thread(jobs.job_transition, other_zk, job, "Failed", admin=True)
            return await a, await b

        on_a, on_b = run(scenario())
    for seen in (on_a, on_b):
        assert [(m["topic"], m["kind"], m["events"]) for m in seen] == [(TOPIC, "changed", 1)]


def test_an_idle_page_stays_subscribed_through_redis(
    zk_hosts: str,
    tmp_path: Path,
    redis_url: str,
    other_zk: KazooClient,
    make_batch: Callable[[], Batch],
    make_job: Callable[[Batch], Job],
) -> None:
    """A console page open with nothing happening: the layer's wait for a message must outlast
    the Redis client's read timeout (5 s by default in redis-py 8), or the socket is closed."""
    job = make_job(make_batch())
    other_zk.ensure_path("/jobs/states/failed")
    env = console_env(zk_hosts, tmp_path, user=USER, password=PASSWORD, REDIS_URL=redis_url)
    with daphne(env, tmp_path / "a.log") as worker:
        cookie = login(worker)

        async def scenario() -> dict:
            async with subscribed(worker, cookie) as ws:
                await asyncio.sleep(8)  # idle, longer than the read timeout
                await asyncio.to_thread(jobs.job_transition, other_zk, job, "Failed", admin=True)
                return json.loads(await asyncio.wait_for(ws.recv(), 20))

        message = run(scenario())
    assert (message["topic"], message["kind"]) == (TOPIC, "changed")
