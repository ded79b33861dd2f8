"""/reports/ and /api/reports cost a page: the ZooKeeper requests they make are the same
whatever the size of the batches on the page and however many batches have a report
(counted, not timed: issue 27)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.urls import reverse

from bench.loader import bulk_load
from queues.operator.audit import ApiToken
from queues.zk import batches
from queues.zk import index as zindex
from queues.zk.client import client as shared_client
from tests.zkcount import clock_sample


@pytest.fixture
def fresh_index(zk_own_1mib: Any) -> Any:
    zindex.reset()
    yield zk_own_1mib
    zindex.reset()


def requests_during(action: Callable[[], Any]) -> Counter[str]:
    """Every request the process's ZooKeeper client sends during ``action``, by type, and
    ``paths``: how many nodes they name (a multi-read names many: ``full_paths``)."""
    zk = shared_client()
    calls: Counter[str] = Counter()
    original = zk._call

    def counting(request: Any, async_object: Any) -> Any:
        if clock_sample(zk, request):
            return original(request, async_object)
        calls[type(request).__name__] += 1
        named = getattr(request, "full_paths", None) or getattr(request, "paths", None)
        calls["paths"] += len(named or [1])
        return original(request, async_object)

    zk._call = counting
    try:
        action()
    finally:
        zk._call = original
    return calls


def warm_counts(get: Callable[[], Any]) -> Counter[str]:
    """The requests of a warm view: asked once first (the read index fills), then counted."""
    assert get().status_code == 200
    return requests_during(lambda: get().status_code == 200 or pytest.fail("view failed"))


@pytest.fixture
def token_headers(make_user: Callable[..., Any]) -> dict[str, str]:
    _token, key = ApiToken.issue(user=make_user("viewer", "api-viewer"), name="test")
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def test_the_reports_views_cost_a_page_whatever_the_size_of_its_batches(
    fresh_index: Any, viewer: Any, token_headers: dict[str, str], client: Any
) -> None:
    zk = fresh_index
    # 60 batches of 50 jobs, the newer half all failed: every batch a page shows has more
    # failed jobs than the page reads the messages of.
    bulk_load(zk, batches=60, jobs=60 * 50, distribution={"Completed": 0.5, "Failed": 0.5})
    page_small = warm_counts(lambda: viewer.get(reverse("reports")))
    api_small = warm_counts(lambda: client.get("/api/reports", **token_headers))

    # 60 more batches, each 8 times as large: the pages now show these.
    bulk_load(zk, batches=60, jobs=60 * 400, distribution={"Completed": 0.5, "Failed": 0.5}, seed=2)
    assert warm_counts(lambda: viewer.get(reverse("reports"))) == page_small
    assert warm_counts(lambda: client.get("/api/reports", **token_headers)) == api_small

    html = viewer.get(reverse("reports")).content.decode()
    assert "120 batches with a report" in html
    newest = zindex.for_client(zk).reported_batch_ids()[0]
    assert batches.report_counts(batches.batch_load(zk, newest).report) == (400, 0)
    assert f"(not read: {400 - 20} more)" in html
