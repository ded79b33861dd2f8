"""The quiet period folds a flapping condition into one episode; the daily digest goes once a
day; the fuse holds a collection whose jobs fail in a burst and says so; a rule added with one
small function (as a maintenance-hold overrun will be) fires and resolves like the others."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from django.utils import timezone

from queues.console import waits
from queues.daemons import alert_rules
from queues.daemons.alert_rules import Context, Finding, rule
from queues.daemons.alerting import Evaluator, deliver_due, digest_if_due
from queues.models import AlertDigest, AlertEpisode, AuditEntry
from queues.services import hold_moves, moves
from queues.zk.jobs import job_load, job_transition
from queues.zk.locks import collection_held

from .conftest import Webhook, a_moment, failed_job, later, mails_with, only, pending_job

pytestmark = pytest.mark.django_db


def test_a_condition_back_within_the_quiet_period_is_the_same_episode(
    zk: Any, smtp: Any, evaluator: Evaluator
) -> None:
    only("oldest-pending", threshold=0.0, quiet_seconds=300.0)
    t = a_moment()
    job = pending_job(zk)
    assert len(evaluator.evaluate(zk=zk, now=later(t, 1))) == 1
    for flap in range(3):  # gone (held), back within the quiet period (released), ...
        moves.job_hold(jid=job.jid)
        assert evaluator.evaluate(zk=zk, now=later(t, 10 + 100 * flap)) == []
        moves.job_release(jid=job.jid)
        assert evaluator.evaluate(zk=zk, now=later(t, 60 + 100 * flap)) == []
    job_transition(zk, job_load(zk, job.jid), "Estimating")
    gone = later(t, 400)
    assert evaluator.evaluate(zk=zk, now=gone) == []
    assert evaluator.evaluate(zk=zk, now=later(gone, 299)) == []
    assert len(evaluator.evaluate(zk=zk, now=later(gone, 300))) == 1
    deliver_due(now=later(gone, 300))
    assert AlertEpisode.objects.count() == 1
    assert len(mails_with(smtp, "ALERT")) == 1
    assert len(mails_with(smtp, "RESOLVED")) == 1


def test_the_daily_digest_goes_once_a_day_after_its_hour(
    zk: Any, smtp: Any, webhook: Webhook, evaluator: Evaluator, settings: Any
) -> None:
    settings.MRT_ALERT_DIGEST_HOUR = 7
    only("oldest-pending", threshold=0.0, quiet_seconds=0.0)
    pending_job(zk)
    evaluator.evaluate(zk=zk, now=a_moment())
    day = timezone.localtime(a_moment()).replace(hour=6, minute=59, second=0, microsecond=0)
    assert digest_if_due(day) is False  # before its hour
    morning = later(day, 60)
    assert digest_if_due(morning) is True
    assert digest_if_due(later(morning, 3600)) is False  # once a day, whoever asks
    assert deliver_due(now=later(morning, 1)) >= 2
    [digest] = mails_with(smtp, "daily alert digest")
    assert "1 open" in digest["data"] and "OPEN" in digest["data"]
    assert "oldest Pending job" in digest["data"]
    assert any("daily alert digest" in p["json"]["text"] for p in webhook.posts)
    tomorrow: datetime = later(morning, 86400)
    assert digest_if_due(tomorrow) is True
    assert AlertDigest.objects.count() == 2


def test_the_fuse_holds_the_failing_collection_and_the_alert_says_so(
    zk: Any, smtp: Any, webhook: Webhook, evaluator: Evaluator
) -> None:
    only("collection-failures", threshold=2.0, quiet_seconds=0.0, fuse=True)
    for _ in range(3):
        failed_job(zk, "letters")
    failed_job(zk, "maps")  # one failure: below the threshold, not held
    t = a_moment()
    [fired] = evaluator.evaluate(zk=zk, now=t)
    assert "letters" in fired
    assert collection_held(zk, "letters")
    assert not collection_held(zk, "maps")
    deliver_due(now=t)
    [alert] = mails_with(smtp, "ALERT")
    assert "The fuse held the collection letters" in alert["data"]
    assert "The fuse held the collection letters" in webhook.posts[0]["json"]["text"]
    entry = AuditEntry.objects.get(kind="collection", item_id="letters", action="hold")
    assert entry.via == "alerts" and "alert fuse" in entry.reason
    # Who held it and why is kept beside the hold, for every page that shows it (issue 53).
    held = waits.holds_now(zk).collections["letters"]
    assert held.by == "alert fuse" and "letters" in held.reason
    # Released by an operator while the burst is still counted: not held again in the episode.
    hold_moves.collection_release(profile="letters")
    assert evaluator.evaluate(zk=zk, now=later(t, 30)) == []
    assert not collection_held(zk, "letters")


def test_the_fuse_is_off_unless_an_admin_turns_it_on(
    zk: Any, smtp: Any, evaluator: Evaluator
) -> None:
    only("collection-failures", threshold=2.0, quiet_seconds=0.0)
    for _ in range(3):
        failed_job(zk, "letters")
    assert len(evaluator.evaluate(zk=zk, now=a_moment())) == 1
    assert not collection_held(zk, "letters")


@pytest.fixture
def overrun_rule() -> Iterator[list[Finding]]:
    """A rule registered the way a new feature adds one: a function and its defaults. It
    stands in for the real ``hold-overrun`` (queues/daemons/maintenance.py) for this test
    only: the real one is put back after, for the tests that run it."""
    now_found: list[Finding] = []
    real = alert_rules.KINDS.get("hold-overrun")

    @rule(
        "hold-overrun",
        title="Maintenance hold overrun",
        threshold=300.0,
        threshold_help="seconds past its end a maintenance hold may still be in place",
    )
    def hold_overrun(ctx: Context, threshold: float) -> list[Finding]:
        return list(now_found)

    try:
        yield now_found
    finally:
        del alert_rules.KINDS["hold-overrun"]
        if real is not None:
            alert_rules.KINDS["hold-overrun"] = real


def test_a_rule_added_with_one_function_fires_and_resolves(
    zk: Any, smtp: Any, evaluator: Evaluator, overrun_rule: list[Finding]
) -> None:
    only("hold-overrun", quiet_seconds=0.0)
    t = a_moment()
    assert evaluator.evaluate(zk=zk, now=t) == []
    overrun_rule.append(Finding("ingest", "the ingest queue's maintenance hold ran over"))
    assert len(evaluator.evaluate(zk=zk, now=later(t, 1))) == 1
    overrun_rule.clear()
    assert evaluator.evaluate(zk=zk, now=later(t, 2)) == []
    assert len(evaluator.evaluate(zk=zk, now=later(t, 3))) == 1
    deliver_due(now=later(t, 3))
    [alert] = mails_with(smtp, "ALERT")
    assert "Rule: Maintenance hold overrun" in alert["data"]
    assert "maintenance hold ran over" in alert["data"]
    assert len(mails_with(smtp, "RESOLVED")) == 1
