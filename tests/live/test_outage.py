"""A ZooKeeper outage: the page is told at once, and catches up by itself when it returns."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from channels.layers import channel_layers
from django.conf import settings

from queues.live.hub import reset_hub
from queues.services.zkserver import LocalZooKeeper, free_port
from queues.zk import batches, jobs
from queues.zk import client as zkmod

from .conftest import CONFIGURATION, open_socket, receive_until, run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[LocalZooKeeper]:
    """A ZooKeeper of this test's own, which it may stop and start again."""
    server = LocalZooKeeper(tmp_path / "zookeeper", free_port())
    server.start()
    old = settings.ZK_HOSTS
    settings.ZK_HOSTS = server.hosts
    zkmod.close()
    reset_hub()
    channel_layers.backends.clear()
    yield server
    reset_hub()
    zkmod.close()
    settings.ZK_HOSTS = old
    server.stop()


def test_outage_is_announced_and_the_page_catches_up_after_it(
    own_server: LocalZooKeeper, session_cookie: str
) -> None:
    writer = zkmod.connect(own_server.hosts)
    batch = batches.batch_create(writer, submission={"profile": "ucb_lib_test"})
    job = jobs.job_create(writer, bid=batch.bid, configuration=CONFIGURATION)
    writer.stop()
    writer.close()
    topics = ["jobs:state:Estimating", f"job:{job.jid}"]

    async def scenario() -> tuple[list[dict], list[dict], list[dict]]:
        page = await open_socket(session_cookie, topics)
        await asyncio.to_thread(own_server.stop)
        down = await receive_until(page, lambda m: m["kind"] == "zk-down", timeout=30)
        await asyncio.to_thread(own_server.start)
        caught_up: set[str] = set()

        def all_caught_up(message: dict) -> bool:
            if message.get("reconnected"):
                caught_up.add(message["topic"])
            return caught_up >= set(topics)

        back = await receive_until(page, all_caught_up, timeout=60)
        mover = await asyncio.to_thread(zkmod.connect, own_server.hosts)
        try:
            await asyncio.to_thread(jobs.job_transition, mover, job, "Estimating")
        finally:
            mover.stop()
            mover.close()
        moved = await receive_until(
            page,
            lambda m: m.get("topic") == "jobs:state:Estimating" and not m.get("reconnected"),
            timeout=30,
        )
        await page.disconnect()
        return down, back, moved

    down, back, moved = run(scenario(), timeout=150)
    assert down[-1] == {"topic": "zk", "kind": "zk-down"}
    kinds = [m["kind"] for m in back]
    assert "zk-up" in kinds
    assert {m["topic"] for m in back if m.get("reconnected")} >= set(topics)
    assert moved[-1]["kind"] == "changed"
