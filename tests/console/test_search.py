"""The header search (issue 25): every field in any case, a long ID by its start, a date range
that narrows, each kind paged on its own, a single exact match opening the item, what is shown
escaped, and input it refuses answered plainly."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import date, timedelta
from typing import Any

import pytest
from django.test import Client
from kazoo.client import KazooClient

from queues.console import search
from queues.models import StepRecord
from queues.zk import batches, jobs
from queues.zk.records import Batch, Job
from tests.scale.test_read_index import eventually

from .conftest import PROFILE

pytestmark = pytest.mark.django_db

ROW = re.compile(r'id="search-row-((?:jid|bid)[0-9]{10})"')


def _section(html: str, key: str) -> str:
    start = html.index(f'id="search-{key}"')
    end = html.find("</section>", start)
    return html[start:end]


def _rows(html: str, key: str) -> list[str]:
    return ROW.findall(_section(html, key))


@pytest.fixture
def deposit(zk: KazooClient) -> Callable[..., tuple[Batch, Job]]:
    """A batch with one job, its texts as a depositor gave them."""

    def make(
        *,
        title: str = "Letters of Ada",
        filename: str = "letters.pdf",
        submitter: str = "dpr/Ada Lovelace",
        local_id: str = "",
        ark: str = "",
        batch_id: str = "",
        failed: str = "",
    ) -> tuple[Batch, Job]:
        submission = {
            "profile": PROFILE,
            "submitter": submitter,
            "payload_url": "https://example.org/payload.zip",
            "type": "file",
            "title": f"Batch {title}",
            "filename": f"batch-{filename}",
        }
        if batch_id:
            submission["batchID"] = batch_id
        batch = batches.batch_create(zk, submission=submission)
        configuration = {
            "profile": PROFILE,
            "submitter": submitter,
            "payload_url": "https://example.org/a.pdf",
            "type": "file",
            "title": title,
            "filename": filename,
        }
        if local_id:
            configuration["localID"] = local_id
        job = jobs.job_create(
            zk,
            bid=batch.bid,
            configuration=configuration,
            identifiers={"primary_id": ark, "local_id": [local_id] if local_id else []},
        )
        if failed:
            job = jobs.job_transition(zk, job, "Estimating")
            job = jobs.job_transition(zk, job, "Failed", message=failed)
        return batch, job

    return make


def test_every_field_is_found_in_any_case(viewer: Client, deposit: Any) -> None:
    _b1, by_title = deposit(title="The Voyage of the Beagle")
    _b2, by_file = deposit(filename="Scan_0042.TIF")
    _b3, by_submitter = deposit(submitter="cdl/Grace Hopper")
    _b4, by_local = deposit(local_id="MSS-Letters-007")
    _b5, by_ark = deposit(ark="ark:/13030/m5Zx9Q")
    _b6, by_error = deposit(failed="Digest MISMATCH for page-3.jpg")

    def found(q: str, field: str = "") -> list[str]:
        response = viewer.get("/search/", {"q": q, "field": field})
        if response.status_code == 302:  # a single exact match: the item itself
            return [response["Location"].rstrip("/").rsplit("/", 1)[-1]]
        assert response.status_code == 200
        return _rows(response.content.decode(), "jobs")

    assert found("voyage OF THE beagle", "title") == [by_title.jid]
    assert found("scan_0042.tif", "filename") == [by_file.jid]
    assert found("GRACE hopper", "submitter") == [by_submitter.jid]
    assert found("mss-letters-007") == [by_local.jid]  # exact local ID: opens the job
    assert found("ARK:/13030/M5ZX9Q") == [by_ark.jid]
    assert found("digest mismatch", "error") == [by_error.jid]
    # Every field at once, each job once, newest first.
    assert found("beagle") == [by_title.jid]
    html = viewer.get("/search/", {"q": "letters"}).content.decode()
    rows = _rows(html, "jobs")
    assert by_local.jid in rows and len(rows) == len(set(rows))
    # Batches by their own submitter, title and file name, in any case.
    html = viewer.get("/search/", {"q": "BATCH-scan_0042", "field": "filename"}).content.decode()
    assert _rows(html, "batches") == [by_file.bid] and _rows(html, "jobs") == []
    html = viewer.get("/search/", {"q": "grace HOPPER"}).content.decode()
    assert _rows(html, "batches") == [by_submitter.bid]
    # What matched is said beside each row.
    html = viewer.get("/search/", {"q": "voyage"}).content.decode()
    assert "title:</span> The Voyage of the Beagle" in _section(html, "jobs")


def test_an_id_is_found_by_its_start_and_a_single_exact_match_opens_it(
    viewer: Client, deposit: Any
) -> None:
    made = [deposit()[1] for _ in range(3)]
    first = made[0]
    # The job IDs share all but their last digits: a prefix finds them all, in any case.
    prefix = first.jid[:-1].upper()
    html = viewer.get("/search/", {"q": prefix}).content.decode()
    rows = _rows(html, "jobs")
    assert {j.jid for j in made if j.jid.startswith(prefix.lower())} <= set(rows)
    assert rows == sorted(rows, reverse=True)  # newest first
    # The whole ID, in any case and with spaces around it, opens the job.
    opened = viewer.get("/search/", {"q": f"  {first.jid.upper()} "})
    assert opened.status_code == 302 and opened["Location"] == f"/jobs/{first.jid}/"
    opened = viewer.get("/search/", {"q": first.bid.upper()})
    assert opened["Location"] == f"/batches/{first.bid}/"
    # A batch's own ID (Merritt's bid-… or a UUID) by its start, and whole: opens it.
    batch, _job = deposit(batch_id="bid-6F1C2A9E-0B44-4C3B-9F7E-1234567890AB")
    html = viewer.get("/search/", {"q": "BID-6f1c2a9e"}).content.decode()
    assert _rows(html, "batches") == [batch.bid]
    whole = viewer.get("/search/", {"q": "bid-6f1c2a9e-0b44-4c3b-9f7e-1234567890ab"})
    assert whole["Location"] == f"/batches/{batch.bid}/"
    # A job ID nobody has: an empty result, not a 404.
    none = viewer.get("/search/", {"q": "jid9999999999"})
    assert none.status_code == 200 and 'data-total="0"' in _section(none.content.decode(), "jobs")


def test_a_part_that_matches_one_item_lists_it_rather_than_opening_it(
    viewer: Client, deposit: Any
) -> None:
    _batch, job = deposit(title="Only one like this")
    response = viewer.get("/search/", {"q": "one like", "field": "title"})
    assert response.status_code == 200 and _rows(response.content.decode(), "jobs") == [job.jid]


def test_a_date_range_narrows(viewer: Client, deposit: Any) -> None:
    _batch, job = deposit(title="Dated letters")
    today = date.today()
    long_ago = (today - timedelta(days=400)).isoformat()
    html = viewer.get(
        "/search/", {"q": "dated letters", "since": today.isoformat(), "until": today.isoformat()}
    ).content.decode()
    assert _rows(html, "jobs") == [job.jid] and _rows(html, "batches") == [job.bid]
    html = viewer.get(
        "/search/", {"q": "dated letters", "since": long_ago, "until": long_ago}
    ).content.decode()
    assert _rows(html, "jobs") == [] and _rows(html, "batches") == []
    html = viewer.get(
        "/search/", {"q": "dated letters", "date_of": "changed", "until": long_ago}
    ).content.decode()
    assert _rows(html, "jobs") == []
    html = viewer.get(
        "/search/", {"q": "dated letters", "date_of": "changed", "since": long_ago}
    ).content.decode()
    assert _rows(html, "jobs") == [job.jid]


def test_each_kind_is_paged(viewer: Client, deposit: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(search, "PER_PAGE", 2)
    made = [deposit(title=f"Paged letter {n}")[1] for n in range(5)]
    newest_first = sorted((j.jid for j in made), reverse=True)
    seen = []
    for page in (1, 2, 3):
        html = viewer.get("/search/", {"q": "paged letter", "page_jobs": page}).content.decode()
        assert 'data-total="5"' in _section(html, "jobs")
        seen += _rows(html, "jobs")
        # Batches stay on their first page meanwhile.
        assert len(_rows(html, "batches")) == 2
    assert seen == newest_first
    assert 'rel="next"' not in _section(html, "jobs")
    assert "page_jobs=2" in _section(html, "jobs")  # the link back


def test_markup_in_what_is_shown_stays_text(viewer: Client, deposit: Any) -> None:
    script = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    deposit(title=f"Hostile {script}", failed=f"failed: {script}")
    deposit(title=f"Hostile twin {script}")
    response = viewer.get("/search/", {"q": f"hostile {script}"})
    html = response.content.decode()
    assert response.status_code == 200
    assert "<script>alert(1)" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"q": "x" * 301}, "at most 300"),
        ({"q": "letters\x00\x1b[31m"}, "control characters"),
        ({"q": "letters", "since": "2026-13-45"}, "is not a day"),
        ({"q": "letters", "field": "password"}, "is not one of"),
        ({"q": "letters", "page_jobs": "-1"}, "is not a page number"),
        ({"q": "letters", "page_jobs": "²"}, "is not a page number"),  # int() raised: a 500
        ({"q": "letters", "page_batches": "٣"}, "is not a page number"),  # int() read 3
        ({"q": "letters", "since": "2026-02-01", "until": "2026-01-01"}, "ends before"),
    ],
)
def test_input_it_refuses_is_a_400_with_the_reason(
    viewer: Client, params: dict[str, str], words: str
) -> None:
    response = viewer.get("/search/", params)
    assert response.status_code == 400
    assert words in response.content.decode()
    assert 'id="search-form"' in response.content.decode()


def test_an_empty_or_one_letter_search_shows_the_form(viewer: Client) -> None:
    empty = viewer.get("/search/")
    assert empty.status_code == 200 and 'id="search-form"' in empty.content.decode()
    short = viewer.get("/search/", {"q": "a"})
    assert short.status_code == 200 and "at least 2 characters" in short.content.decode()


def test_error_text_is_found_in_the_step_history_too(viewer: Client, deposit: Any) -> None:
    """A job that failed a step, was resumed and is now elsewhere: its status message is gone,
    the step history still holds what went wrong."""
    from django.utils import timezone

    _batch, job = deposit(title="Resumed once")
    now = timezone.now()
    StepRecord.objects.create(
        kind="job",
        item_id=job.jid,
        step="Downloading",
        state="Downloading",
        outcome="failed",
        started=now,
        duration=1.0,
        hour=int(now.timestamp() // 3600),
        host="h",
        detail="Connection RESET by depositor.example.org",
    )
    html = viewer.get("/search/", {"q": "connection reset", "field": "error"}).content.decode()
    assert _rows(html, "jobs") == [job.jid]
    assert "error (step history)" in _section(html, "jobs")


def test_a_failed_batchs_message_is_found_until_it_is_no_longer_failed(
    zk: KazooClient, viewer: Client, deposit: Any
) -> None:
    """The Failed batches' messages are searched (their status nodes read a chunk at a time);
    a batch moved on from Failed is no longer found by its old message."""
    failed, _job = deposit(title="Failing")
    other, _job2 = deposit(title="Other")
    failed = batches.batch_transition(zk, failed, "Failed", message="Payload CHECKSUM refused")
    batches.batch_transition(zk, other, "Failed", message="unrelated words")

    def found(q: str) -> list[str]:
        response = viewer.get("/search/", {"q": q})
        assert response.status_code == 200
        return _rows(response.content.decode(), "batches")

    assert eventually(lambda: found("checksum refused") == [failed.bid])
    batches.batch_transition(zk, failed, "UpdateReporting", admin=True)
    assert eventually(lambda: found("checksum refused") == [])
    assert found("UNRELATED words") == [other.bid]


def test_a_batchs_submission_is_read_once_for_the_batch_list_and_the_search(
    zk: KazooClient, viewer: Client, deposit: Any, monkeypatch: Any
) -> None:
    """The batch list's filters and the search keep one copy of each live batch's submission:
    what one page read the other does not read again, and a batch gone is forgotten."""
    from queues.console import submissions
    from queues.zk import index as zindex
    from queues.zk import nodes

    read: list[str] = []
    real = nodes.read_many  # what nodes.json_objects reads through
    monkeypatch.setattr(nodes, "read_many", lambda z, p: read.extend(p) or real(z, p))
    grace, _job = deposit(submitter="cdl/Grace Hopper", title="Compilers")
    ada, _job2 = deposit(submitter="dpr/Ada Lovelace")

    def listed() -> list[str]:
        response = viewer.get("/batches/", {"submitter": "grace hopper"})
        assert response.status_code == 200
        return re.findall(r"bid[0-9]{10}", response.content.decode())

    assert eventually(lambda: grace.bid in listed() and ada.bid not in listed())
    assert sorted(p for p in read if p.endswith("/submission")) == sorted(
        f"/batches/{b}/submission" for b in (grace.bid, ada.bid)
    )
    read.clear()
    html = viewer.get("/search/", {"q": "GRACE hopper"}).content.decode()
    assert _rows(html, "batches") == [grace.bid]
    assert [p for p in read if p.endswith("/submission")] == []  # it used the list's

    batches.batch_remove(zk, ada, check_state=False)
    assert eventually(lambda: ada.bid not in viewer.get("/batches/").content.decode())
    viewer.get("/search/", {"q": "compilers"})
    kept = submissions._kept_for(zindex.for_client(zk)).by_bid
    assert grace.bid in kept and ada.bid not in kept
