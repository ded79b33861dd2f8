"""The search page costs what it shows: a search over ten times the jobs and batches sends the
same ZooKeeper requests and runs as many lines of the project's code (counted, not timed).

The searches an operator makes most (a local ID, an ARK, a job or batch ID, a word of one
job's title) in every field: each used to case-fold the title, file name and local ID of the
5,000 newest live jobs and every live batch's fields per request, and to filter every state's
entries by submitter for each new text, so its work grew with the queue up to those windows
(and past them, for the filter). Jobs' texts are now searched in the database's text index
(``queues/console/jobtext.py``), written here before the measures as the web process's fill and
feed write them; a text that matches many jobs is counted with the count's bound smaller than
either queue, so both sizes reach it.

Work is counted as in ``test_flat_failed_stuck``: the lines of project code the request's
thread runs (``sys.settrace``), which a pass per job or per batch shows whatever the machine.
"""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client

from bench.loader import bulk_load
from queues.console import jobtext, search
from queues.zk import index as zindex
from queues.zk.codecs import decode_json
from tests.scale.test_flat_failed_stuck import _work

# The feed's writer is a thread of its own: it writes on its own connection.
pytestmark = pytest.mark.django_db(transaction=True)

N = 300
JOBS_PER_BATCH = 5
QUEUE = {"Completed": 0.5, "Failed": 0.25, "Pending": 0.25}
SLACK = 1.15  # a bisection a level deeper, a dictionary lookup that probes once more
BROAD_WINDOW = 200  # COUNT_CAP for the text that matches every job: below either size


@pytest.fixture
def viewer(db: Any) -> Client:
    call_command("setupconsole", stdout=io.StringIO())
    user = User.objects.create_user("search-flat", password="pw-123456789")
    user.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(user)
    return client


def _keys(zk: Any, jid: str) -> tuple[str, str, str]:
    """A job's local ID, ARK and title, as the loader wrote them."""
    config = decode_json("c", zk.get(f"/jobs/{jid}/configuration")[0])
    ids = decode_json("i", zk.get(f"/jobs/{jid}/identifiers")[0])
    return config["localID"], ids["primary_id"], config["title"]


def test_a_search_over_ten_times_the_jobs_sends_the_same_requests_and_runs_the_same_lines(
    zk: Any, viewer: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    zindex.reset()
    jobtext.reset()
    first = bulk_load(zk, batches=N // JOBS_PER_BATCH, jobs=N, distribution=QUEUE, seed=1)
    idx = zindex.for_client(zk)
    feed = jobtext.feed_for(idx, start=True)
    idx.settle()
    idx.sync()
    assert feed.flush(timeout=120)
    jid = first.jobs_by_state["Completed"][0]
    bid = first.batches[0]
    local, ark, title = _keys(zk, jid)
    # What is searched for, and the item its single exact match opens ("" when none does).
    searches: dict[str, tuple[str, str]] = {
        "local ID": (local.upper(), jid),
        "ARK": (ark, jid),
        "job ID": (jid, jid),
        "batch ID": (bid, bid),
        "a word of one title": (title.lower(), ""),
        "a text no job holds": ("no-such-text-anywhere", ""),
    }

    def measure() -> dict[str, tuple[Counter[str], int]]:
        found = {}
        for name, (text, opens) in searches.items():
            viewer.get("/search/", {"q": text})  # warm: what is new since is read once
            response, calls, lines = _work(zk, lambda t=text: viewer.get("/search/", {"q": t}))
            if opens:
                assert response.status_code == 302, name
                assert response["Location"].rstrip("/").endswith(opens), name
            else:
                assert response.status_code == 200, name
                total = 1 if name == "a word of one title" else 0
                assert f'id="search-jobs" data-total="{total}"' in response.content.decode()
            found[name] = (calls, lines)
        # Every job's title holds "object": the window shown full at both sizes.
        with monkeypatch.context() as patch:
            patch.setattr(search, "COUNT_CAP", BROAD_WINDOW)
            viewer.get("/search/", {"q": "object"})
            response, calls, lines = _work(zk, lambda: viewer.get("/search/", {"q": "object"}))
            html = response.content.decode()
            assert f'id="search-jobs" data-total="{BROAD_WINDOW}"' in html
            assert html.count('class="search-row"') == search.PER_PAGE
            found["a text every job holds"] = (calls, lines)
        return found

    small = measure()
    second = bulk_load(zk, batches=9 * N // JOBS_PER_BATCH, jobs=9 * N, distribution=QUEUE, seed=2)
    idx.settle()
    idx.sync()
    assert feed.flush(timeout=120)
    large = measure()
    for name in small:
        (small_calls, small_lines), (large_calls, large_lines) = small[name], large[name]
        print(f"{name}: {small_lines} lines at {N} jobs, {large_lines} at {10 * N}; {small_calls}")
        assert large_calls == small_calls, (name, small_calls, large_calls)
        assert large_lines <= small_lines * SLACK, (name, small_lines, large_lines)
    # The larger queue is the one searched: a job of the second load opens by its local ID.
    newer = second.jobs_by_state["Completed"][-1]
    response = viewer.get("/search/", {"q": _keys(zk, newer)[0]})
    assert response.status_code == 302 and newer in response["Location"]
    jobtext.reset()
    zindex.reset()
