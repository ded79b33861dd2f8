"""The failed-by-cause page and API cost what they show: warm, the same ZooKeeper requests and
the same lines of project code for ten times the Failed jobs (the groups are computed once per
change of the Failed folder, not per request). Helpers and queues from test_flat_failed_stuck."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from tests.scale import test_flat_failed_stuck as flat
from tests.scale.test_flat_failed_stuck import N, _flat, _page, _work

# The same queues (N, then 10N jobs, half Failed) and users as the failed and stuck pages'.
grown = flat.grown
viewer = flat.viewer
token_headers = flat.token_headers

pytestmark = pytest.mark.django_db


def test_the_causes_page_reads_and_works_the_same_for_ten_times_the_failed_jobs(
    zk: Any, grown: Any, viewer: Client
) -> None:
    url = reverse("failed-causes")

    def measure() -> tuple[Counter[str], int]:
        _page(viewer, url)  # what a change of the Failed folder costs, once
        response, calls, lines = _work(zk, lambda: _page(viewer, url))
        html = response.content.decode()
        assert html.count('class="card failed-cause"') >= 2
        return calls, lines

    _flat(measure, grown)
    html = _page(viewer, url).content.decode()
    assert f'data-total="{10 * N // 2}"' in html


def test_the_causes_api_reads_and_works_the_same_for_ten_times_the_failed_jobs(
    zk: Any, grown: Any, token_headers: dict[str, str]
) -> None:
    client = Client()

    def measure() -> tuple[Counter[str], int]:
        _page(client, "/api/failed/causes", token_headers)
        response, calls, lines = _work(
            zk, lambda: _page(client, "/api/failed/causes", token_headers)
        )
        body = response.json()
        assert sum(g["count"] for g in body["items"]) == body["jobs"]
        return calls, lines

    _flat(measure, grown)
