"""The step history, aggregated in the database: throughput, failures, durations, waits.

Every number here comes from ``StepRecord`` rows (written by the daemons, see
``queues/daemons/stephistory.py``), never from ZooKeeper, so what a page costs depends on the
records of the chosen period, not on how many jobs the queue holds:

- counts per step and per hour or day are one ``GROUP BY`` on the indexed ``(hour, step,
  outcome)`` columns (the hour is stored as an integer, a day is ``hour / 24``, both UTC);
- medians and 95th percentiles are computed by the database where it has percentile functions
  (PostgreSQL's ``percentile_cont``), elsewhere (SQLite) over a bounded sample per step: its
  ``SAMPLE`` most recent records of the period, read through the ``(step, started)`` index. Both
  interpolate linearly between the two nearest values, so they agree on the same rows.

The charts are drawn here as SVG (no script), each with the table of its numbers beside it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Count, F
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from queues.core.clock import clock_text, exact
from queues.core.states import JOB_STEPS

SAMPLE = 2000  # records per step (or state) a percentile is computed over without SQL support
# Outcomes that are a step's work done: the item moved on (or was held) / the item failed.
DONE = ("ok", "held")
FAILED = ("failed",)
RAN = (*DONE, *FAILED)

RANGES: dict[str, tuple[str, timedelta, str]] = {
    # name: (label, period, default bucket)
    "24h": ("last 24 hours", timedelta(hours=24), "hour"),
    "7d": ("last 7 days", timedelta(days=7), "day"),
    "30d": ("last 30 days", timedelta(days=30), "day"),
}
BUCKETS = ("hour", "day")
# Hourly buckets over 30 days would be 720 bars per chart: days only there.
ALLOWED = {("24h", "hour"), ("7d", "hour"), ("7d", "day"), ("30d", "day"), ("24h", "day")}


def _model() -> Any:
    from queues.models import StepRecord

    return StepRecord


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (PostgreSQL's ``percentile_cont``)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = math.floor(pos)
    high = math.ceil(pos)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass(frozen=True)
class Spread:
    """Median and p95 of one step's durations (or one state's waits) over ``n`` records;
    ``sampled`` is how many of them the percentiles were computed over."""

    name: str
    n: int
    median: float | None
    p95: float | None
    sampled: int


@dataclass
class StepSeries:
    step: str
    done: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)

    @property
    def total_done(self) -> int:
        return sum(self.done)

    @property
    def total_failed(self) -> int:
        return sum(self.failed)


@dataclass
class Throughput:
    bucket: str
    labels: list[str]
    starts: list[int]  # bucket numbers (hours or days since the epoch)
    steps: list[StepSeries]


def _now() -> datetime:
    return datetime.now(UTC)


def period_start(range_name: str, now: datetime | None = None) -> datetime:
    return (now or _now()) - RANGES[range_name][1]


def _bucket_label(number: int, bucket: str) -> str:
    """An hour in the console's zone (one clock, as every other time it shows); a day is a
    UTC day, the buckets being whole UTC days."""
    if bucket == "day":
        return datetime.fromtimestamp(number * 86400, UTC).strftime("%m-%d UTC")
    return clock_text(datetime.fromtimestamp(number * 3600, UTC), "minutes")


def hours_exact(hours: list[int]) -> list[str]:
    """The exact UTC start of each hour (hours since the epoch), for a hover."""
    return [exact(datetime.fromtimestamp(n * 3600, UTC)) for n in hours]


def throughput(range_name: str, bucket: str, *, now: datetime | None = None) -> Throughput:
    """Steps done and failed per step and bucket over the range: one grouped query."""
    now = now or _now()
    start = period_start(range_name, now)
    first_hour = int(start.timestamp() // 3600)
    last_hour = int(now.timestamp() // 3600)
    div = 24 if bucket == "day" else 1
    starts = list(range(first_hour // div, last_hour // div + 1))
    index = {b: i for i, b in enumerate(starts)}
    rows = (
        _model()
        # On the (hour, step, outcome) index alone: the range's first hour is counted whole.
        .objects.filter(hour__gte=first_hour, hour__lte=last_hour)
        .annotate(bucket=F("hour") / div)
        .values("bucket", "step", "outcome")
        .annotate(n=Count("*"))
        .order_by()
    )
    series: dict[str, StepSeries] = {}
    for row in rows:
        if row["outcome"] not in RAN:
            continue
        s = series.get(row["step"])
        if s is None:
            s = series[row["step"]] = StepSeries(row["step"], [0] * len(starts), [0] * len(starts))
        i = index.get(int(row["bucket"]))
        if i is None:
            continue
        if row["outcome"] in DONE:
            s.done[i] += row["n"]
        else:
            s.failed[i] += row["n"]
    return Throughput(
        bucket=bucket,
        labels=[_bucket_label(b, bucket) for b in starts],
        starts=starts,
        steps=[series[k] for k in sorted(series, key=step_order)],
    )


def step_order(step: str) -> tuple[int, str]:
    """The job steps in pipeline order, then the others (batches, access, ...) by name."""
    names = [state.lower() for state in JOB_STEPS]
    return (names.index(step) if step in names else len(names), step)


PERCENTILE_SQL = (
    'SELECT "{group}", COUNT(*), '
    'percentile_cont(0.5) WITHIN GROUP (ORDER BY "{column}"), '
    'percentile_cont(0.95) WITHIN GROUP (ORDER BY "{column}") '
    'FROM "{table}" WHERE {where} GROUP BY "{group}"'
)


def _spreads(
    column: str,
    group: str,
    since: datetime,
    outcomes: tuple[str, ...] | None,
    kind: str | None = None,
) -> list[Spread]:
    """Median and p95 of ``column`` per ``group`` for records started since ``since`` (of one
    ``kind`` of item, or all)."""
    model = _model()
    table = model._meta.db_table
    # Column names from this module only, never from a request.
    assert column in ("duration", "waited") and group in ("step", "state")
    if connection.vendor == "postgresql":
        where = f'"started" >= %s AND "{column}" IS NOT NULL'
        params: list[Any] = [since]
        if outcomes:
            where += ' AND "outcome" IN (' + ", ".join(["%s"] * len(outcomes)) + ")"
            params += list(outcomes)
        if kind:
            where += ' AND "kind" = %s'
            params.append(kind)
        sql = PERCENTILE_SQL.format(group=group, column=column, table=table, where=where)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return [Spread(g, n, med, p95, n) for g, n, med, p95 in cursor.fetchall()]
    base = model.objects.filter(started__gte=since, **{f"{column}__isnull": False})
    if outcomes:
        base = base.filter(outcome__in=outcomes)
    if kind:
        base = base.filter(kind=kind)
    counts = dict(base.values_list(group).annotate(n=Count("*")).order_by())
    found = []
    for name, n in counts.items():
        values = list(
            base.filter(**{group: name})
            .order_by("-started")
            .values_list(column, flat=True)[:SAMPLE]
        )
        found.append(
            Spread(name, n, percentile(values, 0.5), percentile(values, 0.95), len(values))
        )
    return found


def durations(range_name: str, *, now: datetime | None = None) -> list[Spread]:
    """Median and p95 duration of each step (the runs that did the step's work)."""
    found = _spreads("duration", "step", period_start(range_name, now), RAN)
    return sorted(found, key=lambda s: step_order(s.name))


KINDS = ("job", "batch", "access")


def waits(range_name: str, *, now: datetime | None = None) -> list[Spread]:
    """Median and p95 of how long items waited in each state before a step took them: job
    states by their name, a batch's or access request's as "batch Pending" and so on."""
    from queues.core.states import JOB

    order = list(JOB.states)
    since = period_start(range_name, now)
    found: list[Spread] = []
    for kind in KINDS:
        spreads = sorted(
            _spreads("waited", "state", since, None, kind),
            key=lambda s: (order.index(s.name) if s.name in order else 99, s.name),
        )
        if kind != "job":
            spreads = [Spread(f"{kind} {s.name}", s.n, s.median, s.p95, s.sampled) for s in spreads]
        found += spreads
    return found


# Thresholds for stuck items --------------------------------------------------------------------

MIN_RECORDS = 20  # fewer records of a state in the last 7 days: MRT_STUCK_SECONDS applies
_cache: dict[str, tuple[float, Any]] = {}
CACHE_SECONDS = 60.0


@dataclass(frozen=True)
class Usual:
    """What is usual for a state: the p95 time a step takes on an item in it, and the p95 time an
    item spends in it in all (waiting, then the step), each over ``n`` records of 7 days."""

    state: str
    n: int
    step_p95: float | None
    total_p95: float | None


def usual_times(*, now: datetime | None = None, fresh: bool = False) -> dict[str, Usual]:
    """Per job state, the p95s stuck detection compares with (job records only); cached for a
    minute per process."""
    hit = _cache.get("usual")
    if hit and not fresh and time.monotonic() - hit[0] < CACHE_SECONDS:
        return hit[1]
    since = (now or _now()) - timedelta(days=7)
    model = _model()
    step = {s.name: s for s in _spreads("duration", "state", since, RAN, "job")}
    result: dict[str, Usual] = {}
    for name, spread in step.items():
        values = list(
            model.objects.filter(
                started__gte=since, kind="job", state=name, outcome__in=RAN, waited__isnull=False
            )
            .order_by("-started")
            .values_list("waited", "duration")[:SAMPLE]
        )
        total = percentile([w + d for w, d in values], 0.95)
        result[name] = Usual(name, spread.n, spread.p95, total)
    _cache["usual"] = (time.monotonic(), result)
    return result


def usual_step_times(*, now: datetime | None = None) -> dict[str, Spread]:
    """Per daemon step, its duration's median and p95 over 7 days (a consumer thread holding
    one item is compared with this); cached for a minute per process."""
    hit = _cache.get("steps")
    if hit and time.monotonic() - hit[0] < CACHE_SECONDS:
        return hit[1]
    since = (now or _now()) - timedelta(days=7)
    result = {s.name: s for s in _spreads("duration", "step", since, RAN)}
    _cache["steps"] = (time.monotonic(), result)
    return result


def clear_cache() -> None:
    _cache.clear()


# A job's own records -------------------------------------------------------------------------


def item_steps(item_id: str, *, limit: int = 200) -> list[Any]:
    """The step records of one item, oldest first (the job page's timeline)."""
    rows = list(_model().objects.filter(item_id=item_id).order_by("-started")[:limit])
    rows.reverse()
    return rows


# SVG charts -----------------------------------------------------------------------------------


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(value))
    for m in (1, 2, 2.5, 5, 10):
        if value <= m * exp:
            return m * exp
    return 10 * exp


def bars_svg(
    chart_id: str,
    title: str,
    labels: list[str],
    done: list[int],
    failed: list[int],
    hovers: list[str] | None = None,
) -> SafeString:
    """Stacked columns per bucket: done (solid) and failed (hatched, on top). ``hovers``: each
    bucket's exact start in UTC, shown on hovering its label (an SVG ``<title>``)."""
    width, height, left, bottom, top = 640, 180, 40, 34, 10
    n = max(1, len(labels))
    plot_w, plot_h = width - left - 36, height - bottom - top
    peak = _nice_max(max((d + f for d, f in zip(done, failed, strict=False)), default=0))
    step = plot_w / n
    bar = max(1.0, step * 0.75)
    out = [
        f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-labelledby="{escape(chart_id)}-t">',
        f'<title id="{escape(chart_id)}-t">{escape(title)}</title>',
        '<defs><pattern id="hatch-' + escape(chart_id) + '" width="6" height="6" '
        'patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
        '<rect class="chart-failed" width="6" height="6"/>'
        '<line class="chart-hatch" x1="0" y1="0" x2="0" y2="6"/></pattern></defs>',
        f'<line class="chart-axis" x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" '
        f'y2="{top + plot_h}"/>',
        f'<text class="chart-tick" x="{left - 4}" y="{top + 8}" text-anchor="end">'
        f"{int(peak)}</text>",
        f'<text class="chart-tick" x="{left - 4}" y="{top + plot_h}" text-anchor="end">0</text>',
    ]
    every = max(1, math.ceil(n / 8))
    for i, label in enumerate(labels):
        x = left + i * step + (step - bar) / 2
        d, f = done[i], failed[i]
        hd = plot_h * d / peak
        hf = plot_h * f / peak
        y = top + plot_h - hd
        if d:
            out.append(
                f'<rect class="chart-done" x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" '
                f'height="{hd:.1f}"><title>{escape(label)}: {d} done</title></rect>'
            )
        if f:
            out.append(
                f'<rect class="chart-failed-bar" fill="url(#hatch-{escape(chart_id)})" '
                f'x="{x:.1f}" y="{y - hf:.1f}" width="{bar:.1f}" height="{hf:.1f}">'
                f"<title>{escape(label)}: {f} failed</title></rect>"
            )
        if i % every == 0:
            hover = f"<title>{escape(hovers[i])}</title>" if hovers and i < len(hovers) else ""
            out.append(
                f'<text class="chart-tick" x="{x + bar / 2:.1f}" y="{height - 18}" '
                f'text-anchor="middle">{hover}{escape(label)}</text>'
            )
    out.append("</svg>")
    return mark_safe("".join(out))  # noqa: S308 - every text above is escaped


def spread_svg(chart_id: str, title: str, spreads: list[Spread]) -> SafeString:
    """Horizontal bars per row: median (solid) and p95 (outlined), on one shared scale."""
    row_h, left, width, top = 26, 190, 640, 8
    height = top + row_h * max(1, len(spreads)) + 22
    peak = _nice_max(max((s.p95 or 0 for s in spreads), default=0))
    plot_w = width - left - 70
    out = [
        f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-labelledby="{escape(chart_id)}-t">',
        f'<title id="{escape(chart_id)}-t">{escape(title)}</title>',
    ]
    for i, s in enumerate(spreads):
        y = top + i * row_h
        out.append(
            f'<text class="chart-label" x="{left - 6}" y="{y + 15}" text-anchor="end">'
            f"{escape(s.name)}</text>"
        )
        p95 = plot_w * (s.p95 or 0) / peak
        med = plot_w * (s.median or 0) / peak
        out.append(
            f'<rect class="chart-p95" x="{left}" y="{y + 3}" width="{p95:.1f}" height="16">'
            f"<title>{escape(s.name)} p95 {escape(fmt_seconds(s.p95))}</title></rect>"
        )
        out.append(
            f'<rect class="chart-median" x="{left}" y="{y + 7}" width="{med:.1f}" height="8">'
            f"<title>{escape(s.name)} median {escape(fmt_seconds(s.median))}</title></rect>"
        )
        out.append(
            f'<text class="chart-tick" x="{left + p95 + 4:.1f}" y="{y + 15}">'
            f"{escape(fmt_seconds(s.median))} / {escape(fmt_seconds(s.p95))}</text>"
        )
    axis_y = top + row_h * max(1, len(spreads)) + 4
    out.append(
        f'<line class="chart-axis" x1="{left}" y1="{axis_y}" x2="{left + plot_w}" y2="{axis_y}"/>'
    )
    out.append(f'<text class="chart-tick" x="{left}" y="{axis_y + 14}">0</text>')
    out.append(
        f'<text class="chart-tick" x="{left + plot_w}" y="{axis_y + 14}" text-anchor="end">'
        f"{escape(fmt_seconds(peak))}</text>"
    )
    out.append("</svg>")
    return mark_safe("".join(out))  # noqa: S308 - every text above is escaped


def page_context(range_name: str, bucket: str) -> dict[str, Any]:
    """Everything the history page shows for a range and bucket (cached 30 s per process)."""
    key = f"page:{range_name}:{bucket}"
    hit = _cache.get(key)
    if hit and time.monotonic() - hit[0] < 30:
        return hit[1]
    tp = throughput(range_name, bucket)
    charts = []
    for s in tp.steps:
        rows = [
            (label, d, f)
            for label, d, f in zip(tp.labels, s.done, s.failed, strict=False)
            if d or f
        ]
        charts.append(
            {
                "step": s.step,
                "svg": bars_svg(
                    f"tp-{s.step}",
                    f"{s.step}: steps done and failed per {bucket}",
                    tp.labels,
                    s.done,
                    s.failed,
                    hours_exact(tp.starts) if tp.bucket == "hour" else None,
                ),
                "rows": rows,
                "done": s.total_done,
                "failed": s.total_failed,
                "runs": s.total_done + s.total_failed,
            }
        )
    dur = durations(range_name)
    wt = waits(range_name)
    context = {
        "throughput": tp,
        "charts": charts,
        "total_done": sum(s.total_done for s in tp.steps),
        "total_failed": sum(s.total_failed for s in tp.steps),
        "durations": dur,
        "durations_svg": spread_svg(
            "durations", "Step duration per step: median and 95th percentile", dur
        ),
        "waits": wt,
        "waits_svg": spread_svg("waits", "Waiting time per state: median and 95th percentile", wt),
        "sample": SAMPLE,
        "exact": connection.vendor == "postgresql",
    }
    _cache[key] = (time.monotonic(), context)
    return context
