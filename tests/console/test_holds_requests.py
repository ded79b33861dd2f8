"""The holds page and ``/api/holds`` read every hold of a kind in one round trip: storage-node
holds, service holds, maintenance windows and hold records are each listed, then read together
(multiRead), not one request per hold. So ten times the holds cost the same requests; a hold
released between the listing and the read is left out, not a 500."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.urls import reverse
from kazoo.client import KazooClient

from queues.zk import locks
from queues.zk.maintenance import (
    hold_record_set,
    node_hold_path,
    node_hold_set,
    service_hold_set,
    window_set,
)
from tests.zkcount import clock_sample

pytestmark = [pytest.mark.django_db, pytest.mark.zookeeper]


@contextmanager
def counted(zk: KazooClient, before: Callable[[Any], None] | None = None) -> Iterator[Counter[str]]:
    """The requests the client sends meanwhile, by kind; ``before`` sees each request first."""
    calls: Counter[str] = Counter()
    original = zk._call

    def counting(request: Any, async_object: Any) -> Any:
        if clock_sample(zk, request):
            return original(request, async_object)
        if before is not None:
            before(request)
        calls["requests"] += 1
        calls[type(request).__name__] += 1
        return original(request, async_object)

    zk._call = counting
    try:
        yield calls
    finally:
        zk._call = original


def _place(zk: KazooClient, first: int, count: int) -> None:
    """``count`` holds of each kind the console keeps records for, numbered from ``first``."""
    end = datetime.now(UTC) + timedelta(hours=2)
    for n in range(first, first + count):
        node_hold_set(zk, 9000 + n, by="ops", reason=f"node {n} disk swap")
        window_set(zk, "node", str(9000 + n), until=end, reason=f"node {n} window", by="ops")
        service_hold_set(zk, f"depositor example{n}.org:443", by="ops", reason=f"depositor {n}")
        locks.collection_hold_set(zk, f"coll_{n}")
        hold_record_set(zk, "collection", f"coll_{n}", by="ops", reason=f"collection {n}")


def _api(
    client: Any, zk: KazooClient, token: dict[str, str]
) -> tuple[dict[str, Any], Counter[str]]:
    with counted(zk) as calls:
        response = client.get("/api/holds", **token)
    assert response.status_code == 200, response.content
    return response.json(), calls


def test_ten_times_the_holds_cost_the_api_and_the_page_the_same_requests(
    operator, token_for, zk: KazooClient
) -> None:
    token = token_for("viewer")
    _place(zk, 0, 3)
    # Warm: what a first request of each sets up once (the read index's fill).
    operator.get("/api/holds", **token)
    operator.get(reverse("holds"))
    few, few_calls = _api(operator, zk, token)
    with counted(zk) as few_page:
        assert operator.get(reverse("holds")).status_code == 200
    _place(zk, 3, 27)
    many, many_calls = _api(operator, zk, token)
    with counted(zk) as many_page:
        page = operator.get(reverse("holds"))
    assert page.status_code == 200
    assert many_calls["requests"] == few_calls["requests"], (few_calls, many_calls)
    assert many_page["requests"] == few_page["requests"], (few_page, many_page)
    assert "GetData" not in many_calls, many_calls  # every node read is part of a multiRead
    # The answer itself: every hold of every kind, with who placed it and why.
    assert len(few["nodes"]) == 3 and len(many["nodes"]) == 30
    assert many["nodes"]["9029"]["reason"] == "node 29 disk swap"
    assert many["services"]["depositor example29.org:443"]["by"] == "ops"
    assert len(many["windows"]) == 30
    assert {w["reason"] for w in many["windows"]} == {f"node {n} window" for n in range(30)}
    details = {(d["kind"], d["name"]): d for d in many["details"]}
    assert details[("collection", "coll_29")]["reason"] == "collection 29"
    assert details[("node", "9029")]["until"] is not None
    assert "node 29 disk swap" in page.content.decode()


def test_a_hold_released_between_the_listing_and_the_read_is_left_out(
    operator, token_for, zk: KazooClient, other_zk: KazooClient
) -> None:
    _place(zk, 0, 3)
    gone = node_hold_path(9001)
    released: list[str] = []

    def release_before_the_read(request: Any) -> None:
        # The listing has named the hold; another session releases it before it is read.
        named = getattr(request, "full_paths", None) or [getattr(request, "path", "")]
        if not released and any(str(p).endswith(gone) for p in named):
            other_zk.delete(gone)
            released.append(gone)

    with counted(zk, release_before_the_read):
        response = operator.get("/api/holds", **token_for("viewer"))
    assert released == [gone]
    assert response.status_code == 200, response.content
    assert sorted(response.json()["nodes"]) == ["9000", "9002"]
