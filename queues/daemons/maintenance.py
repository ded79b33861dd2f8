"""Maintenance windows: a hold (queue, collection or storage node) given an end is released
at that end, with what it parked (the batches an ingest hold parked, a collection's Held jobs
and batches), by whichever of the running ``maintenance`` daemons gets there first.

Exactly once across hosts: the window and its hold are deleted in one transaction checked
against the window's version (``queues/zk/maintenance.py``), so only one daemon's release
succeeds, and only that one writes the audit entry. It claims nothing else and takes no lock.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from datetime import datetime, timedelta
from typing import Any, ClassVar

from django.conf import settings

from queues.core.clock import clock_text
from queues.daemons.alert_rules import Context, Finding, rule
from queues.daemons.base import ItemResult, PeriodicDaemon, describe
from queues.daemons.breakers import BREAKER, breakers
from queues.models import AuditEntry
from queues.operator import audit
from queues.services import hold_moves
from queues.zk.errors import StoppedPartway
from queues.zk.maintenance import (
    NODE_HOLDS,
    RELEASING,
    SERVICE_HOLDS,
    WINDOWS,
    FolderWatch,
    Window,
    due,
    finish_release,
    node_holds,
    overrun,
    parks,
    release_window,
    service_holds,
    take_release,
    unfinished_releases,
    windows,
)

log = logging.getLogger("queues.daemons")

EVERY_SECONDS = 1.0  # how often the windows are read (a handful of small nodes)


class Maintenance(PeriodicDaemon):
    name: ClassVar[str] = "maintenance"
    step: ClassVar[str] = "maintenance"
    round_name: ClassVar[str] = "look at the windows"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Releases whose record this process's end did not delete (``_end_release``): their
        # lock is this session's, so no other daemon takes them over, and a later window of
        # the same hold waits for them.
        self._unended: dict[str, Window] = {}
        # Whether there are windows, releases and holds at all, kept by watches: an idle
        # queue has none, and a round then reads nothing (made at the first connected round).
        self._folders: FolderWatch | None = None

    def _watched(self) -> FolderWatch | None:
        if self._folders is None:
            with contextlib.suppress(Exception):  # ZooKeeper away: this round reads as before
                self._folders = FolderWatch(
                    self.zk, (WINDOWS, RELEASING, NODE_HOLDS, SERVICE_HOLDS)
                )
        return self._folders

    def sweep(self) -> list[Window]:
        """Release every window past its end that this process wins, after ending the records
        of its own releases that failed to end and finishing the releases a stopped daemon
        left unfinished; those it released or finished."""
        for window in list(self._unended.values()):
            self._end_release(window)
        released: list[Window] = []
        folders = self._watched()
        if folders is not None and folders.empty(WINDOWS, RELEASING):
            return released
        for window in unfinished_releases(self.zk):
            if take_release(self.zk, window):
                released.append(window)
                self.released(window, taken_over=True)
        for window in due(self.zk):
            if release_window(self.zk, window):
                released.append(window)
                self.released(window)
        return released

    def released(self, window: Window, *, taken_over: bool = False) -> None:
        """What the hold parked goes on, and the release is audited (by the winner only, or by
        the daemon that finished it: ``taken_over``). The release's record
        (``release_window``) is ended last: should this process stop before, another daemon
        lets the parked items go."""
        parked = []
        stopped = ""
        try:
            if window.kind == "queue" and window.name == "ingest" and taken_over:
                # Not the hold: it may be an operator's own, placed since.
                parked = hold_moves.ingest_release_parked()
            elif window.kind == "queue" and window.name == "ingest":
                parked = hold_moves.queue_release(name="ingest", release_held=True)[1:]
            elif window.kind == "collection":
                parked = hold_moves.collection_release_held(profile=window.name)
        except StoppedPartway as exc:  # some released: said in the entry; the rest by hand
            stopped = f"; {exc}"
            log.warning("%s %s: parked items not all released: %s", window.kind, window.name, exc)
        except Exception as exc:  # the hold is released; what it parked can be released by hand
            log.warning("%s %s: parked items not released: %s", window.kind, window.name, exc)
        moved = sum(o.before != o.after for o in parked)
        left = len(parked) - moved  # a session holds them (``hold_moves.SESSION_HOLDS``)
        detail = f"maintenance window ended at {clock_text(window.until)}"
        if taken_over:
            detail += " (the daemon that ended it stopped before it released what it parked)"
        if moved:
            detail += f"; released {moved} item(s) it had parked"
        if left:
            detail += f"; {left} held item(s) left alone: a session holds them"
        detail += stopped
        made = audit.entry(
            user=None,
            action="release",
            kind=window.kind,
            item_id=window.name,
            before="held",
            after="released",
            reason=window.reason,
            detail=f"{detail}, by the maintenance daemon on {socket.gethostname()}",
            via="daemon",
        )
        try:
            # A database outage keeps the entry: a later round writes it once it answers.
            audit.write_or_keep([made])
        except Exception as exc:  # the release stands; the log line says what the entry would
            log.warning("release of %s %s not audited: %s", window.kind, window.name, exc)
        if parks(window):
            self._unended[window.key] = window
            self._end_release(window)
        log.info(
            "%s:%s maintenance released (%s; window by %s: %s)",
            window.kind,
            window.name,
            detail,
            window.by or "?",
            window.reason or "no reason given",
        )

    def _end_release(self, window: Window) -> None:
        """End the record of a release this process let the parked items of go; one that does
        not end now is tried again at the next round."""
        try:
            finish_release(self.zk, window)
        except Exception as exc:
            log.warning(
                "release of %s %s not ended (again next round): %s",
                window.kind,
                window.name,
                describe(exc),
            )
            return
        self._unended.pop(window.key, None)

    def run_once(self) -> bool:
        self.last = None
        if not self.gate.connected:
            return False
        started = time.monotonic()
        audit.write_kept_if_answering()  # entries an outage kept, this process's breakers' too
        released = self.sweep()
        folders = self._watched()
        none_held = folders is not None and folders.empty(NODE_HOLDS, SERVICE_HOLDS)
        closed = breakers().probe(self.zk, none_held=none_held)
        self.last = ItemResult(
            "windows",
            self.step,
            "ok",
            time.monotonic() - started,
            f"{len(released)} released, {len(closed)} breaker(s) closed",
        )
        return bool(released or closed)

    def every(self) -> float:
        return EVERY_SECONDS

    def tick(self) -> bool:
        self.run_once()
        return self.last is not None


# Alert rules on holds (queues/daemons/alert_rules.py) ---------------------------------------


@rule(
    "hold-overrun",
    title="Maintenance hold overrun",
    threshold=300.0,
    threshold_help="alert when a hold is still in place this many seconds after its "
    "maintenance window's end",
    cleared=lambda key, _since: (
        f"the {key.partition(':')[0]} hold of {key.partition(':')[2]} "
        "is no longer in place past its end"
    ),
)
def hold_overrun(ctx: Context, threshold: float) -> list[Finding]:
    found = []
    for w in overrun(ctx.zk, timedelta(seconds=threshold), ctx.now):
        late = (ctx.now - w.until).total_seconds() / 60
        how = "releases itself" if w.auto_release else "is released by hand"
        found.append(
            Finding(
                w.key,
                f"the {w.kind} hold of {w.name} ran {late:.0f} minutes past its end",
                f"its window ended at {clock_text(w.until, 'minutes')} and {how}; "
                f"{'no maintenance daemon released it' if w.auto_release else 'nobody has'}"
                f" (set by {w.by or '?'}: {w.reason or 'no reason given'})",
            )
        )
    return found


def _node_released(key: str, since: datetime) -> str:
    """What resolved a node-held alert: the node's hold is gone, and who released it."""
    said = f"storage node {key} is no longer held"
    entry = (
        AuditEntry.objects.filter(kind="node", item_id=key, action="release", ok=True)
        .order_by("-at", "-id")
        .first()
    )
    if entry is None or entry.at < since:
        return said
    who = entry.username or ("its breaker" if entry.via == "daemon" else entry.via)
    return f"{said}: released by {who} at {clock_text(entry.at)}"


@rule(
    "node-held",
    title="Storage node held",
    threshold=0.0,
    threshold_help="alert when a storage node has been held by its breaker, or with no reason "
    "given, for this many seconds (an operator's own hold: after MRT_ALERT_HAND_HOLD_AFTER "
    "seconds, and not while its maintenance window runs)",
    sustained=True,
    cleared=_node_released,
)
def node_held_rule(ctx: Context, threshold: float) -> list[Finding]:
    """A breaker's hold and a hold nobody explained page at once; an operator's own hold is
    what the operator meant, and pages only when it has lasted ``MRT_ALERT_HAND_HOLD_AFTER``
    seconds (a forgotten hold) without a maintenance window (``hold-overrun`` watches those)."""
    hand_after = float(settings.MRT_ALERT_HAND_HOLD_AFTER)
    in_window = {w.name for w in windows(ctx.zk) if w.kind == "node"}
    found = []
    for n, h in node_holds(ctx.zk).items():
        held_for = (ctx.now - h.at).total_seconds() if h.at else 0.0
        wait = "its jobs wait before Storing and Recording"
        reason = h.reason or "no reason given"
        if h.by == BREAKER:
            summary = f"storage node {n} is held by its breaker ({reason}): {wait}"
        elif h.by and h.reason:
            if str(n) in in_window or held_for < hand_after:
                continue
            summary = (
                f"storage node {n} has been held by {h.by} for {_duration(held_for)} "
                f"({reason}) and is not released: {wait}"
            )
        else:
            summary = f"storage node {n} is held by {h.by or 'nobody recorded'} ({reason}): {wait}"
        found.append(
            Finding(
                str(n),
                summary,
                f"held since {clock_text(h.at)} by {h.by or '?'}: {reason}",
                link="/holds/",
            )
        )
    return found


def _duration(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours} h {rest // 60} min" if hours else f"{rest // 60} min"


# The steps that wait while a service outside is held (``services_of`` of each step's daemon).
WAITING_STEPS = {
    "inventory": "Recording",
    "ezid": "Processing",
    "depositor": "Estimating and Downloading",
    "callback": "Notify",
}


@rule(
    "service-held",
    title="Service outside held",
    threshold=0.0,
    threshold_help="alert when inventory, EZID, or a depositor's or callback receiver's server "
    "has been held by its breaker, or with no reason given, for this many seconds (an "
    "operator's own hold: after MRT_ALERT_HAND_HOLD_AFTER seconds)",
    sustained=True,
)
def service_held_rule(ctx: Context, threshold: float) -> list[Finding]:
    """As ``node-held``: a breaker's hold pages at once, an operator's own hold only once it has
    lasted ``MRT_ALERT_HAND_HOLD_AFTER`` seconds."""
    hand_after = float(settings.MRT_ALERT_HAND_HOLD_AFTER)
    found = []
    for service, h in service_holds(ctx.zk).items():
        held_for = (ctx.now - h.at).total_seconds() if h.at else 0.0
        if h.by != BREAKER and h.by and h.reason and held_for < hand_after:
            continue
        reason = h.reason or "no reason given"
        who = "its breaker" if h.by == BREAKER else (h.by or "nobody recorded")
        found.append(
            Finding(
                service,
                f"{service} is held by {who} ({reason}): its jobs wait before "
                f"{WAITING_STEPS[service.split(' ', 1)[0]]}",
                f"held since {clock_text(h.at)} by {h.by or '?'}: {reason}",
                link="/holds/",
            )
        )
    return found
