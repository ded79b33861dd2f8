"""Bulk actions too big for one request run in the background, with a progress page."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.urls import reverse
from django.utils import timezone

from queues.operator import bulkrun
from queues.operator.actions import ReasonRequired
from queues.operator.audit import ApiToken, AuditEntry
from queues.operator.bulkrun import BulkRun
from queues.zk import jobs

# The bulk-runs daemon works in a thread with a database connection of its own: it must see
# committed rows.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("bulk_runs_daemon")]


@pytest.fixture(autouse=True)
def _small_inline_limit(settings):
    settings.MRT_BULK_INLINE_MAX = 2


# Runs made here as a daemon would have left them: claimed by one that is alive or dead.
ALIVE, DEAD = "alive-host:1:1", "dead-host:1:1"


def user_named(name: str):
    return get_user_model().objects.get(username=name)


def ended(pk: int, timeout: float = 60) -> BulkRun:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = BulkRun.objects.get(pk=pk)
        if run.state != BulkRun.RUNNING:
            return run
        time.sleep(0.1)
    raise AssertionError(f"bulk run {pk} still running after {timeout}s")


def test_a_big_bulk_action_runs_in_the_background_and_reports_its_progress(operator, zk, make_job):
    failed = [make_job("Failed", profile="letters") for _ in range(4)]
    held = make_job("Held", profile="letters")
    response = operator.post(
        reverse("jobs-bulk"),
        {
            "action": "resume",
            "scope": "selection",
            "item": [f"{j.jid}:{j.status.version}" for j in [*failed, held]],
        },
    )
    assert response.status_code == 303
    run = BulkRun.objects.get()
    assert response["Location"] == reverse("bulk-run", args=[run.pk])
    run = ended(run.pk)
    assert (run.state, run.position, run.total, run.done, run.skips) == ("finished", 5, 5, 4, 1)
    assert all(jobs.job_load(zk, j.jid).state == "Downloading" for j in failed)
    assert AuditEntry.objects.filter(action="resume", ok=True).count() == 4

    html = operator.get(reverse("bulk-run", args=[run.pk])).content.decode()
    assert "5 of 5 handled (100%): 4 done, 1 skipped" in html
    assert held.jid in html and "only a Failed job can be resumed" in html
    assert 'hx-trigger="every 1s"' not in html  # finished: the page stops polling
    assert f"#{run.pk}" in operator.get(reverse("bulk-runs")).content.decode()


def test_a_running_run_polls_its_page(operator, make_job):
    run = BulkRun.objects.create(
        kind="job",
        action="resume",
        items=[["jid0000000001", None]] * 3,
        total=3,
        position=1,
        owner=ALIVE,
    )
    html = operator.get(reverse("bulk-run", args=[run.pk])).content.decode()
    assert 'hx-trigger="every 1s"' in html
    assert "1 of 3 handled (33%)" in html
    assert "Continue" not in html  # alive: nothing to continue


def test_an_interrupted_run_continues_from_its_first_unhandled_item(
    operator, viewer, admin, zk, make_job
):
    failed = [make_job("Failed") for _ in range(4)]
    # Its web process died after two items: the first two jobs were resumed, then nothing.
    for job in failed[:2]:
        jobs.job_transition(zk, jobs.job_load(zk, job.jid), "Downloading", admin=True, retry=True)
    run = BulkRun.objects.create(
        user=user_named("operator-user"),
        kind="job",
        action="resume",
        items=[[j.jid, None] for j in failed],
        total=4,
        position=2,
        done=2,
        heartbeat=timezone.now() - timedelta(minutes=5),
        owner=DEAD,
    )
    page = operator.get(reverse("bulk-run", args=[run.pk])).content.decode()
    assert "Interrupted" in page and "Continue from item 3" in page
    resume = reverse("bulk-run-control", args=[run.pk, "continue"])
    assert viewer.post(resume).status_code == 403  # resuming is an operator's action
    assert admin.post(resume).status_code in (302, 303)
    run = ended(run.pk)
    assert (run.state, run.position, run.done, run.skips) == ("finished", 4, 4, 0)
    assert all(jobs.job_load(zk, j.jid).state == "Downloading" for j in failed)
    # Only the two left were handled by the continuation, in the name of who continued it.
    entries = AuditEntry.objects.filter(action="resume")
    assert sorted(e.item_id for e in entries) == sorted(j.jid for j in failed[2:])
    assert {e.username for e in entries} == {"admin-user"}
    page = admin.get(reverse("bulk-run", args=[run.pk])).content.decode()
    assert "continued by admin-user" in page
    assert operator.post(resume).status_code in (302, 303)  # finished: nothing happens
    assert AuditEntry.objects.filter(action="resume").count() == 2


def test_a_run_needs_the_role_and_a_reason_before_its_first_item(viewer, admin, make_job):
    items = [(make_job("Failed").jid, None) for _ in range(3)]
    with pytest.raises(PermissionDenied, match="needs the operator role"):
        bulkrun.start(user=user_named("viewer-user"), kind="job", action="resume", items=items)
    with pytest.raises(ReasonRequired, match="give a reason"):
        bulkrun.start(user=user_named("admin-user"), kind="job", action="delete", items=items)
    assert not BulkRun.objects.exists()


def test_the_progress_page_needs_login_and_a_real_run(client, operator):
    assert client.get(reverse("bulk-run", args=[1])).status_code == 302
    assert operator.get(reverse("bulk-run", args=[999])).status_code == 404
    assert operator.get("/bulk/abc/").status_code == 404
    assert operator.get(reverse("bulk-run-control", args=[1, "continue"])).status_code == 405
    assert operator.post("/bulk/1/pause/").status_code == 404  # only stop and continue
    assert operator.post(reverse("bulk-run-control", args=[999, "stop"])).status_code == 404
    anonymous = client.post(reverse("bulk-run-control", args=[1, "stop"]))
    assert anonymous.status_code == 302 and "/login" in anonymous["Location"]


def test_a_run_stopped_by_an_outage_says_where_and_continues_from_there(
    operator, zk, make_job, monkeypatch
):
    failed = [make_job("Failed") for _ in range(3)]
    real = bulkrun.actions.apply
    calls = []

    def outage_at_the_second(**kwargs):
        calls.append(kwargs["item_id"])
        if len(calls) == 2:
            raise ConnectionError("ZooKeeper unreachable")
        return real(**kwargs)

    monkeypatch.setattr(bulkrun.actions, "apply", outage_at_the_second)
    run = bulkrun.start(
        user=user_named("operator-user"),
        kind="job",
        action="resume",
        items=[(j.jid, None) for j in failed],
    )
    run = ended(run.pk)
    assert (run.state, run.position, run.done) == ("failed", 1, 1)
    page = operator.get(reverse("bulk-run", args=[run.pk])).content.decode()
    assert "Stopped at item 2: ZooKeeper unreachable" in page
    assert "Continue from item 2" in page
    monkeypatch.setattr(bulkrun.actions, "apply", real)
    operator.post(reverse("bulk-run-control", args=[run.pk, "continue"]))
    run = ended(run.pk)
    assert (run.state, run.position, run.done, run.error) == ("finished", 3, 3, "")
    assert all(jobs.job_load(zk, j.jid).state == "Downloading" for j in failed)


def test_a_thread_thought_dead_stops_writing_once_its_run_is_continued_elsewhere() -> None:
    run = BulkRun.objects.create(
        kind="job", action="resume", items=[["jid0000000001", None]] * 2, total=2, owner=ALIVE
    )
    slow = BulkRun.objects.get(pk=run.pk)  # the thread that was slow, not dead
    BulkRun.objects.filter(pk=run.pk).update(heartbeat=timezone.now() + timedelta(seconds=1))
    slow.position = 1
    assert bulkrun._save(slow) is False
    assert BulkRun.objects.get(pk=run.pk).position == 0


def test_a_slow_daemon_obeys_a_stop_made_while_its_run_looked_interrupted() -> None:
    run = BulkRun.objects.create(
        kind="job", action="resume", items=[["jid0000000001", None]] * 2, total=2, owner=ALIVE
    )
    BulkRun.objects.filter(pk=run.pk).update(heartbeat=timezone.now() - timedelta(minutes=5))
    slow = BulkRun.objects.get(pk=run.pk)  # its daemon is alive, only slow on the item in hand
    assert slow.interrupted
    assert bulkrun.stop(BulkRun.objects.get(pk=run.pk))
    slow.position = 1
    assert bulkrun._save(slow) is False
    stored = BulkRun.objects.get(pk=run.pk)
    assert (stored.state, stored.position) == (BulkRun.STOPPED, 0)


def test_stop_halts_a_run_after_the_item_in_hand_and_continue_finishes_it(
    operator, viewer, zk, make_job, monkeypatch
):
    failed = [make_job("Failed") for _ in range(12)]
    real = bulkrun.actions.apply
    second_in_hand = threading.Event()
    stop_sent = threading.Event()
    calls = 0

    def slow(**kwargs):
        # The second item is held in hand until the stop has been sent, so the stop always
        # lands mid-run, however fast or slow the machine.
        nonlocal calls
        calls += 1
        if calls == 2:
            second_in_hand.set()
            assert stop_sent.wait(60), "the test never sent its stop"
        return real(**kwargs)

    monkeypatch.setattr(bulkrun.actions, "apply", slow)
    # A daemon sees a stop when it saves its progress (every SAVE_EVERY seconds): saving after
    # every item makes it see the stop right after the item in hand, however fast the rest
    # would go (with 0.1 s the ten items left could all be done before the next save).
    monkeypatch.setattr(bulkrun, "SAVE_EVERY", 0)
    run = bulkrun.start(
        user=user_named("operator-user"),
        kind="job",
        action="resume",
        items=[(j.jid, None) for j in failed],
    )
    stop = reverse("bulk-run-control", args=[run.pk, "stop"])
    assert f'action="{stop}"' in operator.get(reverse("bulk-run", args=[run.pk])).content.decode()
    # Stop once the run is under way (a run stopped while still waiting handles nothing).
    assert second_in_hand.wait(60), "the run never reached its second item"
    assert viewer.post(stop).status_code == 403
    assert operator.post(stop).status_code in (302, 303)
    stop_sent.set()
    run = ended(run.pk)
    assert (run.state, run.position) == ("stopped", 2)
    moved = [j for j in failed if jobs.job_load(zk, j.jid).state == "Downloading"]
    assert len(moved) == run.done == run.position
    assert (
        "Stopped at your request"
        in operator.get(reverse("bulk-run", args=[run.pk])).content.decode()
    )
    operator.post(reverse("bulk-run-control", args=[run.pk, "continue"]))
    run = ended(run.pk)
    assert (run.state, run.position, run.done) == ("finished", 12, 12)
    assert operator.post(stop).status_code in (302, 303)  # ended: nothing to stop
    assert BulkRun.objects.get(pk=run.pk).state == "finished"


def test_an_interrupted_run_can_be_abandoned(operator) -> None:
    run = BulkRun.objects.create(
        kind="job",
        action="resume",
        items=[["jid0000000001", None]],
        total=1,
        heartbeat=timezone.now() - timedelta(minutes=5),
        owner=DEAD,
    )
    operator.post(reverse("bulk-run-control", args=[run.pk, "stop"]))
    assert BulkRun.objects.get(pk=run.pk).state == "stopped"


def test_the_overview_names_runs_under_way_and_interrupted_ones(operator, zk) -> None:
    def make(**kw):
        return BulkRun.objects.create(
            kind="job", action="resume", items=[["jid0000000001", None]] * 4, total=4, **kw
        )

    going = make(position=1, owner=ALIVE)
    lost = make(heartbeat=timezone.now() - timedelta(minutes=5), owner=DEAD)
    make(state="finished", position=4)
    html = operator.get(reverse("overview")).content.decode()
    assert reverse("bulk-run", args=[going.pk]) in html and "resume of 4 jobs</a>: 25%" in html
    assert reverse("bulk-run", args=[lost.pk]) in html and "<strong>interrupted</strong>" in html
    assert html.count("resume of 4 jobs") == 2  # not the finished one


def test_a_big_api_bulk_call_answers_202_with_its_run_and_can_follow_it(
    client, make_user, zk, make_job
):
    _token, key = ApiToken.issue(user=make_user("operator", "api-op"), name="test")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    failed = [make_job("Failed") for _ in range(3)]
    response = client.post(
        "/api/jobs/bulk",
        json.dumps({"action": "resume", "jobs": [j.jid for j in failed]}),
        content_type="application/json",
        **auth,
    )
    assert response.status_code == 202
    started = response.json()
    assert response["Location"] == started["url"] == f"/api/bulk/{started['id']}"
    ended(started["id"])
    run = client.get(started["url"], **auth).json()
    assert (run["state"], run["position"], run["done"], run["total"]) == ("finished", 3, 3, 3)
    assert {e.via for e in AuditEntry.objects.filter(action="resume")} == {"api"}
    # Nothing left to stop or continue: a 409 that says so.
    refused = client.post(f"{started['url']}/stop", **auth)
    assert refused.status_code == 409 and "nothing to stop" in refused.json()["error"]
    assert client.get("/api/bulk/999", **auth).status_code == 404
    assert client.get(started["url"]).status_code == 401


def test_a_run_waits_for_a_daemon_and_the_web_process_never_works_on_it(
    operator, zk, make_job, bulk_runs_daemon
):
    # The web request only records the run; a bulk-runs daemon claims it (its owner is shown
    # in the database), so restarting the web process cannot cut a run short.
    failed = [make_job("Failed") for _ in range(3)]
    run = bulkrun.start(
        user=user_named("operator-user"),
        kind="job",
        action="resume",
        items=[(j.jid, None) for j in failed],
    )
    assert run.owner == "" and run.shown_state == "waiting"
    run = ended(run.pk)
    assert run.state == "finished"
    assert run.owner == bulk_runs_daemon.owner


def test_the_audit_log_folds_a_background_run_into_one_line(operator, zk, make_job):
    failed = [make_job("Failed", profile="letters") for _ in range(4)]
    response = operator.post(
        reverse("jobs-bulk"),
        {
            "action": "resume",
            "scope": "selection",
            "item": [f"{j.jid}:{j.status.version}" for j in failed],
            "reason": "storage back",
        },
    )
    assert response.status_code == 303
    run = ended(BulkRun.objects.get().pk)
    assert run.done == 4
    log = operator.get(reverse("audit")).content.decode()
    assert f'href="/bulk/{run.pk}/">run #{run.pk}</a>' in log
    assert "resume, in bulk" in log and "4 jobs in the background" in log
    assert not any(j.jid in log for j in failed)  # folded
    items = operator.get(reverse("audit"), {"bulk": run.pk}).content.decode()
    assert all(j.jid in items for j in failed)
    every = operator.get(reverse("audit"), {"items": "all"}).content.decode()
    assert all(j.jid in every for j in failed)
    # Looking for one item shows its entry wherever it came from.
    one = operator.get(reverse("audit"), {"item_id": failed[0].jid}).content.decode()
    assert f"bulk run #{run.pk}:" in one


def test_a_background_run_offers_its_skips_that_may_pass_again(operator, zk, make_job, settings):
    """Issue 53, item 6: "21 skipped (... try again)" had no button to try them again."""
    settings.MRT_BULK_INLINE_MAX = 2
    failed = [make_job("Failed") for _ in range(3)]
    stale = make_job("Failed")
    items = [f"{j.jid}:{j.status.version}" for j in failed] + [f"{stale.jid}:0"]
    response = operator.post(
        reverse("jobs-bulk"), {"action": "resume", "scope": "selection", "item": items}
    )
    assert response.status_code == 303
    run = ended(BulkRun.objects.get().pk)
    html = operator.get(reverse("bulk-run", args=[run.pk])).content.decode()
    assert "3 done, 1 skipped" in html
    form = html[
        html.index('id="bulk-retry"') : html.index("</form>", html.index('id="bulk-retry"'))
    ]
    assert f'name="item" value="{stale.jid}"' in form and "Try the 1 skipped again" in form
    assert f'<a href="/jobs/{stale.jid}/">{stale.jid}</a>' in html
