"""The search's cost follows its windows and its page, not the size of the queue: once the read
index is warm, a search over ten times as many jobs makes no more ZooKeeper requests (and
reads no more nodes) than over one tenth of them, for every field and with a date range."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings

from bench.loader import bulk_load
from queues import search
from queues.zk import client as zkmod
from queues.zk import index as zindex

pytestmark = pytest.mark.django_db

QUERIES: dict[str, dict[str, str]] = {
    "title and every field": {"q": "OBJECT"},
    "submitter": {"q": "USER", "field": "submitter"},
    "job ID prefix": {"q": "JID000000"},
    "error text": {"q": "Simulated FAILURE", "field": "error"},
    "local ID, exact": {"q": "LOCAL-0000007"},
    "a date range": {"q": "object", "since": "2000-01-01", "until": "2999-12-31"},
}
BATCHES = 30  # more than a page of batches at either size


def _counted(zk: Any, action: Callable[[], Any]) -> tuple[Any, Counter[str]]:
    calls: Counter[str] = Counter()
    original = zk._call

    def counting(request: Any, async_object: Any) -> Any:
        name = type(request).__name__
        calls["requests"] += 1
        calls[name] += 1
        calls["paths"] += len(getattr(request, "full_paths", None) or [1])  # a multiRead's
        return original(request, async_object)

    zk._call = counting
    try:
        return action(), calls
    finally:
        zk._call = original


def _measure(zk: Any, jobs: int) -> dict[str, tuple[int, Counter[str]]]:
    bulk_load(zk, batches=BATCHES, jobs=jobs, distribution={"Failed": 0.5, "Completed": 0.5})
    measured = {}
    for name, params in QUERIES.items():
        query = search.parse(params)
        search.run(query)  # warm: the index lists and reads what is new, the texts are kept
        results, calls = _counted(zk, lambda q=query: search.run(q))
        measured[name] = (results.total, calls)
    return measured


@pytest.fixture
def two_queues(zk_server: Any, zk_hosts: str) -> Any:
    """The process's client in a chroot of its own for each size."""

    def switch() -> Any:
        chroot = f"/test-search-{uuid.uuid4().hex[:12]}"
        root = zkmod.connect(zk_server.hosts)
        root.ensure_path(chroot)
        root.stop()
        root.close()
        settings.ZK_HOSTS = f"{zk_server.hosts}{chroot}"
        zkmod.close()
        zindex.reset()
        return zkmod.client()

    yield switch
    zindex.reset()


def test_a_search_over_ten_times_the_jobs_makes_no_more_requests(
    two_queues: Any, monkeypatch: Any
) -> None:
    # Windows smaller than either queue, so both sizes fill them (the claim: bounded by them).
    monkeypatch.setattr(search, "RECENT_JOBS", 60)
    monkeypatch.setattr(search, "RECENT_FAILED", 30)
    monkeypatch.setattr(search, "DATE_CHECKED", 40)
    small = _measure(two_queues(), 150)
    large = _measure(two_queues(), 1500)
    for name in QUERIES:
        (found_small, calls_small), (found_large, calls_large) = small[name], large[name]
        assert found_small > 0 and found_large >= found_small, name
        # No folder listed again, and no more requests or nodes read at ten times the jobs.
        assert calls_large["GetChildren"] + calls_large["GetChildren2"] == 0, (name, calls_large)
        assert calls_large["requests"] <= calls_small["requests"], (name, small, large)
        assert calls_large["paths"] <= calls_small["paths"], (name, small, large)
    # What the windows cut is said on the page.
    notes = search.run(search.parse({"q": "object"})).sections[0].notes
    assert any("60 newest jobs searched" in n for n in notes), notes
