"""The console's bulk forms (issue 52, item 3, its web doors): the fields posted are a closed set,
and a filter that narrows nothing acts on every job only when the post says so in words (the
preview that says "every job" posts ``all``). Each test reads ZooKeeper after the refusal."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from queues.zk import batches, jobs

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_failed(make_job):
    return [make_job("Failed", profile=p) for p in ("letters", "maps")]


def states(zk, items) -> list[str]:
    return [jobs.job_load(zk, j.jid).state for j in items]


@pytest.mark.parametrize(
    "url, post, named",
    [
        ("failed-bulk", {}, "narrows nothing"),
        ("failed-bulk", {"collection": "letters"}, "collection"),
        ("jobs-bulk", {"state": "Failed", "nosuch": "x"}, "nosuch"),
        ("jobs-bulk", {}, "narrows nothing"),
        ("jobs-bulk", {"sort": "oldest"}, "narrows nothing"),
        ("jobs-bulk", {"min_age_hours": "0", "submitter": " "}, "narrows nothing"),
        ("failed-causes-bulk", {"cause": "0" * 16, "profil": "letters"}, "profil"),
    ],
)
def test_a_bulk_post_that_does_not_say_what_it_means_moves_nothing(
    operator, zk, two_failed, url, post, named
):
    form = {"action": "resume", "scope": "filter", "confirmed": "1", **post}
    answer = operator.post(reverse(url), form)
    assert answer.status_code == 400, answer.content[:300]
    assert named in answer.content.decode()
    assert states(zk, two_failed) == ["Failed", "Failed"]


def test_every_failed_job_is_previewed_as_such_and_then_asked_for_in_words(
    operator, zk, two_failed
):
    preview = operator.post(reverse("failed-bulk"), {"action": "resume", "scope": "filter"})
    html = preview.content.decode()
    assert preview.status_code == 200 and 'id="bulk-everything"' in html
    assert states(zk, two_failed) == ["Failed", "Failed"]
    # What the confirmation posts back, as a browser would send it.
    confirm = html[html.index('<form method="post" action="">') :]
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', confirm))
    assert fields.get("all") == "1" and fields.get("confirmed") == "1"
    fields.pop("csrfmiddlewaretoken", None)
    done = operator.post(reverse("failed-bulk"), fields)
    assert done.status_code == 200 and "2 done" in done.content.decode()
    assert "Failed" not in states(zk, two_failed)


def test_a_batch_bulk_post_with_an_unknown_field_moves_nothing(operator, zk, make_batch):
    batch = batches.batch_transition(zk, make_batch(), "Held", message="collection held")
    answer = operator.post(
        reverse("batches-bulk"),
        {
            "action": "release",
            "scope": "selection",
            "item": [f"{batch.bid}:{batch.status.version}"],
            "confirmed": "1",
            "also": "everything",
        },
    )
    assert answer.status_code == 400 and "also" in answer.content.decode()
    assert batches.batch_load(zk, batch.bid).state == "Held"


@pytest.mark.parametrize(
    "url, post",
    [
        ("jobs-bulk", {"state": "Failed", "profile": "nosuch"}),
        ("failed-bulk", {"profile": "nosuch"}),
        ("jobs-bulk", {"state": "Failed", "profile": "nosuch", "confirmed": "1"}),
    ],
)
def test_a_filter_that_matches_nothing_is_a_409_saying_so_and_audits_nothing(
    operator, zk, two_failed, url, post
):
    """As the API answers it (``test_api_refusals``): not a preview of no item, nor "0 done"."""
    from queues.operator.audit import AuditEntry

    answer = operator.post(reverse(url), {"action": "resume", "scope": "filter", **post})
    assert answer.status_code == 409, answer.content[:300]
    assert "nothing matches this filter" in answer.content.decode()
    assert states(zk, two_failed) == ["Failed", "Failed"]
    assert not AuditEntry.objects.exists()


def test_an_empty_selection_stays_a_400(operator, zk, two_failed):
    answer = operator.post(reverse("jobs-bulk"), {"action": "resume", "scope": "selection"})
    assert answer.status_code == 400
    assert "nothing selected" in answer.content.decode()
