"""The consistency check as background work: started from the page by an admin, walked by the
``consistency`` daemon (not the web process), its progress and paged findings on the page,
repair from the findings kept, one run at a time, and ``queuecheck`` doing the same."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from kazoo.client import KazooClient

from queues.daemons.consistency import ConsistencyCheck
from queues.models import AuditEntry, ConsistencyFinding, ConsistencyRun
from queues.operator import check, consistency
from queues.zk import batches, jobs
from queues.zk.records import Job

pytestmark = pytest.mark.django_db


def _csrf_client(user: Any) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def _token(client: Client) -> str:
    html = client.get(reverse("consistency")).content.decode()
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert match, "the page offers no form"
    return match.group(1)


def _walk(zk: KazooClient) -> ConsistencyRun:
    """What ``runconsumer consistency`` does once: claim the waiting run and walk it."""
    daemon = ConsistencyCheck(zk=zk, poll=0.05)
    assert daemon.run_once()
    run = consistency.latest()
    assert run is not None
    return run


def _state(html: str) -> str:
    match = re.search(r'id="consistency-run"[^>]*data-state="([a-z]+)"', html)
    assert match, html
    return match.group(1)


def test_an_admin_starts_a_check_that_the_daemon_walks_and_the_page_shows(
    make_user: Callable[..., Any], zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    job = make_job("Failed")
    zk.delete(job.index_path)
    admin = _csrf_client(make_user("admin"))
    assert 'id="consistency-none"' in admin.get(reverse("consistency")).content.decode()
    assert admin.post(reverse("consistency")).status_code == 403  # no CSRF token
    token = _token(admin)
    response = admin.post(reverse("consistency"), {"csrfmiddlewaretoken": token})
    assert response.status_code == 303
    html = admin.get(reverse("consistency")).content.decode()
    # Recorded, not walked: the web process only wrote the run.
    assert _state(html) == "waiting" and 'hx-trigger="every 1s"' in html
    assert "Waiting for a consistency daemon" in html
    assert not ConsistencyFinding.objects.exists()

    run = _walk(zk)
    assert (run.state, run.jobs, run.findings, run.repairable) == ("finished", 1, 1, 1)
    html = admin.get(reverse("consistency")).content.decode()
    assert _state(html) == "finished" and 'hx-trigger="every 1s"' not in html
    assert "job-unindexed" in html and f"/jobs/{job.jid}" in html
    assert 'id="repair-button"' in html

    response = admin.post(
        reverse("consistency-repair"),
        {"csrfmiddlewaretoken": _token(admin), "reason": "index lost in a crash"},
    )
    assert response.status_code == 200
    assert zk.exists(job.index_path) is not None
    assert f"created {job.index_path}" in response.content.decode()
    row = ConsistencyFinding.objects.get(run=run)
    assert row.repair == f"created {job.index_path}"
    assert AuditEntry.objects.filter(action="repair", ok=True).exists()
    assert check.run_check(zk).ok


def test_only_an_admin_starts_a_check(viewer: Client, operator: Client, zk: KazooClient) -> None:
    assert viewer.post(reverse("consistency")).status_code == 403
    assert operator.post(reverse("consistency")).status_code == 403
    assert not ConsistencyRun.objects.exists()
    assert 'id="check-button"' not in operator.get(reverse("consistency")).content.decode()


def test_progress_is_kept_while_the_walk_goes(
    zk: KazooClient, make_job: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(7):
        make_job()
    monkeypatch.setattr(consistency, "SAVE_EVERY", 0.0)
    run, created = consistency.start(user=None, via="cli", owner="here:1:1")
    assert created
    seen: list[tuple[str, int, int]] = []

    def look(_line: str) -> None:
        row = ConsistencyRun.objects.get(pk=run.pk)
        seen.append((row.phase, row.done, row.total))

    consistency.walk(run, zk, owner="here:1:1", say=look, chunk=3)
    assert ("reading jobs", 3, 7) in seen and ("reading jobs", 6, 7) in seen
    assert ("reading batches", 7, 7) in seen
    assert ConsistencyRun.objects.get(pk=run.pk).state == "finished"


def test_the_background_run_finds_what_the_check_finds(
    zk: KazooClient, make_job: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The damage of test_consistency_check's several-kinds case.
    unindexed, doubled, done = make_job(), make_job(), make_job("Completed")
    zk.delete(unindexed.index_path)
    zk.create(f"/jobs/states/held/05-{doubled.jid}", b"", makepath=True)
    zk.delete(f"/batches/{done.bid}/states/batch-completed/{done.jid}")
    zk.create("/jobs/states/pending/05-jid0000000888", b"")
    zk.create("/batch-uuids/0b7c1d2e-3f40-4a5b-8c6d-7e8f90a1b2c3", b"bid0000000404")
    zk.create("/jobs/jid0000000889", b"")
    monkeypatch.setattr(check, "ABANDONED_SECONDS", -1)
    expected = sorted((f.kind, f.path, f.repairable) for f in check.run_check(zk).findings)
    assert {kind for kind, _p, _r in expected} == {
        "job-unindexed",
        "job-multiple-index",
        "batch-index-wrong",
        "orphan-index",
        "orphan-uuid",
        "incomplete-job",
    }
    consistency.start(user=None)
    run = _walk(zk)
    kept = sorted(
        ConsistencyFinding.objects.filter(run=run).values_list("kind", "path", "repairable")
    )
    assert kept == expected
    assert run.kinds == {
        kind: sum(1 for k, _p, _r in expected if k == kind) for kind, _, _ in expected
    }
    lines = consistency.repair(run, zk)
    assert len(lines) == len(expected)
    assert check.run_check(zk).ok
    for job, state in ((unindexed, "Pending"), (doubled, "Pending"), (done, "Completed")):
        assert jobs.job_load(zk, job.jid).state == state


def test_findings_are_paged_and_filtered_by_kind(
    admin: Client, zk: KazooClient, make_batch: Callable[..., Any]
) -> None:
    batch = make_batch()
    for number in range(55):
        zk.create(f"/jobs/states/pending/05-jid{900000 + number:010d}", b"", makepath=True)
    zk.create(f"/batches/{batch.bid}/states/batch-failed/jid0000999999", b"", makepath=True)
    consistency.start(user=None)
    run = _walk(zk)
    assert run.kinds == {"orphan-batch-index": 1, "orphan-index": 55}
    first = admin.get(reverse("consistency")).content.decode()
    assert first.count("<tr><td>orphan-") == 50 and 'id="consistency-next"' in first
    second = admin.get(reverse("consistency") + "?page=2").content.decode()
    assert second.count("<tr><td>orphan-") == 6 and 'id="consistency-next"' not in second
    only = admin.get(reverse("consistency") + "?kind=orphan-batch-index").content.decode()
    assert only.count("<tr><td>orphan-") == 1 and "jid0000999999" in only


def test_one_run_at_a_time_across_hosts(zk: KazooClient) -> None:
    first, created = consistency.start(user=None, owner="host-a:10:1")
    assert created
    again, created = consistency.start(user=None, via="api")
    assert (again.pk, created) == (first.pk, False)
    # The database itself refuses a second running run (another host's insert).
    with pytest.raises(IntegrityError), transaction.atomic():
        ConsistencyRun.objects.create(owner="host-b:20:1")
    # A walker that stopped sending heartbeats has gone: the next start begins anew.
    ConsistencyRun.objects.filter(pk=first.pk).update(
        heartbeat=timezone.now() - timedelta(minutes=5)
    )
    fresh, created = consistency.start(user=None)
    assert created and fresh.pk != first.pk
    gone = ConsistencyRun.objects.get(pk=first.pk)
    assert gone.state == "failed" and "has gone" in gone.error
    # And the walker that was thought dead may not write to it any more, nor drop its findings.
    ConsistencyFinding.objects.create(run=gone, kind="orphan-index", path="/x", detail="kept")
    with pytest.raises(consistency.Lost):
        consistency.walk(gone, zk, owner="host-a:10:1")
    assert ConsistencyFinding.objects.filter(run=gone).count() == 1


def test_queuecheck_walks_in_its_own_process_and_keeps_the_run(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    job = make_job()
    zk.delete(job.index_path)
    waiting, _ = consistency.start(user=None)  # started on the page, no daemon took it
    out, err = StringIO(), StringIO()
    call_command("queuecheck", stdout=out, stderr=err)
    run = ConsistencyRun.objects.get(pk=waiting.pk)
    assert run.state == "finished" and run.owner.endswith(":queuecheck")
    assert "checked 1 jobs, 1 batches" in out.getvalue() and "1 findings" in out.getvalue()
    assert f"job-unindexed                  /jobs/{job.jid}" in out.getvalue()
    assert "done: 1 findings" in err.getvalue()
    call_command("queuecheck", "--repair", stdout=(out := StringIO()), stderr=StringIO())
    assert f"repaired: created {job.index_path}" in out.getvalue()


def test_queuecheck_refuses_while_another_walker_has_the_run(zk: KazooClient) -> None:
    consistency.start(user=None, owner="host-b:20:1")
    with pytest.raises(CommandError, match=r"already running \(on host-b:20:1"):
        call_command("queuecheck", stdout=StringIO(), stderr=StringIO())


def test_a_batch_merritt_holds_is_shown_with_advice_and_not_repaired(
    admin: Client, zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    from queues.zk.codecs import encode_json, now_stamp
    from tests.daemons.merritt_ingest import merritt_batch

    held = merritt_batch(zk)
    zk.set(
        f"/batches/{held.bid}/status",
        encode_json({"status": "Held", "last_modified": now_stamp(), "message": ""}),
    )
    consistency.start(user=None)
    run = _walk(zk)
    assert (run.findings, run.repairable) == (1, 0)
    html = admin.get(reverse("consistency")).content.decode()
    assert "Merritt's item: not repaired here" in html and "What to do:" in html
    assert consistency.repair(run, zk) == []
    assert zk.exists(f"/batches/{held.bid}/states") is None
    assert batches.batch_load(zk, held.bid).state == "Held"


def test_the_api_starts_a_check_and_pages_its_findings(
    client: Client, make_user: Callable[..., Any], zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    from queues.operator.audit import ApiToken

    def bearer(role: str) -> dict[str, str]:
        _token, key = ApiToken.issue(user=make_user(role, f"api-{role}"), name="test")
        return {"HTTP_AUTHORIZATION": f"Bearer {key}"}

    admin, operator = bearer("admin"), bearer("operator")
    job = make_job()
    zk.delete(job.index_path)
    assert client.get("/api/consistency", **operator).json()["run"] is None
    start = {"path": "/api/consistency", "data": '{"start": true}'}
    refused = client.post(**start, content_type="application/json", **operator)
    assert refused.status_code == 403 and not ConsistencyRun.objects.exists()
    started = client.post(**start, content_type="application/json", **admin).json()
    assert started["run"]["state"] == "waiting"
    _walk(zk)
    answer = client.get("/api/consistency?kind=job-unindexed", **operator).json()
    assert answer["run"]["state"] == "finished" and answer["run"]["kinds"] == {"job-unindexed": 1}
    assert [f["path"] for f in answer["findings"]] == [f"/jobs/{job.jid}"]
    assert answer["next_page"] is None
