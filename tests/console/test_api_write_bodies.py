"""An action under /api/ reads its whole request before it does anything, and a request it
cannot read the one way is refused, nothing moved: a key given twice (the last was taken), NaN,
a body over Django's size limit or with too many fields (the pages' HTML 400), a query string on
a POST (left unread: ``?until=`` held a queue with no end), a body given to an action that takes
no fields (left unread: a note was deleted whatever the body said), true/false where no yes/no
field goes (the text "true"). Each test reads ZooKeeper and the database after the refusal."""

from __future__ import annotations

import pytest

from queues.models import Note
from queues.operator.audit import AuditEntry
from tests.core.helpers import snapshot

pytestmark = pytest.mark.django_db

LATER = "2099-01-01T00:00:00+00:00"


def _unchanged(zk, before, notes: int = 0) -> None:
    assert snapshot(zk) == before
    assert not AuditEntry.objects.exists()
    assert Note.objects.count() == notes


# A key given twice -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, body, named",
    [
        ("/api/jobs/{jid}/priority", '{"priority": 9, "priority": 1}', "priority"),
        ("/api/holds/collection/letters/cap", '{"limit": 3, "limit": 4}', "limit"),
        (
            "/api/holds/queue/ingest/hold",
            f'{{"reason": "redeploy", "until": "{LATER}", "until": "2099-02-01T00:00:00Z"}}',
            "until",
        ),
        (
            "/api/jobs/bulk",
            '{"action": "hold", "jobs": ["{jid}"], "action": "delete", "reason": "x"}',
            "action",
        ),
        (
            "/api/jobs/bulk",
            '{"action": "hold", "jobs": [{"id": "{jid}", "version": 0, "version": 9}]}',
            "version",
        ),
        ("/api/notes", '{"kind": "job", "item": "{jid}", "text": "a", "text": "b"}', "text"),
        ("/api/collections/letters/priority", '{"priority": 1, "priority": 2}', "priority"),
    ],
)
def test_a_key_given_twice_is_refused_not_the_last_taken(
    client, token_for, zk, make_job, path, body, named
):
    job = make_job("Pending", profile="letters")
    before = snapshot(zk)
    answer = client.post(
        path.format(jid=job.jid),
        body.replace("{jid}", job.jid),
        content_type="application/json",
        **token_for("admin"),
    )
    assert answer.status_code == 400, answer.content
    assert answer["Content-Type"] == "application/json"
    assert answer.json()["error"] == (
        f"the body has key {named!r} twice in one object: give each key once"
    )
    _unchanged(zk, before)


def test_a_form_field_given_twice_is_refused_too(client, token_for, zk, make_job):
    job = make_job("Pending", profile="letters")
    before = snapshot(zk)
    answer = client.post(
        f"/api/jobs/{job.jid}/priority",
        "priority=9&priority=1",
        content_type="application/x-www-form-urlencoded",
        **token_for("admin"),
    )
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"] == "the body has field 'priority' twice: give each field once"
    _unchanged(zk, before)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_is_no_json_value(client, token_for, zk, make_job, constant):
    """Python's parser takes NaN and Infinity: a hold's reason was the text "nan"."""
    job = make_job("Pending")
    before = snapshot(zk)
    answer = client.post(
        f"/api/jobs/{job.jid}/hold",
        f'{{"reason": {constant}}}',
        content_type="application/json",
        **token_for("operator"),
    )
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"] == (f"the body is not valid JSON: {constant} is no JSON value")
    _unchanged(zk, before)


def test_json_from_outside_gives_each_key_once():
    from queues.core.words import DuplicateKey, json_within

    assert json_within('{"a": {"b": 1}, "b": [{"a": 2}]}') == {"a": {"b": 1}, "b": [{"a": 2}]}
    for twice in ('{"a": 1, "a": 1}', '{"x": [{"a": 1, "b": 2, "a": 3}]}'):
        with pytest.raises(DuplicateKey, match="key 'a' twice in one object"):
            json_within(twice)
    with pytest.raises(ValueError, match="NaN is no JSON value"):
        json_within("[NaN]")
