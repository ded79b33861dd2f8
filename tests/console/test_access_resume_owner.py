"""Resume "to Processing" only where this deployment's own consumer serves the queue.

Merritt's storage claims only Pending access requests (mrt-zk ``Access.acquirePendingAssembly``;
docs/merritt-access.md). Beside Merritt, access-small and access-large are left to it unless
MRT_OWN_STEPS names them, so a request resumed to Processing there would be claimed by nobody,
ever. Every door (page, API, ``manage.py queue``) refuses it, nothing moved, and the page does
not offer it; to Pending goes through, and standalone both do."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from queues.zk import access

from .conftest import post_json

pytestmark = pytest.mark.django_db

TO_PROCESSING = '<option value="Processing">to Processing</option>'  # the resume's choice


def beside(settings: Any, own: str = "") -> None:
    settings.MRT_DEPLOYMENT = "beside-merritt"
    settings.MRT_BATCH_INTAKE = ""
    settings.MRT_OWN_STEPS = own


def state_of(zk: Any, queue: str, qid: str) -> str:
    return access.access_load(zk, queue, qid).state


def test_beside_merritt_the_page_refuses_to_processing_and_does_not_offer_it(
    settings, operator, zk, make_access
) -> None:
    beside(settings)
    item = make_access("Failed")
    html = operator.get(reverse("access")).content.decode()
    assert item.qid in html and TO_PROCESSING not in html
    response = operator.post(
        reverse("access-action", args=["small", item.qid, "resume"]),
        {"version": item.status.version, "to": "Processing"},
    )
    assert response.status_code == 400
    assert "Processing" in response.content.decode()
    assert state_of(zk, "small", item.qid) == "Failed"


def test_beside_merritt_the_api_refuses_to_processing(
    settings, client, token_for, zk, make_access
) -> None:
    beside(settings)
    item = make_access("Failed", queue="large")
    url = f"/api/access/large/{item.qid}/resume"
    operator = token_for("operator")
    refused = post_json(client, url, {"to": "Processing"}, **operator)
    assert refused.status_code == 400
    assert "access-large" in refused.json()["error"]
    assert state_of(zk, "large", item.qid) == "Failed"
    done = post_json(client, url, {"to": "Pending"}, **operator)
    assert done.status_code == 200
    assert state_of(zk, "large", item.qid) == "Pending"


def test_beside_merritt_the_command_refuses_to_processing(
    settings, make_user, zk, make_access
) -> None:
    beside(settings)
    make_user("operator", "ops")
    item = make_access("Failed")
    err = StringIO()
    with pytest.raises(CommandError):
        call_command(
            "queue",
            "resume",
            f"small/{item.qid}",
            "--to",
            "Processing",
            "--user",
            "ops",
            stdout=StringIO(),
            stderr=err,
        )
    assert "access-small is not a step this deployment serves" in err.getvalue()
    assert state_of(zk, "small", item.qid) == "Failed"


def test_beside_merritt_owning_one_access_queue_allows_processing_there_only(
    settings, operator, zk, make_access
) -> None:
    beside(settings, own="access-small")
    small, large = make_access("Failed"), make_access("Failed", queue="large")
    html = operator.get(reverse("access")).content.decode()
    rows = {
        q: html.split(f"<td>{i.qid}</td><td>{q}</td>")[1].split("</tr>")[0]
        for q, i in (("small", small), ("large", large))
    }
    assert TO_PROCESSING in rows["small"] and TO_PROCESSING not in rows["large"]
    for queue, item, status in (("small", small, 303), ("large", large, 400)):
        response = operator.post(
            reverse("access-action", args=[queue, item.qid, "resume"]),
            {"version": item.status.version, "to": "Processing"},
        )
        assert response.status_code == status
    assert state_of(zk, "small", small.qid) == "Processing"
    assert state_of(zk, "large", large.qid) == "Failed"


def test_standalone_every_door_still_resumes_to_processing(
    settings, operator, client, token_for, make_user, zk, make_access
) -> None:
    settings.MRT_DEPLOYMENT = "standalone"
    settings.MRT_BATCH_INTAKE = ""
    settings.MRT_OWN_STEPS = ""
    page, api, command = make_access("Failed"), make_access("Failed"), make_access("Failed")
    assert TO_PROCESSING in operator.get(reverse("access")).content.decode()
    response = operator.post(
        reverse("access-action", args=["small", page.qid, "resume"]),
        {"version": page.status.version, "to": "Processing"},
    )
    assert response.status_code == 303
    answer = post_json(
        client,
        f"/api/access/small/{api.qid}/resume",
        {"to": "Processing"},
        **token_for("operator"),
    )
    assert answer.status_code == 200
    make_user("operator", "ops")
    call_command(
        "queue",
        "resume",
        f"small/{command.qid}",
        "--to",
        "Processing",
        "--user",
        "ops",
        stdout=StringIO(),
        stderr=StringIO(),
    )
    assert {state_of(zk, "small", i.qid) for i in (page, api, command)} == {"Processing"}
