"""The search's cost follows its page, not the size of the queue: once the read index is warm
(and the texts it read are in the database's text index), a search over ten times as many
jobs makes no more ZooKeeper requests (and reads no more nodes) than over one tenth of them,
for every field and with a date range."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from bench.loader import bulk_load
from queues.console import jobtext, search
from queues.zk import client as zkmod
from queues.zk import index as zindex
from tests.zkcount import clock_sample
from tests.zktree import chroot_on, shared_client_on

# The feed's writer is a thread of its own: it writes on its own connection.
pytestmark = pytest.mark.django_db(transaction=True)

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
        if clock_sample(zk, request):
            return original(request, async_object)
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
    idx = zindex.for_client(zk)
    feed = jobtext.feed_for(idx, start=True)
    idx.sync()  # what the web process's fill does at its start
    assert feed.flush(timeout=120)
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

    with contextlib.ExitStack() as switched:

        def switch() -> Any:
            # Both undone at the end, last first: the chroot taken away, the client back.
            chroot = switched.enter_context(chroot_on(zk_server))
            switched.enter_context(shared_client_on(f"{zk_server.hosts}{chroot}"))
            zindex.reset()
            jobtext.reset()
            return zkmod.client()

        yield switch
        jobtext.reset()
        zindex.reset()


def test_a_search_over_ten_times_the_jobs_makes_no_more_requests(
    two_queues: Any, monkeypatch: Any
) -> None:
    # Bounds smaller than either queue, so both sizes reach them (the claim: bounded by them).
    monkeypatch.setattr(search, "COUNT_CAP", 60)
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
    # What the bound cuts is said on the page.
    notes = search.run(search.parse({"q": "object", "field": "title"})).sections[0].notes
    assert any("more than 60 jobs hold this text" in n for n in notes), notes
