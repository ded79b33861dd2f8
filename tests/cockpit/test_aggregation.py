"""The history's numbers for known records, on SQLite (sampled percentiles) and PostgreSQL
(percentile_cont): throughput per bucket, failures, median and p95 durations, waits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from queues.models import StepRecord
from queues.operator import history

from .conftest import record


def _hour_start(now: datetime, hours_ago: int) -> datetime:
    base = now.replace(minute=0, second=0, microsecond=0)
    return base - timedelta(hours=hours_ago) + timedelta(minutes=10)


def test_throughput_counts_done_and_failed_per_step_and_hour(database) -> None:
    now = datetime.now(UTC)
    rows = []
    # 2 hours ago: 3 estimating done, 1 failed; 1 hour ago: 2 downloading done.
    for i in range(3):
        rows.append(record(item_id=f"jid{i:010d}", started=_hour_start(now, 2)))
    rows.append(record(outcome="failed", started=_hour_start(now, 2)))
    rows += [
        record(step="downloading", state="Downloading", started=_hour_start(now, 1))
        for _ in range(2)
    ]
    # Not counted: a wait (the step found nothing to do), and a record older than the range.
    rows.append(record(outcome="waiting", started=_hour_start(now, 1)))
    rows.append(record(started=now - timedelta(hours=30)))
    StepRecord.objects.bulk_create(rows)
    tp = history.throughput("24h", "hour", now=now)
    by = {s.step: s for s in tp.steps}
    assert set(by) == {"estimating", "downloading"}
    assert [s.step for s in tp.steps] == ["estimating", "downloading"]  # pipeline order
    assert len(tp.labels) == 25  # every hour of the range, partial ones included
    i2 = tp.starts.index(int(_hour_start(now, 2).timestamp() // 3600))
    i1 = tp.starts.index(int(_hour_start(now, 1).timestamp() // 3600))
    assert (by["estimating"].done[i2], by["estimating"].failed[i2]) == (3, 1)
    assert (by["estimating"].total_done, by["estimating"].total_failed) == (3, 1)
    assert by["downloading"].done[i1] == 2 and by["downloading"].total_done == 2
    days = history.throughput("7d", "day", now=now)
    est = {s.step: s for s in days.steps}["estimating"]
    assert (est.total_done, est.total_failed) == (4, 1)  # the 30-hour-old one counts here


def test_duration_median_and_p95(database) -> None:
    now = datetime.now(UTC)
    # Durations 1..20 s: median 10.5, p95 = 19 + 0.05 * (20 - 19) = 19.05 (linear).
    StepRecord.objects.bulk_create(
        [
            record(duration=float(d), started=now - timedelta(minutes=d), waited=float(d * 10))
            for d in range(1, 21)
        ]
        + [record(step="notify", state="Notify", duration=2.0, started=now)]
        + [record(outcome="waiting", duration=500.0, started=now)]  # not a run of the step
    )
    spreads = {s.name: s for s in history.durations("24h", now=now)}
    est = spreads["estimating"]
    assert est.n == 20
    assert est.median == pytest.approx(10.5)
    assert est.p95 == pytest.approx(19.05)
    assert spreads["notify"].median == pytest.approx(2.0)
    waits = {s.name: s for s in history.waits("24h", now=now)}
    # Waits 10..200 (the waiting record has none): median 105, p95 190.5.
    assert waits["Estimating"].n == 20
    assert waits["Estimating"].median == pytest.approx(105.0)
    assert waits["Estimating"].p95 == pytest.approx(190.5)


def test_usual_times_for_stuck_detection(database) -> None:
    now = datetime.now(UTC)
    StepRecord.objects.bulk_create(
        [
            record(duration=2.0, waited=8.0, started=now - timedelta(minutes=i))
            for i in range(history.MIN_RECORDS)
        ]
    )
    usual = history.usual_times(now=now, fresh=True)["Estimating"]
    assert usual.n == history.MIN_RECORDS
    assert usual.step_p95 == pytest.approx(2.0)
    assert usual.total_p95 == pytest.approx(10.0)


def test_percentile_interpolates_like_percentile_cont() -> None:
    assert history.percentile([], 0.5) is None
    assert history.percentile([3.0], 0.95) == 3.0
    assert history.percentile([1.0, 2.0, 3.0, 4.0], 0.5) == pytest.approx(2.5)
    assert history.percentile([1.0, 2.0, 3.0, 4.0], 0.95) == pytest.approx(3.85)
