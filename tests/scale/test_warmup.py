"""A web process fills its read index at start, so the first overview reads nothing more.

The web application starts the fill on the first connection the server hands it (daphne has no
ASGI lifespan), never on import (tests/web/test_settings.py)."""

import asyncio
from collections import Counter

import pytest

from queues.console import jobtext, selectors
from queues.web.warmup import WarmOnFirstConnection, warm_in_background
from queues.zk import batches, jobs
from queues.zk import index as zindex
from tests.zkcount import clock_sample


@pytest.fixture(autouse=True)
def _feeds_stopped():
    """A warm-up starts the text index's writer and feeder threads: stopped after each test,
    they do not go on writing (and logging) once the test database is gone."""
    yield
    jobtext.reset()


def test_after_warming_the_overview_counts_need_no_folder_listing(zk):
    batch = batches.batch_create(zk, submission={"profile": "p", "submitter": "s"})
    for _ in range(3):
        jobs.job_create(zk, bid=batch.bid, configuration={"profile": "p"})
    zindex.reset()
    warm_in_background().join(timeout=60)
    assert_overview_counts_read_nothing(zk)


def test_the_web_application_warms_on_its_first_connection_once(zk):
    batch = batches.batch_create(zk, submission={"profile": "p", "submitter": "s"})
    for _ in range(3):
        jobs.job_create(zk, bid=batch.bid, configuration={"profile": "p"})
    zindex.reset()
    seen: list[str] = []

    async def inner(scope, receive, send):
        seen.append(scope["type"])

    app = WarmOnFirstConnection(inner)
    assert app.warming is None  # built, nothing started
    asyncio.run(app({"type": "http"}, None, None))
    first = app.warming
    assert first is not None
    first.join(timeout=60)
    asyncio.run(app({"type": "websocket"}, None, None))
    assert app.warming is first  # once per process
    assert seen == ["http", "websocket"]  # every connection handed on
    assert_overview_counts_read_nothing(zk)


def assert_overview_counts_read_nothing(zk):
    calls: Counter[str] = Counter()
    original = zk._call

    def counting(request, async_object):
        if clock_sample(zk, request):
            return original(request, async_object)
        calls[type(request).__name__] += 1
        return original(request, async_object)

    zk._call = counting
    try:
        assert selectors.job_state_counts()["Pending"] == 3
    finally:
        zk._call = original
    assert calls["GetChildren"] == 0 and calls["GetChildren2"] == 0


def test_warming_without_zookeeper_only_logs(zk_hosts, settings, caplog):
    from queues.services.zkserver import free_port
    from queues.zk import client as zkmod

    zkmod.close()
    settings.ZK_HOSTS = f"127.0.0.1:{free_port()}"
    settings.ZK_TIMEOUT = 1.0
    try:
        warm_in_background().join(timeout=60)
    finally:
        zkmod.close()
    assert "could not warm the read index" in caplog.text
