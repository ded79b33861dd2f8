"""Every rule, against a real ZooKeeper, a real SMTP server and a real webhook receiver: the
condition made for real fires one alert per channel, however many rounds see it; once it is
cured the episode resolves once, after the quiet period, with one "resolved" per channel."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from daemons.conftest import DEMO

from queues.daemons.alerting import Evaluator, deliver_due
from queues.models import AlertEpisode, AlertMessage
from queues.operator import archive, stuck
from queues.services import moves
from queues.zk import consumers as zconsumers
from queues.zk.batches import batch_create, batch_load, batch_transition
from queues.zk.jobs import job_load, job_transition
from queues.zk.locks import queue_hold_clear, queue_hold_set
from queues.zk.maintenance import window_set

from .conftest import Webhook, a_moment, failed_job, later, mails_with, only, pending_job

pytestmark = pytest.mark.django_db

QUIET = 60.0


def _failures(zk: Any) -> tuple[dict[str, Any], Callable[[], None], Callable[[], None]]:
    jobs: list[Any] = []

    def make() -> None:
        jobs.extend(failed_job(zk) for _ in range(3))

    def cure() -> None:
        for job in jobs:
            moves.job_resume(jid=job.jid)

    return {"threshold": 2.0}, make, cure


def _collection_failures(zk: Any) -> tuple[dict[str, Any], Callable[[], None], Callable[[], None]]:
    jobs: list[Any] = []

    def make() -> None:
        jobs.extend(failed_job(zk, "letters") for _ in range(2))
        jobs.append(failed_job(zk, DEMO))  # one of another collection: below its threshold

    def cure() -> None:
        for job in jobs:
            moves.job_resume(jid=job.jid)

    return {"threshold": 1.0}, make, cure


def _stuck(zk: Any) -> tuple[dict[str, Any], Callable[[], None], Callable[[], None]]:
    jobs: list[Any] = []

    def make() -> None:
        job = pending_job(zk)
        jobs.append(job_transition(zk, job, "Estimating"))
        stuck.reset()
        # Older in its state than MRT_STUCK_SECONDS (set to a second below).
        deadline = time.monotonic() + 30
        while not stuck.find_stuck(zk, fresh=True) and time.monotonic() < deadline:
            time.sleep(0.2)

    def cure() -> None:
        job_transition(zk, job_load(zk, jobs[0].jid), "Failed", message="given up")
        stuck.reset()

    return {"threshold": 0.0}, make, cure


def _oldest_pending(zk: Any) -> tuple[dict[str, Any], Callable[[], None], Callable[[], None]]:
    jobs: list[Any] = []

    def make() -> None:
        jobs.append(pending_job(zk))
        time.sleep(0.05)  # older than the threshold of 0 s

    def cure() -> None:
        job_transition(zk, job_load(zk, jobs[0].jid), "Estimating")

    return {"threshold": 0.0}, make, cure


def _no_consumer(zk: Any) -> tuple[dict[str, Any], Callable[[], None], Callable[[], None]]:
    def serve() -> None:
        zconsumers.consumer_publish(
            zk, "host-a-123", {"host": "host-a", "pid": 123, "steps": ["retention"]}
        )

    def make() -> None:
        zconsumers.consumer_remove(zk, "host-a-123")  # the one process serving retention

    serve()
    return {"threshold": 0.0}, make, serve


def _retention(zk: Any) -> tuple[dict[str, Any], Callable[[], None], Callable[[], None]]:
    def make() -> None:
        batch = batch_create(zk, submission={"profile": DEMO, "submitter": "tester"})
        for state in ("Processing", "Reporting", "Completed"):
            batch = batch_transition(zk, batch_load(zk, batch.bid), state)

    def cure() -> None:
        outcomes = list(archive.sweep(older_than=timedelta(0), zk=zk))
        assert [o.done for o in outcomes] == [True], outcomes

    return {"threshold": 0.0}, make, cure


def _hold_overrun(zk: Any) -> tuple[dict[str, Any], Callable[[], None], Callable[[], None]]:
    """README, "The weekly redeploy": the ingest queue held with an end that has passed (no
    maintenance daemon ran to release it), then released by hand."""

    def make() -> None:
        queue_hold_set(zk, "ingest")
        ended = a_moment() - timedelta(seconds=1)
        window_set(zk, "queue", "ingest", until=ended, reason="weekly redeploy")

    def cure() -> None:
        assert queue_hold_clear(zk, "ingest")

    return {"threshold": 0.0}, make, cure


SCENARIOS = {
    "failures": _failures,
    "collection-failures": _collection_failures,
    "stuck": _stuck,
    "oldest-pending": _oldest_pending,
    "no-consumer": _no_consumer,
    "retention": _retention,
    "hold-overrun": _hold_overrun,
}


@pytest.mark.parametrize("kind", list(SCENARIOS))
def test_each_rule_fires_once_per_episode_and_resolves_once(
    zk: Any, smtp: Any, webhook: Webhook, evaluator: Evaluator, kind: str, settings: Any
) -> None:
    settings.MRT_STUCK_SECONDS = 1.0
    settings.MRT_OWN_STEPS = "retention,alerts"
    settings.MRT_RETENTION_DAYS = 0
    values, make, cure = SCENARIOS[kind](zk)
    only(kind, quiet_seconds=QUIET, **values)
    start = a_moment()
    assert evaluator.evaluate(zk=zk, now=start) == []  # all well before the fault

    make()
    t = a_moment()
    fired = evaluator.evaluate(zk=zk, now=t)
    assert len(fired) == 1 and f"alert {kind}" in fired[0], fired
    for step in (1, 2, 3):  # seen again: the same episode, nothing new to say
        assert evaluator.evaluate(zk=zk, now=later(t, step)) == []
    assert deliver_due(now=later(t, 3)) == 2
    [episode] = AlertEpisode.objects.filter(kind=kind)
    assert episode.resolved is None
    if kind == "collection-failures":
        assert episode.key == "letters" and "collection letters" in episode.summary
    [alert] = mails_with(smtp, "ALERT")
    assert sorted(alert["to"]) == ["merritt-team@example.org", "oncall@example.org"]
    assert episode.summary in alert["data"]
    [post] = webhook.posts
    assert set(post["json"]) == {"text"} and "ALERT" in post["json"]["text"]

    cure()
    cured = later(t, 10)
    assert evaluator.evaluate(zk=zk, now=cured) == []  # clear, but not for the quiet period
    assert evaluator.evaluate(zk=zk, now=later(cured, QUIET - 1)) == []
    resolved = evaluator.evaluate(zk=zk, now=later(cured, QUIET))
    assert len(resolved) == 1 and "resolved" in resolved[0], resolved
    assert evaluator.evaluate(zk=zk, now=later(cured, QUIET + 5)) == []
    assert deliver_due(now=later(cured, QUIET + 5)) == 2
    episode.refresh_from_db()
    assert episode.resolved == later(cured, QUIET)
    assert len(mails_with(smtp, "ALERT")) == 1
    [done] = mails_with(smtp, "RESOLVED")
    assert episode.summary in done["data"]
    assert len(webhook.posts) == 2 and "RESOLVED" in webhook.posts[1]["json"]["text"]
    assert AlertMessage.objects.filter(sent__isnull=True).count() == 0
