"""Why jobs wait: every hold with its reason, who placed it and until when, and the jobs each
hold or cap keeps waiting in each step (issue 53).

What keeps a job from moving on, as the consumers decide it:

- the ingest queue held: no job step claims anything (``JobDaemon.queue_hold``);
- its collection held: the Pending step moves it to Held (``job_pending``);
- its collection at its cap: the Pending step leaves it unclaimed (``queues/zk/caps.py``);
- its storage node held (by an operator, or by the node's breaker): Storing and Recording leave
  it unclaimed (``queues/daemons/storing.py``).

Reads: the holds (markers, records, windows, node holds: a handful of round trips), the caps,
and from the read index the Pending jobs per collection, the in-flight jobs per collection and,
only while a storage node is held, the Storing and Recording jobs per node (each job's node
read once while it stays in the state). Nothing here walks the queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from queues.core import clock
from queues.core.clock import clock_text
from queues.core.states import JOB_STEPS, JOB_WORKING, JobState
from queues.zk import caps as zcaps
from queues.zk import index as zindex
from queues.zk.client import connected_client
from queues.zk.locks import holds_list
from queues.zk.maintenance import (
    BREAKER,
    hold_records,
    job_store_node,
    node_holds,
    windows,
)
from queues.zk.records import Job

WAITING = JOB_STEPS[:-1]  # Pending .. Notify: the steps a job waits in
NODE_STEPS = (JobState.STORING, JobState.RECORDING)  # where a held node's jobs wait
QUEUE = "ingest"  # the queue hold every job step honours


@dataclass(frozen=True)
class Hold:
    """One hold now in place, with what is known of it."""

    kind: str  # queue | collection | node
    name: str
    since: datetime | None
    by: str = ""
    reason: str = ""
    until: datetime | None = None  # its maintenance window's end
    auto_release: bool = True

    @property
    def breaker(self) -> bool:
        return self.kind == "node" and self.by == BREAKER

    @property
    def what(self) -> str:
        if self.kind == "queue":
            return f"{self.name} queue"
        return f"{self.kind} {self.name}"

    @property
    def detail(self) -> str:
        """``disk swap, by alice, since 2026-12-02 07:51 PST, until 2026-12-02 09:00 PST``."""
        parts = [self.reason or "no reason given"]
        if self.by and not self.breaker:
            parts.append(f"by {self.by}")
        if self.since is not None:
            parts.append(f"since {clock_text(self.since, 'minutes')}")
        if self.until is not None:
            verb = "until" if self.auto_release else "planned to end"
            parts.append(f"{verb} {clock_text(self.until, 'minutes')}")
        return ", ".join(parts)

    @property
    def words(self) -> str:
        """What a job kept by this hold is waiting for, in a few words."""
        if self.breaker:
            return f"waiting for a breaker: node {self.name}"
        if self.kind == "node":
            return f"blocked: node {self.name} held"
        return f"held: {self.what}"

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "since": clock.exact(self.since) if self.since else None,
            "by": self.by,
            "reason": self.reason,
            "until": clock.exact(self.until) if self.until else None,
            "auto_release": self.auto_release,
            "breaker": self.breaker,
            "words": self.words,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class CapFigure:
    """A collection's cap in one figure: its jobs in flight now (from the read index) against
    its limit. The cap's own count (its markers) may stay above this for a moment after a job
    completes; the Pending step verifies it before it keeps a job waiting."""

    profile: str
    limit: int
    in_flight: int
    by: str = ""
    reason: str = ""
    since: datetime | None = None

    @property
    def full(self) -> bool:
        return self.in_flight >= self.limit

    @property
    def figure(self) -> str:
        return f"{self.in_flight}/{self.limit}"

    @property
    def plain(self) -> str:
        """``7 of 10 in flight`` / ``10 of 10 in flight, at its cap``."""
        text = f"{self.in_flight} of {self.limit} in flight"
        if self.in_flight > self.limit:
            return f"{text}, over its cap (jobs resumed or moved by others)"
        return f"{text}, at its cap" if self.full else text

    @property
    def words(self) -> str:
        return f"capped: {self.profile} {self.figure}"

    @property
    def detail(self) -> str:
        parts = [self.plain]
        if self.reason:
            parts.append(self.reason)
        if self.by:
            parts.append(f"by {self.by}")
        if self.since is not None:
            parts.append(f"since {clock_text(self.since, 'minutes')}")
        return ", ".join(parts)

    def as_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "limit": self.limit,
            "in_flight": self.in_flight,
            "full": self.full,
            "words": self.words,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Wait:
    """``jobs`` jobs in ``state`` that wait for one hold or cap."""

    state: str
    jobs: int
    hold: Hold | None = None
    cap: CapFigure | None = None

    @property
    def kind(self) -> str:
        if self.cap is not None:
            return "cap"
        assert self.hold is not None
        return "breaker" if self.hold.breaker else self.hold.kind

    @property
    def words(self) -> str:
        return self.cap.words if self.cap is not None else self.hold.words if self.hold else ""

    @property
    def detail(self) -> str:
        return self.cap.detail if self.cap is not None else self.hold.detail if self.hold else ""

    def as_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "jobs": self.jobs,
            "kind": self.kind,
            "words": self.words,
            "detail": self.detail,
            "hold": self.hold.as_json() if self.hold else None,
            "cap": self.cap.as_json() if self.cap else None,
        }


@dataclass(frozen=True)
class Holds:
    """Every hold now in place, by kind and name."""

    queues: dict[str, Hold]
    collections: dict[str, Hold]
    nodes: dict[int, Hold]

    def all(self) -> list[Hold]:
        return [*self.queues.values(), *self.collections.values(), *self.nodes.values()]


def holds_now(zk: Any = None) -> Holds:
    """Every hold with its reason, author and end: the markers' times, the records the console
    keeps beside queue and collection holds, the node holds' own fields, the windows."""
    zk = zk or connected_client()
    markers = holds_list(zk)
    records = hold_records(zk)
    ends = {(w.kind, w.name): w for w in windows(zk)}

    def make(kind: str, name: str, since: datetime | None, by: str, reason: str) -> Hold:
        window = ends.get((kind, name))
        record = records.get((kind, name))
        if record is not None:
            by, reason = record.by or by, record.reason or reason
        if window is not None:
            by, reason = by or window.by, reason or window.reason
        return Hold(
            kind=kind,
            name=name,
            since=since,
            by=by,
            reason=reason,
            until=window.until if window else None,
            auto_release=window.auto_release if window else True,
        )

    return Holds(
        queues={
            q: make("queue", q, since, "", "")
            for q, since in markers.queues.items()
            if since is not None
        },
        collections={
            c: make("collection", c, since, "", "") for c, since in markers.collections.items()
        },
        nodes={n: make("node", str(n), h.at, h.by, h.reason) for n, h in node_holds(zk).items()},
    )


def cap_figures(zk: Any = None, idx: Any = None) -> dict[str, CapFigure]:
    """Every cap as one figure: jobs in flight from the read index against the limit."""
    zk = zk or connected_client()
    found = zcaps.caps(zk)
    if not found:
        return {}
    idx = idx or zindex.for_client(zk)
    flying: dict[str, int] = {}
    for state in JOB_WORKING:
        for profile, n in idx.profile_counts_so_far(state).items():
            if profile in found:
                flying[profile] = flying.get(profile, 0) + n
    return {
        p: CapFigure(
            profile=p,
            limit=c.limit,
            in_flight=flying.get(p, 0),
            by=c.by,
            reason=c.reason,
            since=c.at,
        )
        for p, c in found.items()
    }


def waits(*, holds: Holds | None = None, figures: dict[str, CapFigure] | None = None) -> list[Wait]:
    """The jobs each hold or cap keeps waiting now, per step, the first cause first (a job is
    counted once: under the ingest queue's hold when it is held)."""
    zk = connected_client()
    idx = zindex.for_client(zk)
    holds = holds if holds is not None else holds_now(zk)
    counts = idx.job_counts_now() if idx.filling else {s: idx.job_count(s) for s in WAITING}
    queue = holds.queues.get(QUEUE)
    if queue is not None:
        return [Wait(s, n, hold=queue) for s in WAITING if (n := counts.get(s) or 0)]
    found: list[Wait] = []
    if counts.get(JobState.PENDING):
        figures = figures if figures is not None else cap_figures(zk, idx)
        full = {n: f for n, f in sorted(figures.items()) if f.full}
        # The Pending jobs per collection only when a hold or a full cap can keep some: at a
        # million Pending jobs that count reads every job's collection once.
        pending = idx.profile_counts_so_far(JobState.PENDING) if holds.collections or full else {}
        for name, hold in holds.collections.items():
            if pending.get(name):
                found.append(Wait(JobState.PENDING, pending[name], hold=hold))
        for name, figure in full.items():
            if pending.get(name) and name not in holds.collections:
                found.append(Wait(JobState.PENDING, pending[name], cap=figure))
    if holds.nodes:
        for state in NODE_STEPS:
            if not counts.get(state) or idx.filling:
                continue
            per_node = idx.store_node_counts(state)
            for node, hold in holds.nodes.items():
                if per_node.get(node):
                    found.append(Wait(state, per_node[node], hold=hold))
    return found


def job_wait(job: Job) -> Wait | None:
    """What keeps this one job waiting now, if a hold or cap does."""
    if job.state not in WAITING:
        return None
    zk = connected_client()
    holds = holds_now(zk)
    queue = holds.queues.get(QUEUE)
    if queue is not None:
        return Wait(job.state, 1, hold=queue)
    if job.state == JobState.PENDING and job.profile:
        if job.profile in holds.collections:
            return Wait(job.state, 1, hold=holds.collections[job.profile])
        figure = cap_figures(zk).get(job.profile)
        if figure is not None and figure.full:
            return Wait(job.state, 1, cap=figure)
    if job.state in NODE_STEPS:
        node = job_store_node(job)
        if node is not None and node in holds.nodes:
            return Wait(job.state, 1, hold=holds.nodes[node])
    return None


def by_state(found: list[Wait]) -> dict[str, list[Wait]]:
    grouped: dict[str, list[Wait]] = {}
    for wait in found:
        grouped.setdefault(wait.state, []).append(wait)
    return grouped
