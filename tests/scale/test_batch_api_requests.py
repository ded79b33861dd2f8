"""/api/batches/BID and the batch page cost what they show (issue 27): a batch of ten times the
jobs is answered with the same ZooKeeper requests, its counts are of every job (from the read
index), and its job IDs come a page at a time, by cursor or page number, each job once."""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from kazoo.client import KazooClient

from bench.loader import bulk_load
from queues.core.states import BATCH_INDEX_FOLDERS, JobState
from queues.operator.audit import ApiToken
from queues.web.api import BATCH_JOBS_PER_PAGE
from queues.zk import index as zindex
from queues.zk import jobs, paths

from .test_batch_pages import requests_during

pytestmark = pytest.mark.django_db

# At least a page of rows (25) in each state of the mix, so that both batches show as many rows.
SMALL = 250
# A batch still in process (no status report, whose parts would be read), of several states.
MIX = {
    JobState.COMPLETED: 0.3,
    JobState.FAILED: 0.2,
    JobState.ESTIMATING: 0.1,
    JobState.PENDING: 0.4,
}


@pytest.fixture
def headers(db: Any) -> dict[str, str]:
    call_command("setupconsole", stdout=io.StringIO())
    user = User.objects.create_user("batch-api-pages", password="pw-123456789")
    user.groups.add(Group.objects.get(name="viewer"))
    _token, key = ApiToken.issue(user=user, name="batch-api-pages")
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


@pytest.fixture
def viewer(db: Any, headers: dict[str, str]) -> Client:
    user = User.objects.get(username="batch-api-pages")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def two_batches(zk: KazooClient) -> tuple[str, str]:
    """A batch of SMALL jobs and one of 10 * SMALL, of the same mix of states."""
    zindex.reset()
    small = bulk_load(zk, batches=1, jobs=SMALL, distribution=MIX, seed=11).batches[0]
    large = bulk_load(zk, batches=1, jobs=10 * SMALL, distribution=MIX, seed=12).batches[0]
    yield small, large
    zindex.reset()


def true_states(zk: KazooClient, bid: str) -> dict[str, list[str]]:
    """Each job of the batch by the state its status node says, read one by one."""
    found: dict[str, list[str]] = {}
    jids = sorted(
        {j for f in BATCH_INDEX_FOLDERS for j in zk.get_children(paths.batch_index(bid, f))}
    )
    for jid in jids:
        found.setdefault(jobs.job_load(zk, jid).state, []).append(jid)
    return found


def api(client: Client, headers: dict[str, str], bid: str, **params: Any) -> Any:
    answer = client.get(f"/api/batches/{bid}", params, **headers)
    assert answer.status_code == 200, answer.content
    return answer.json()


def test_the_batch_api_costs_the_same_requests_for_ten_times_the_jobs(
    zk: KazooClient, headers: dict[str, str], two_batches: tuple[str, str]
) -> None:
    client = Client()
    cold: dict[str, Counter[str]] = {}
    warm: dict[str, Counter[str]] = {}
    answers = {}
    for bid in two_batches:
        zindex.reset()  # each batch from a fresh index: what a first look costs
        answers[bid], cold[bid] = requests_during(zk, lambda b=bid: api(client, headers, b))
        _again, warm[bid] = requests_during(zk, lambda b=bid: api(client, headers, b))
    small, large = two_batches
    # The same requests, kind by kind, whether the batch has 250 jobs or 2,500.
    assert sum(cold[small].values()) > 0
    assert Counter({k: v for k, v in cold[small].items() if not k.startswith("listed ")}) == (
        Counter({k: v for k, v in cold[large].items() if not k.startswith("listed ")})
    )
    assert warm[small] == warm[large]
    # Warm, nothing is listed again: the batch's folders and the state folders are watched.
    assert warm[large]["GetChildren"] == 0, warm[large]
    # Cold, its own index folders and the state folders, never another batch's.
    listed = {k.removeprefix("listed ") for k in cold[large] if k.startswith("listed ")}
    assert {p for p in listed if p.startswith(paths.BATCHES)} == {
        paths.batch_index(large, f) for f in BATCH_INDEX_FOLDERS
    }

    # The counts are of every job, as their status nodes say.
    for bid in two_batches:
        truth = true_states(zk, bid)
        answer = answers[bid]
        assert answer["job_states"] == {s: len(v) for s, v in truth.items()}
        assert answer["total_jobs"] == sum(len(v) for v in truth.values())
        assert sum(answer["folders"].values()) == answer["total_jobs"]
        # The first page of the default size, by job ID; a batch that fits in one is answered
        # as before (every job ID by state, no next page).
        every = sorted(j for v in truth.values() for j in v)
        page = every[:BATCH_JOBS_PER_PAGE]
        shown = set(page)
        assert answer["jobs"] == {
            s: [j for j in v if j in shown] for s, v in truth.items() if shown & set(v)
        }
        assert answer["has_next"] == (len(every) > BATCH_JOBS_PER_PAGE)
        assert answer["next"] == (page[-1] if answer["has_next"] else None)


def test_the_batch_api_pages_its_jobs_by_cursor_and_by_number(
    zk: KazooClient, headers: dict[str, str], two_batches: tuple[str, str]
) -> None:
    client = Client()
    _small, large = two_batches
    truth = true_states(zk, large)
    every = sorted(j for v in truth.values() for j in v)

    seen: list[str] = []
    after = ""
    pages = 0
    while True:
        answer = api(client, headers, large, limit=300, **({"after": after} if after else {}))
        page = sorted(j for v in answer["jobs"].values() for j in v)
        assert len(page) <= 300
        seen += page
        pages += 1
        if answer["next"] is None:
            break
        assert answer["next"] == page[-1]
        after = answer["next"]
    assert seen == every and pages == -(-len(every) // 300)

    # Page numbers give the same pages.
    second = api(client, headers, large, limit=300, page=2)
    assert sorted(j for v in second["jobs"].values() for j in v) == every[300:600]
    assert second["page"] == 2 and second["has_next"]

    # One state's jobs, paged.
    failed = truth[JobState.FAILED]
    first = api(client, headers, large, state="Failed", limit=50)
    assert first["jobs"] == {"Failed": failed[:50]}
    assert first["job_states"]["Failed"] == len(failed)
    rest = api(client, headers, large, state="Failed", limit=50, after=first["next"])
    assert rest["jobs"] == {"Failed": failed[50:100]}

    # Nonsense is a 400 with the reason.
    for bad in ({"limit": "0"}, {"after": "x"}, {"state": "Nope"}, {"after": every[0], "page": 2}):
        answer = client.get(f"/api/batches/{large}", bad, **headers)
        assert answer.status_code == 400, (bad, answer.content)
        assert answer.json()["error"]


def test_the_batch_page_costs_the_same_requests_for_ten_times_the_jobs(
    zk: KazooClient, viewer: Client, two_batches: tuple[str, str]
) -> None:
    from queues.views.batches import BATCH_ROWS_PER_STATE

    found = {}
    for bid in two_batches:
        url = reverse("batch", args=[bid])
        viewer.get(url)
        answer, found[bid] = requests_during(zk, lambda u=url: viewer.get(u))
        assert answer.status_code == 200
        html = answer.content.decode()
        truth = true_states(zk, bid)
        # Every state's count is of all its jobs; its rows at most a page.
        for state, jids in truth.items():
            assert f'id="batch-jobs-{state}"' in html
            rows = html.split(f'id="batch-jobs-{state}"')[1].split("</details>")[0]
            assert rows.count('<tr id="job-row-') == min(len(jids), BATCH_ROWS_PER_STATE)
    small, large = two_batches
    assert found[small] == found[large], (found[small], found[large])
    assert found[large]["GetChildren"] == 0
