"""The alert rules: what each one looks at, and its settings as admins keep them.

A rule kind is one small function registered with :func:`rule`: given the round's
:class:`Context` and the rule's threshold, it returns a :class:`Finding` per thing that is wrong
now (none when all is well), each with a key (a collection, a step, or ``""`` for the queue as a
whole). The evaluator (``queues/daemons/alerting.py``) turns findings into episodes: one alert
when a key is first found, one "resolved" message once it has been clear for the rule's quiet
period. A rule never needs to remember anything itself; with ``sustained`` the threshold is a
number of seconds the condition must last before it counts, and the evaluator keeps the time.

Adding a rule is one function here (or in the module of the feature it watches, imported by
the alerts daemon), for example a maintenance hold that runs past its end::

    @rule("hold-overrun", title="Maintenance hold overrun", threshold=300.0,
          threshold_help="seconds past its end a hold may still be in place")
    def hold_overrun(ctx: Context, threshold: float) -> list[Finding]:
        return [Finding(h.name, f"hold {h.name} ended {h.late:.0f} s ago and is still on")
                for h in holds_with_end(ctx.zk) if h.late > threshold]

Its settings row is made with these defaults the first time the rules are read; no migration.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.db import IntegrityError, connection

from queues.console import failure_causes, selectors
from queues.core.states import JobState
from queues.models import AlertRule
from queues.operator import archive, stuck
from queues.zk import consumers as zconsumers
from queues.zk import index as zindex

log = logging.getLogger("queues.alerts")

WINDOW = timedelta(minutes=10)  # failures are counted over this much time
LISTED = 10  # examples a finding names (job IDs, batches)
PROBE_BUDGET = 3.0  # seconds the database probe may take before it counts as unreachable


@dataclass(frozen=True)
class Cause:
    """One of a finding's top causes: how many jobs it accounts for, and the console page
    (a path and query under ``MRT_CONSOLE_URL``) that shows it."""

    count: int
    what: str  # "Storing: storage node <n> is down"
    total: int  # every Failed job of this cause now
    path: str


@dataclass(frozen=True)
class Finding:
    key: str  # "" (the queue as a whole), a collection, a step
    summary: str  # one line: the alert's subject
    detail: str = ""  # a few lines more
    causes: tuple[Cause, ...] = ()  # what the alert is about, most jobs first
    link: str = ""  # the console page (path and query) that shows all of it


@dataclass(frozen=True)
class Context:
    """One round of evaluation: the process's ZooKeeper client (None while it is unreachable)
    and the round's time, which every rule measures against."""

    zk: Any
    now: datetime


Check = Callable[[Context, float], list[Finding]]


@dataclass(frozen=True)
class RuleKind:
    kind: str
    title: str
    threshold: float  # the default
    threshold_help: str  # what the number means, on the page
    quiet: float  # the default quiet period, seconds
    check: Check
    sustained: bool = False  # the threshold is seconds the condition must last
    needs_zookeeper: bool = True
    fuse: bool = False  # its keys are collections the fuse may hold
    # What the "resolved" message says is over, given the episode's key and when it opened
    # (not the alert's words again); a rule without one says "no longer found: <summary>".
    cleared: Callable[[str, datetime], str] | None = None


KINDS: dict[str, RuleKind] = {}
DEFAULT_QUIET = 600.0


def rule(
    kind: str,
    *,
    title: str,
    threshold: float,
    threshold_help: str,
    quiet: float = DEFAULT_QUIET,
    sustained: bool = False,
    needs_zookeeper: bool = True,
    fuse: bool = False,
    cleared: Callable[[str, datetime], str] | None = None,
) -> Callable[[Check], Check]:
    """Register ``check`` as the rule ``kind`` (letters, digits and ``-``, at most 40)."""
    if not (0 < len(kind) <= 40 and kind.replace("-", "").isalnum() and kind == kind.lower()):
        raise ValueError(f"rule kind {kind!r} is malformed")

    def register(check: Check) -> Check:
        KINDS[kind] = RuleKind(
            kind,
            title,
            threshold,
            threshold_help,
            quiet,
            check,
            sustained,
            needs_zookeeper,
            fuse,
            cleared,
        )
        return check

    return register


# Settings ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleSettings:
    kind: str
    enabled: bool
    threshold: float
    quiet: float
    fuse: bool


def defaults(kind: RuleKind) -> RuleSettings:
    return RuleSettings(kind.kind, True, kind.threshold, kind.quiet, False)


def rule_rows() -> list[AlertRule]:
    """Every known rule's row, in registration order; rows missing are made with defaults."""
    rows = {r.kind: r for r in AlertRule.objects.filter(kind__in=list(KINDS))}
    missing = [k for k in KINDS.values() if k.kind not in rows]
    for kind in missing:
        try:
            rows[kind.kind] = AlertRule.objects.create(
                kind=kind.kind, threshold=kind.threshold, quiet_seconds=kind.quiet
            )
        except IntegrityError:  # made meanwhile by another process
            rows[kind.kind] = AlertRule.objects.get(kind=kind.kind)
    return [rows[k] for k in KINDS]


def rule_settings() -> dict[str, RuleSettings]:
    return {
        r.kind: RuleSettings(r.kind, r.enabled, r.threshold, r.quiet_seconds, r.fuse)
        for r in rule_rows()
    }


# The steps this deployment serves (``queues.daemons.registry.owned_steps``), handed in by the
# registry: it imports every daemon, the alerts daemon among them, so it cannot be imported here.
_owned: list[Callable[[], list[str]]] = []


def serve_steps(owned: Callable[[], list[str]]) -> None:
    """Name the function that says which steps should each have a consumer process."""
    _owned[:] = [owned]


# What the rules read -------------------------------------------------------------------------


def recent_failures(zk: Any, now: datetime) -> list[str]:
    """The jobs that entered Failed within ``WINDOW`` before ``now`` (and are still Failed).

    The time a job entered Failed is its index entry's creation time, read and remembered the
    way the stuck-job judgement reads the working states' (``queues/operator/stuck.py``), so each
    round reads only the entries that are new since the last."""
    idx = zindex.for_client(zk)
    entries, ctimes = stuck._entry_times(zk, idx, JobState.FAILED)
    since = (now - WINDOW).timestamp()
    keys = entries.keys
    return [entries.jid(keys[i]) for i, t in enumerate(ctimes) if t >= since]


TOP_CAUSES = 3  # causes an alert on failures names


def causes_of(zk: Any, jids: list[str], profile: str = "") -> tuple[tuple[Cause, ...], str, str]:
    """The top causes of ``jids`` by the grouping of ``/failed/causes/``, the lines that name
    them, and the link to all of them (the page filtered as the alert is)."""
    link = "/failed/causes/" + (f"?{urlencode({'profile': profile})}" if profile else "")
    top, others = failure_causes.top_causes(jids, profile=profile, zk=zk, most=TOP_CAUSES)
    causes = tuple(
        Cause(c.count, f"{c.step}: {c.signature}", c.total, f"/failed/causes/?{c.query}")
        for c in top
    )
    lines = ["Top causes:"] if causes else []
    lines += [
        f"  {c.count} x {c.what} ({c.total} failed jobs in all): {console_url(c.path)}"
        for c in causes
    ]
    if others:
        lines.append(f"  {others} of other causes")
    lines.append(f"All causes: {console_url(link)}")
    return causes, "\n".join(lines), link


def console_url(path: str) -> str:
    return f"{str(settings.MRT_CONSOLE_URL).rstrip('/')}{path}"


def _examples(ids: list[str]) -> str:
    shown = ", ".join(ids[:LISTED])
    return shown + (f" and {len(ids) - LISTED} more" if len(ids) > LISTED else "")


# The rules -----------------------------------------------------------------------------------


@rule(
    "failures",
    title="Failures in 10 minutes",
    threshold=10.0,
    threshold_help="alert when more jobs than this failed in the last 10 minutes",
    cleared=lambda _key, _since: "failures in the last 10 minutes are back within the threshold",
)
def failures(ctx: Context, threshold: float) -> list[Finding]:
    failed = recent_failures(ctx.zk, ctx.now)
    if len(failed) <= threshold:
        return []
    causes, lines, link = causes_of(ctx.zk, failed)
    return [
        Finding(
            "",
            f"{len(failed)} jobs failed in the last 10 minutes{_most(causes)}",
            f"{lines}\nJobs: {_examples(sorted(failed))}",
            causes,
            link,
        )
    ]


def _most(causes: tuple[Cause, ...]) -> str:
    """``, 12 of them Storing: storage node <n> is down``: the top cause, in the subject."""
    if not causes:
        return ""
    top = causes[0]
    what = top.what if len(top.what) <= 120 else top.what[:117] + "..."
    return f", {top.count} of them {what}"


@rule(
    "collection-failures",
    title="Failures in one collection",
    threshold=5.0,
    threshold_help="alert when more jobs of one collection than this failed in the last "
    "10 minutes (with the fuse on, also hold that collection)",
    fuse=True,
    cleared=lambda key, _since: (
        f"failures of collection {key} in the last 10 minutes are back within the threshold"
    ),
)
def collection_failures(ctx: Context, threshold: float) -> list[Finding]:
    failed = recent_failures(ctx.zk, ctx.now)
    if len(failed) <= threshold:
        return []
    facts = zindex.for_client(ctx.zk).job_facts(failed)
    per: dict[str, list[str]] = {}
    for jid in sorted(failed):
        fact = facts.get(jid)
        if fact is not None and fact.profile:
            per.setdefault(fact.profile, []).append(jid)
    found = []
    for profile, jids in sorted(per.items()):
        if len(jids) <= threshold:
            continue
        causes, lines, link = causes_of(ctx.zk, jids, profile)
        found.append(
            Finding(
                profile,
                f"{len(jids)} jobs of collection {profile} failed in the last 10 minutes"
                + _most(causes),
                f"{lines}\nJobs: {_examples(jids)}",
                causes,
                link,
            )
        )
    return found


@rule(
    "stuck",
    title="Jobs stuck",
    threshold=0.0,
    threshold_help="alert when more jobs than this are stuck (as the stuck page judges them)",
    cleared=lambda _key, _since: "no more jobs are stuck than the threshold allows",
)
def stuck_jobs(ctx: Context, threshold: float) -> list[Finding]:
    found = stuck.find_stuck(ctx.zk)
    if len(found) <= threshold:
        return []
    by_state = Counter(s.state for s in found)
    states = ", ".join(f"{n} in {state}" for state, n in sorted(by_state.items()))
    lines = [f"{s.jid} in {s.state}: {s.why}" for s in found[:LISTED]]
    return [Finding("", f"{len(found)} jobs stuck ({states})", "\n".join(lines))]


@rule(
    "oldest-pending",
    title="Oldest Pending job",
    threshold=3600.0,
    threshold_help="alert when the oldest Pending job has waited longer than this many seconds",
    cleared=lambda _key, _since: "the oldest Pending job has waited less than the threshold",
)
def oldest_pending(ctx: Context, threshold: float) -> list[Finding]:
    pending = selectors.job_state_summary()[JobState.PENDING]
    age = pending.oldest_seconds
    if age is None or age <= threshold:
        return []
    return [
        Finding(
            "",
            f"the oldest Pending job has waited {age / 60:.0f} minutes",
            f"{pending.count} jobs Pending",
        )
    ]


@rule(
    "no-consumer",
    title="No consumer for a step",
    threshold=60.0,
    threshold_help="alert when no running consumer process has served a step of this "
    "deployment for this many seconds",
    sustained=True,
    cleared=lambda key, _since: f"a consumer process serves {key} again",
)
def no_consumer(ctx: Context, threshold: float) -> list[Finding]:
    if not _owned:
        return []
    served: set[str] = set()
    for process in zconsumers.consumers_list(ctx.zk):
        served.update(process.get("steps") or [])
    return [
        Finding(step, f"no consumer process serves {step}", "no registration lists the step")
        for step in _owned[0]()
        if step not in served and step != "alerts"
    ]


@rule(
    "zookeeper",
    title="ZooKeeper unreachable",
    threshold=30.0,
    threshold_help="alert when ZooKeeper has been unreachable for this many seconds",
    sustained=True,
    needs_zookeeper=False,
    cleared=lambda _key, _since: "ZooKeeper answers again",
)
def zookeeper_down(ctx: Context, threshold: float) -> list[Finding]:
    if ctx.zk is not None and ctx.zk.connected:
        return []
    state = getattr(ctx.zk, "state", "not connected")
    return [Finding("", "ZooKeeper is unreachable", f"the connection is {state}")]


@rule(
    "database",
    title="Database unreachable",
    threshold=30.0,
    threshold_help="alert when the console's database has been unreachable for this many seconds",
    sustained=True,
    needs_zookeeper=False,
    cleared=lambda _key, _since: "the database answers again",
)
def database_down(ctx: Context, threshold: float) -> list[Finding]:
    problem = database_probe.problem()
    return [Finding("", "the database is unreachable", problem)] if problem else []


@rule(
    "retention",
    title="Retention behind",
    threshold=86400.0,
    threshold_help="alert when a finished batch is still in ZooKeeper this many seconds after "
    "it was due to be archived (MRT_RETENTION_DAYS)",
    cleared=lambda _key, _since: "no finished batch is overdue for archiving",
)
def retention_behind(ctx: Context, threshold: float) -> list[Finding]:
    due = ctx.now - archive.retention_age() - timedelta(seconds=threshold)
    due_ms = due.timestamp() * 1000
    late = sorted(
        bid
        for bid, b in zindex.for_client(ctx.zk).batch_states().items()
        if b.state in archive.FINISHED and b.mtime_ms < due_ms
    )
    if not late:
        return []
    return [
        Finding(
            "",
            f"{len(late)} finished batches are overdue for archiving",
            f"is the retention daemon running? {_examples(late)}",
        )
    ]


class DatabaseProbe:
    """Whether the database answers, within ``PROBE_BUDGET``: a query on a database that does
    not answer (a stopped server, a lost network) would otherwise hold the evaluator, and no
    other rule would be looked at. One probe at a time, in a thread with its own connection."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._future: Future[None] | None = None

    def _run(self, future: Future[None]) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(None)
        finally:
            connection.close()

    def problem(self) -> str:
        """ "" when the database answered, else what went wrong."""
        with self._lock:
            if self._future is None or self._future.done():
                self._future = Future()
                threading.Thread(
                    target=self._run, args=(self._future,), name="alerts-db-probe", daemon=True
                ).start()
            future = self._future
        try:
            future.result(timeout=PROBE_BUDGET)
        except FutureTimeout:
            return f"no answer within {PROBE_BUDGET:g} s"
        except Exception as exc:
            return " ".join((str(exc) or type(exc).__name__).split())[:300]
        return ""


database_probe = DatabaseProbe()
