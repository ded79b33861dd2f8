"""Operators' notes on jobs, batches and collections: who may write, change and remove them,
the audit of each, escaping, and where they show (the item's page, its timeline, the lists)."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from queues.models import Note
from queues.operator.audit import ApiToken, AuditEntry
from queues.zk import locks

pytestmark = pytest.mark.django_db

MARKUP = '<script>alert("x")</script><b>bold</b>'


def add(client, kind, item_id, text, **extra):
    return client.post(reverse("note-add", args=[kind, item_id]), {"text": text, **extra})


def test_an_operator_notes_a_job_and_it_shows_on_its_page_timeline_and_in_lists(
    operator, viewer, make_job
):
    job = make_job("Failed")
    response = add(operator, "job", job.jid, "depositor asked us to wait until Monday")
    assert response.status_code == 303
    assert response["Location"] == reverse("job", args=[job.jid])
    note = Note.objects.get()
    assert (note.kind, note.item_id, note.author_name) == ("job", job.jid, "operator-user")
    page = viewer.get(reverse("job", args=[job.jid])).content.decode()
    assert "depositor asked us to wait until Monday" in page.split(f'id="notes-job-{job.jid}"')[1]
    timeline = page.split('id="job-timeline"')[1].split("</section>")[0]
    assert "ev-note" in timeline and "depositor asked us to wait until Monday" in timeline
    listing = viewer.get(reverse("jobs"), {"state": "Failed"}).content.decode()
    row = listing.split(f'id="job-row-{job.jid}"')[1].split("</tr>")[0]
    assert 'class="note-marker"' in row
    assert 'title="operator-user: depositor asked us to wait until Monday"' in row
    entry = AuditEntry.objects.get(action="note")
    assert (entry.kind, entry.item_id, entry.ok) == ("job", job.jid, True)
    assert entry.detail == "depositor asked us to wait until Monday"


def test_a_note_with_markup_shows_as_text_everywhere(operator, viewer, make_job):
    job = make_job("Failed")
    add(operator, "job", job.jid, MARKUP)
    escaped = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&lt;b&gt;bold&lt;/b&gt;"
    for url in (reverse("job", args=[job.jid]), reverse("jobs") + "?state=Failed"):
        html = viewer.get(url).content.decode()
        assert "<script>alert" not in html and "<b>bold</b>" not in html
        assert escaped in html


def test_a_viewer_may_not_write_a_note_and_the_refusal_is_audited(viewer, make_job):
    job = make_job("Failed")
    response = add(viewer, "job", job.jid, "let me in")
    assert response.status_code == 403
    assert not Note.objects.exists()
    refused = AuditEntry.objects.get(action="note")
    assert not refused.ok and "operator role" in refused.detail
    assert 'id="note-new-job-' not in viewer.get(reverse("job", args=[job.jid])).content.decode()


def test_only_the_author_or_an_admin_changes_or_removes_a_note(
    operator, admin, make_user, make_job
):
    from django.test import Client

    job = make_job("Failed")
    add(operator, "job", job.jid, "first words")
    note = Note.objects.get()
    other = Client()
    other.force_login(make_user("operator", "other-operator"))
    edit = other.post(reverse("note-edit", args=[note.pk]), {"text": "rewritten"})
    assert edit.status_code == 403
    assert other.post(reverse("note-delete", args=[note.pk])).status_code == 403
    assert Note.objects.get().text == "first words"
    # The other operator sees no edit button on it.
    page = other.get(reverse("job", args=[job.jid])).content.decode()
    assert f'id="note-save-{note.pk}"' not in page
    assert (
        operator.post(reverse("note-edit", args=[note.pk]), {"text": "second words"}).status_code
        == 303
    )
    note.refresh_from_db()
    assert note.text == "second words" and note.edited is not None
    assert admin.post(reverse("note-delete", args=[note.pk])).status_code == 303
    assert not Note.objects.exists()
    actions = list(
        AuditEntry.objects.filter(item_id=job.jid).order_by("id").values_list("action", "ok")
    )
    assert actions == [
        ("note", True),
        ("note-edit", False),
        ("note-delete", False),
        ("note-edit", True),
        ("note-delete", True),
    ]
    deleted = AuditEntry.objects.get(action="note-delete", ok=True)
    assert deleted.username == "admin-user" and "second words" in deleted.detail


def test_empty_long_and_misaddressed_notes_are_refused(operator, make_job):
    job = make_job("Failed")
    assert add(operator, "job", job.jid, "   ").status_code == 400
    assert add(operator, "job", job.jid, "x" * (Note.MAX_LENGTH + 1)).status_code == 400
    assert add(operator, "job", "jid9999999999", "nobody home").status_code == 404
    assert add(operator, "batch", "bid9999999999", "nobody home").status_code == 404
    assert add(operator, "batch", job.jid, "a job ID as a batch").status_code == 400
    assert not Note.objects.exists()
    assert AuditEntry.objects.filter(action="note", ok=False).count() == 5


def test_a_batch_note_shows_on_its_page_and_in_the_batch_list(operator, viewer, make_job):
    job = make_job("Failed")
    assert (
        add(operator, "batch", job.bid, "re-sent by the depositor as bid of 3 May").status_code
        == 303
    )
    page = viewer.get(reverse("batch", args=[job.bid])).content.decode()
    assert (
        "re-sent by the depositor as bid of 3 May" in page.split(f'id="notes-batch-{job.bid}"')[1]
    )
    listing = viewer.get(reverse("batches")).content.decode()
    row = listing.split(f'id="batch-row-{job.bid}"')[1].split("</tr>")[0]
    assert 'class="note-marker"' in row and "re-sent by the depositor" in row


def test_a_collection_note_shows_on_the_holds_page_row(operator, viewer, zk, make_job):
    make_job("Held", profile="letters")
    locks.collection_hold_set(zk, "letters")
    response = add(operator, "collection", "letters", "storage node 9 replaced; hold until Monday")
    assert response.status_code == 303 and response["Location"] == reverse("holds")
    page = viewer.get(reverse("holds")).content.decode()
    row = page.split('id="collection-letters"')[1].split("</tr>")[0]
    assert 'class="note-marker"' in row and "storage node 9 replaced" in row


def test_the_api_lists_adds_edits_and_deletes_notes_with_the_same_rules(
    client, make_user, make_job
):
    job = make_job("Failed")
    keys = {}
    for role in ("viewer", "operator"):
        _token, key = ApiToken.issue(user=make_user(role, f"api-{role}"), name="t")
        keys[role] = {"HTTP_AUTHORIZATION": f"Bearer {key}"}

    def post(url, data, role):
        return client.post(url, json.dumps(data), content_type="application/json", **keys[role])

    body = {"kind": "job", "item": job.jid, "text": MARKUP}
    assert post("/api/notes", body, "viewer").status_code == 403
    made = post("/api/notes", body, "operator")
    assert made.status_code == 200 and made.json()["text"] == MARKUP
    listed = client.get("/api/notes", {"kind": "job", "item": job.jid}, **keys["viewer"]).json()
    assert [n["author"] for n in listed["notes"]] == ["api-operator"]
    pk = made.json()["id"]
    assert post(f"/api/notes/{pk}/edit", {"text": "x"}, "viewer").status_code == 403
    assert post(f"/api/notes/{pk}/edit", {"text": "plain"}, "operator").json()["text"] == "plain"
    assert post(f"/api/notes/{pk}/delete", {}, "operator").status_code == 200
    assert not Note.objects.exists()
    assert AuditEntry.objects.filter(action__startswith="note", via="api", ok=True).count() == 3


@pytest.mark.parametrize("text", ["a\x00b", "bell\x07", "esc\x1b[31m", "c1\x85end"])
def test_a_note_with_a_control_character_is_refused_at_both_doors(
    operator, client, token_for, make_job, text
):
    """A NUL was stored in the note as it came, from the page and the API alike."""
    job = make_job("Failed")
    answer = add(operator, "job", job.jid, text)
    assert answer.status_code == 400 and "control character" in answer.content.decode()
    api = client.post(
        "/api/notes",
        json.dumps({"kind": "job", "item": job.jid, "text": text}),
        content_type="application/json",
        **token_for("operator"),
    )
    assert api.status_code == 400 and "control character" in api.json()["error"]
    assert not Note.objects.exists()


def test_a_note_keeps_its_lines_and_tabs(operator, make_job):
    job = make_job("Failed")
    assert add(operator, "job", job.jid, "first line\r\nsecond\tline").status_code == 303
    assert Note.objects.get().text == "first line\r\nsecond\tline"
    # Changed, it is checked the same way.
    note = Note.objects.get()
    edit = operator.post(reverse("note-edit", args=[note.pk]), {"text": "a\x00b"})
    assert edit.status_code == 400
    assert Note.objects.get().text == "first line\r\nsecond\tline"


def test_a_note_on_a_collection_nobody_knows_is_refused_at_both_doors(
    operator, client, token_for, zk, make_job
):
    """A note on a job that is not there answered 404; one on a collection was kept."""
    answer = add(operator, "collection", "no_such_coll", "t")
    assert answer.status_code == 404 and "no_such_coll" in answer.content.decode()
    api = client.post(
        "/api/notes",
        json.dumps({"kind": "collection", "item": "no_such_coll", "text": "t"}),
        content_type="application/json",
        **token_for("operator"),
    )
    assert api.status_code == 404
    assert not Note.objects.exists()
    assert AuditEntry.objects.filter(action="note", ok=False, item_id="no_such_coll").count() == 2
    # Known from its profile, or only from a job of it in the queue.
    from queues.console.selectors import known_profiles

    make_job("Failed", profile="maps")
    for name in (known_profiles()[0], "maps"):
        assert add(operator, "collection", name, "noted").status_code == 303, name
    assert Note.objects.count() == 2
