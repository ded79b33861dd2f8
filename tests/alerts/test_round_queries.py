"""An alerts round reads the open episodes of all its rules in one query, and writes the
last-seen time of those still found, unchanged, in one (docs/benchmarks.md, "At rest"): it read
each rule's open episodes with a query of its own (eleven rules: 22 a minute at a round every
30 s, whatever the queue held) and wrote each open episode's last-seen time with an UPDATE of
its own. What the rounds do is unchanged: the episodes stay open, seen by the latest round."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from queues.daemons.alert_rules import KINDS
from queues.daemons.alerting import Evaluator
from queues.models import AlertEpisode

from .conftest import a_moment, failed_job, later, set_rule

pytestmark = pytest.mark.django_db

EPISODES = "queues_alertepisode"


def _round(evaluator: Evaluator, zk: Any, now: datetime) -> dict[str, int]:
    """One round's statements on the episodes' table, by their first word."""
    with CaptureQueriesContext(connection) as queries:
        evaluator.evaluate(zk=zk, now=now)
    counts: dict[str, int] = {}
    for query in queries.captured_queries:
        sql = query["sql"]
        if EPISODES in sql:
            word = sql.split(None, 1)[0].upper()
            counts[word] = counts.get(word, 0) + 1
    return counts


def test_a_round_reads_and_touches_the_episodes_once(zk, evaluator: Evaluator) -> None:
    for kind in KINDS:
        set_rule(kind, enabled=True)
    # Two rules find something: 3 failures, all of one collection.
    set_rule("failures", threshold=2.0)
    set_rule("collection-failures", threshold=2.0)
    for _ in range(3):
        failed_job(zk)
    now = a_moment()
    _round(evaluator, zk, now)  # opens the two episodes
    assert AlertEpisode.objects.filter(resolved__isnull=True).count() == 2

    for n in range(1, 4):
        at = later(now, n)
        counts = _round(evaluator, zk, at)
        print(f"round {n}: {counts}")
        assert counts == {"SELECT": 1, "UPDATE": 1}, counts
        open_ = list(AlertEpisode.objects.filter(resolved__isnull=True))
        assert len(open_) == 2
        assert all(e.last_seen == at and e.clear_since is None for e in open_)
