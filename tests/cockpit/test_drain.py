"""Drain: an operator's POST (CSRF, audited) asks a process to stop claiming; it finishes the
item in hand, claims nothing more, and says "drained"; "claim again" undoes it."""

from __future__ import annotations

import pytest
from django.test import Client

from queues.daemons.registration import ProcessObserver
from queues.operator.audit import AuditEntry
from queues.zk import client as zkmod
from queues.zk import consumers as zconsumers
from queues.zk.jobs import job_load

from .conftest import SlowStep, held_consumer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def consumer(zk, zk_hosts):
    with held_consumer(zk_hosts, host="worker1", pid=77) as (_daemon, observer):
        yield observer


def _entry(zk):
    (entry,) = zconsumers.consumers_list(zk)
    return entry


def test_drain_finishes_the_item_in_hand_then_claims_nothing(
    zk, consumer, operator, make_job, monkeypatch
):
    # Each time the daemon asks whether it may claim is a chance it had to claim.
    (daemon,) = consumer.daemons
    asked = 0
    may_claim = daemon.claiming_allowed

    def counted():
        nonlocal asked
        asked += 1
        return may_claim()

    monkeypatch.setattr(daemon, "claiming_allowed", counted)
    first = make_job("Estimating")
    wait_for(lambda: _entry(zk)["threads"][0].get("item") == first.jid)
    response = operator.post("/consumers/worker1-77/drain/", {"reason": "host maintenance"})
    assert response.status_code == 303
    # Asked while the item was in hand: draining, not yet drained.
    entry = wait_for(lambda: (e := _entry(zk))["draining"] and e)
    assert not entry["drained"]
    assert entry["drain"]["by"] == "operator-user"
    assert entry["drain"]["reason"] == "host maintenance"
    page = operator.get("/consumers/").content.decode()
    assert "draining" in page or "drained" in page
    second = make_job("Estimating")
    # The item in hand is finished...
    daemon.until.set()
    wait_for(lambda: job_load(zk, first.jid).state == "Provisioning", timeout=15)
    entry = wait_for(lambda: (e := _entry(zk))["drained"] and e)
    assert not any(t.get("item") for t in entry["threads"])
    page = operator.get("/consumers/").content.decode()
    assert "drained" in page and 'id="state-worker1-77"' in page
    # ...and nothing more is claimed, however often the daemon looks.
    looked = asked
    wait_for(lambda: asked >= looked + 5, timeout=30)
    assert job_load(zk, second.jid).state == "Estimating"
    entry = AuditEntry.objects.get(kind="consumer", action="drain")
    assert (entry.item_id, entry.username, entry.ok) == ("worker1-77", "operator-user", True)
    assert entry.reason == "host maintenance"
    # Claim again: the waiting job goes on.
    assert operator.post("/consumers/worker1-77/undrain/").status_code == 303
    wait_for(lambda: job_load(zk, second.jid).state == "Provisioning", timeout=15)
    assert not _entry(zk)["draining"]
    assert AuditEntry.objects.filter(kind="consumer", action="undrain", ok=True).count() == 1


def test_metrics_count_consumers_by_mode_and_busy_threads(zk, consumer, viewer, make_job):
    # The item is held until the scrape has counted it: a step of a fixed 1.5 s could end
    # between the registry's showing it and the scrape's reading the registry on a busy
    # machine (a whole-suite run saw busy 0 once).
    (daemon,) = consumer.daemons
    make_job("Estimating")
    wait_for(lambda: _entry(zk)["threads"][0].get("item"))
    metrics = viewer.get("/metrics").content.decode()
    assert 'mrt_consumers{mode="claiming"} 1' in metrics
    assert "mrt_consumer_threads_busy 1" in metrics
    zconsumers.drain_request(zk, "worker1-77", {"by": "test"})
    daemon.until.set()
    wait_for(lambda: _entry(zk)["drained"], timeout=15)
    metrics = viewer.get("/metrics").content.decode()
    assert 'mrt_consumers{mode="drained"} 1' in metrics
    assert "mrt_consumer_threads_busy 0" in metrics


def test_drain_needs_the_operator_role_and_csrf(zk, consumer, viewer, make_user):
    response = viewer.post("/consumers/worker1-77/drain/")
    assert response.status_code == 403
    assert zconsumers.drain_read(zk, "worker1-77") is None
    user = make_user("operator", "csrf-op")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post("/consumers/worker1-77/drain/").status_code == 403
    assert zconsumers.drain_read(zk, "worker1-77") is None


def test_draining_a_process_that_is_gone_is_refused(zk, operator):
    assert operator.get("/consumers/nobody-1/drain/").status_code == 404
    response = operator.post("/consumers/nobody-1/drain/", {"reason": "host maintenance"})
    assert response.status_code in (403, 404, 409)
    assert AuditEntry.objects.filter(kind="consumer", action="drain", ok=False).count() == 1


def test_a_drain_is_confirmed_with_a_reason_and_names_the_steps_left_without_a_consumer(
    zk, consumer, operator
):
    wait_for(lambda: _entry(zk))
    page = operator.get("/consumers/").content.decode()
    # The consumers page links to a confirmation; it does not drain in one click.
    assert 'href="/consumers/worker1-77/drain/"' in page
    confirm = operator.get("/consumers/worker1-77/drain/")
    assert confirm.status_code == 200
    html = confirm.content.decode()
    step = _entry(zk)["steps"][0]
    assert 'id="drain-alone"' in html and f"<strong>{step}</strong>" in html
    assert 'name="reason"' in html and "required" in html
    # Without a reason it is refused, and nothing is asked of the process.
    assert operator.post("/consumers/worker1-77/drain/").status_code == 400
    assert zconsumers.drain_read(zk, "worker1-77") is None
    assert operator.post("/consumers/worker1-77/drain/", {"reason": "patch"}).status_code == 303
    assert zconsumers.drain_read(zk, "worker1-77")["reason"] == "patch"


def test_the_drain_confirmation_names_only_the_steps_a_drain_stops(zk, zk_hosts, operator):
    """Issue 53, item 6: a periodic daemon (maintenance, alerts, retention) claims nothing and
    goes on while its process is drained; the confirmation said it would stop."""
    from queues.daemons.maintenance import Maintenance

    other = zkmod.connect(zk_hosts)
    claiming = SlowStep(zk=other, poll=0.1)
    periodic = Maintenance(zk=other, poll=0.1)
    observer = ProcessObserver(
        other, [claiming, periodic], record=False, publish_seconds=0.2, host="worker2", pid=78
    )
    observer.start()
    try:
        wait_for(lambda: zconsumers.consumers_list(zk))
        (entry,) = zconsumers.consumers_list(zk)
        assert entry["claiming"] == [claiming.name]
        html = operator.get("/consumers/worker2-78/drain/").content.decode()
        preview = html[html.index('id="drain-preview"') :]
        preview = preview[: preview.index("</p>")]
        stops, _, going_on = preview.partition('id="drain-going-on"')
        assert f"<strong>{claiming.name}</strong>" in stops
        assert "<strong>maintenance</strong>" not in stops
        assert "A drain does not stop <strong>maintenance</strong>" in going_on
        # Only the claiming step is left without a consumer by the drain.
        alone = html[html.index('id="drain-alone"') :]
        alone = alone[: alone.index("</p>")]
        assert claiming.name in alone and "maintenance" not in alone
    finally:
        observer.stop()
        other.stop()
        other.close()


@pytest.mark.parametrize(
    "reason, said", [("x" * 100_000, "at most 2000"), ("a\x00b", "Null characters")]
)
def test_a_drain_reason_is_checked_as_every_reason_and_refused_whole(
    zk, consumer, operator, reason, said
):
    """A 100,000-character reason was cut to 500 and the process drained; a NUL was kept."""
    wait_for(lambda: _entry(zk))
    response = operator.post("/consumers/worker1-77/drain/", {"reason": reason})
    assert response.status_code == 400 and said in response.content.decode()
    assert zconsumers.drain_read(zk, "worker1-77") is None
    assert not AuditEntry.objects.filter(kind="consumer", action="drain").exists()
    extra = operator.post("/consumers/worker1-77/drain/", {"reason": "patch", "foo": "bar"})
    assert extra.status_code == 400 and zconsumers.drain_read(zk, "worker1-77") is None


def test_a_drain_or_claim_again_posted_twice_claims_no_second_move(zk, consumer, operator):
    """The second of two drains found the process draining; its entry said "running ->
    draining" all the same. Now each says what it found."""
    for verb in ("drain", "drain", "undrain", "undrain"):
        answer = operator.post(f"/consumers/worker1-77/{verb}/", {"reason": "host maintenance"})
        assert answer.status_code == 303
    made = AuditEntry.objects.filter(kind="consumer", ok=True).order_by("id")
    assert [(e.action, e.before, e.after, e.detail) for e in made] == [
        ("drain", "running", "draining", "stops claiming"),
        ("drain", "draining", "draining", "already draining"),
        ("undrain", "draining", "running", ""),
        ("undrain", "running", "running", "was not draining"),
    ]
