"""A page number is checked before it reaches a read: every paged page and API list answers a
number that is no whole number from 1 to ``MAX_PAGE`` with a 400 naming the parameter (a 23-digit
page of the batch list went to SQLite's OFFSET and came back a 500; the consistency pages took
any bad number for 1); and a fault no view foresaw is answered in its door's own format (JSON
under /api/, Merritt's exception document at /poster/), not with the pages' HTML error page."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.test.utils import override_script_prefix
from django.urls import get_resolver

from queues.web import faults
from queues.web.api import BATCH_JOBS_MAX_PER_PAGE
from queues.web.forms import MAX_PAGE

pytestmark = pytest.mark.django_db

BAD = ["0", "-1", "abc", "1.5", "²", "1" + "0" * 22, str(MAX_PAGE + 1)]

# (path, the parameter): every number a page or an API list is paged by.
PAGED = [
    ("/jobs/", "page"),
    ("/batches/", "page"),
    ("/reports/", "page"),
    ("/stuck/", "page"),
    ("/audit/", "page"),
    ("/consistency/", "page"),
    ("/failed/", "gpage"),
    ("/failed/", "rpage"),
    ("/failed/causes/", "gpage"),
]
API_PAGED = [
    "/api/jobs",
    "/api/batches",
    "/api/failed",
    "/api/failed/causes",
    "/api/reports",
    "/api/consistency",
]


@pytest.mark.parametrize("path, name", PAGED)
def test_a_page_refuses_a_whole_number_it_cannot_show(viewer, zk, make_job, path, name):
    make_job("Failed")
    for value in BAD:
        answer = viewer.get(path, {name: value})
        assert answer.status_code == 400, (path, name, value, answer.status_code)
        if name != "page" or path not in ("/jobs/", "/batches/"):  # those two say it by field
            assert f"{name} must be a whole number from 1 to" in answer.content.decode()
    # The last page there may be is a page (empty here), not a fault.
    assert viewer.get(path, {name: str(MAX_PAGE)}).status_code == 200, path
    assert viewer.get(path, {name: ""}).status_code == 200, path


def test_the_audit_log_refuses_a_bulk_run_that_is_no_number(viewer):
    """``?bulk=`` names a bulk run by its number: "abc" showed the whole log as if not asked,
    "²" failed in int()."""
    for value in ("abc", "²", "-1", "0"):
        answer = viewer.get("/audit/", {"bulk": value})
        assert answer.status_code == 400, value
        assert "bulk must be a whole number from 1 to" in answer.content.decode()
    assert viewer.get("/audit/", {"bulk": "7"}).status_code == 200


@pytest.mark.parametrize("path", API_PAGED)
def test_an_api_list_refuses_a_whole_number_it_cannot_show(client, token_for, zk, make_job, path):
    make_job("Failed")
    headers = token_for("viewer")
    for value in BAD:
        answer = client.get(path, {"page": value}, **headers)
        assert answer.status_code == 400, (path, value, answer.status_code)
        assert answer["Content-Type"] == "application/json"
        assert "page" in answer.json()["error"]
    assert client.get(path, {"page": str(MAX_PAGE)}, **headers).status_code == 200, path


def test_a_batch_s_job_pages_refuse_what_they_cannot_show(client, token_for, zk, make_job):
    job = make_job("Pending")
    headers = token_for("viewer")
    path = f"/api/batches/{job.bid}"
    for name, most in (("page", 10**9), ("limit", BATCH_JOBS_MAX_PER_PAGE)):
        for value in ["0", "abc", "²", "1" + "0" * 22, str(most + 1)]:
            answer = client.get(path, {name: value}, **headers)
            assert answer.status_code == 400, (name, value, answer.status_code)
            assert answer.json()["error"] == f"{name} must be a whole number from 1 to {most:,}"
    answer = client.get(path, {"page": "1", "limit": str(BATCH_JOBS_MAX_PER_PAGE)}, **headers)
    assert answer.json()["jobs"] == {"Pending": [job.jid]}


def test_a_fault_under_api_is_answered_in_json(token_for, make_user, zk, monkeypatch):
    """A view that fails in a way no refusal names: the API's client gets JSON (Django logged
    the fault before asking the handler), the pages keep their HTML error page."""
    assert get_resolver().resolve_error_handler(500) is faults.server_error

    def broken(*args, **kwargs):
        raise RuntimeError("a fault no refusal names")

    monkeypatch.setattr("queues.console.batch_reads.batches_page", broken)
    client = Client(raise_request_exception=False)
    answer = client.get("/api/batches", **token_for("viewer"))
    assert answer.status_code == 500
    assert answer["Content-Type"] == "application/json"
    assert answer.json() == {"error": "internal error: the console logged it", "status": 500}
    assert "a fault" not in answer.content.decode()  # what failed stays in the log

    page = Client(raise_request_exception=False)
    page.force_login(make_user("viewer"))
    html = page.get("/batches/")
    assert html.status_code == 500
    assert html["Content-Type"].startswith("text/html")

    # Under a URL prefix (daphne's --root-path) its links go there, not to the host's root.
    with override_script_prefix("/queue/"):
        prefixed = page.get("/batches/", SCRIPT_NAME="/queue")
    assert prefixed.status_code == 500
    links = re.findall(r'href="([^"]*)"', prefixed.content.decode())
    assert links and [u for u in links if u.startswith("/") and not u.startswith("/queue/")] == []


def test_a_fault_at_the_poster_door_is_merritt_s_exception_document(token_for, monkeypatch):
    """A depositor's tool reads Merritt's exception document, never the pages' HTML: a fault
    is GENERAL_EXCEPTION, as Merritt's own door answers one."""

    def broken(*args, **kwargs):
        raise RuntimeError("a fault no refusal names")

    monkeypatch.setattr("queues.views.poster._submit", broken)
    client = Client(raise_request_exception=False)
    answer = client.post("/poster/submit", {"profile": "p"}, **token_for("operator"))
    assert answer.status_code == 500
    assert answer["Content-Type"].startswith("text/xml")
    body = answer.content.decode()
    assert "<exc:tException.GENERAL_EXCEPTION" in body
    assert "<exc:detail>internal error: the console logged it</exc:detail>" in body
    assert "a fault" not in body
