"""Every page renders for a viewer against a real ZooKeeper holding items in every state."""

from __future__ import annotations

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db


@pytest.fixture
def populated(make_job, make_access, make_batch):
    failed = make_job("Failed")
    held = make_job("Held")
    pending = make_job("Pending")
    make_access("Failed")
    return {"failed": failed, "held": held, "pending": pending}


@pytest.mark.parametrize(
    "name",
    [
        "overview",
        "jobs",
        "batches",
        "failed",
        "reports",
        "holds",
        "access",
        "consistency",
        "audit",
        "tokens",
    ],
)
def test_page_renders_for_a_viewer(viewer, populated, name):
    response = viewer.get(reverse(name))
    assert response.status_code == 200, response.content[:2000]


def test_job_and_batch_pages_render(viewer, populated):
    job = populated["failed"]
    assert viewer.get(reverse("job", args=[job.jid])).status_code == 200
    assert viewer.get(reverse("batch", args=[job.bid])).status_code == 200
