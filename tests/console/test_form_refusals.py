"""The console's one-item forms (fuzz findings): a yes/no field takes yes/no words only, a hold
takes an end only where it has one, and a post is a closed set of fields; each refusal is a 400
naming the field, and nothing in ZooKeeper or the database changed."""

from __future__ import annotations

import pytest
from django.urls import reverse

from queues.operator.audit import AuditEntry
from queues.zk.jobs import job_load

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("scope", ["batch", "collection"])
@pytest.mark.parametrize("confirmed", ["nope", "maybe"])
def test_a_scoped_priority_is_not_confirmed_by_any_text(operator, zk, make_job, scope, confirmed):
    """``confirmed=no`` skipped the preview: Django's BooleanField read it as yes."""
    job = make_job("Pending", profile="letters")
    url = (
        reverse("batch-priority", args=[job.bid])
        if scope == "batch"
        else reverse("collection-priority", args=["letters"])
    )
    answer = operator.post(url, {"priority": "9", "confirmed": confirmed})
    assert answer.status_code == 400 and "confirmed" in answer.content.decode()
    assert job_load(zk, job.jid).priority == 5
    # "no" says no: the preview, nothing changed.
    preview = operator.post(url, {"priority": "9", "confirmed": "no"})
    assert preview.status_code == 200 and 'id="priority-confirm"' in preview.content.decode()
    assert job_load(zk, job.jid).priority == 5
    assert not AuditEntry.objects.filter(action="priority").exists()
