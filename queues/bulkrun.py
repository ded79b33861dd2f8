"""Long bulk actions run in the background, with a progress line the operator can watch.

A bulk action over more than ``MRT_BULK_INLINE_MAX`` items (say "resume every Failed job",
8,000 of them) would hold one web request for minutes with nothing to show. Instead it becomes a
``BulkRun``: its items and progress are kept in the database, and the ``bulk-runs`` consumer
daemon (``runconsumer bulk-runs``, part of ``all``; queues/daemons/bulk_runs.py) claims it and
works through it (each item exactly as ``actions.perform`` does it, audited one by one) while the
page ``/bulk/N/`` shows how far it got. The web process only records the run, so restarting the
web process loses nothing.

A run waits (``owner`` empty) until a daemon claims it. A run whose daemon died (a restart, a
crash) stops sending heartbeats; its page then says it was interrupted and offers to continue
from the first item not yet handled, which hands it to a daemon again. Every item is
version-checked or refused by the state machine, so an item handled twice is a skip, never a
second move.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from django.db import close_old_connections
from django.utils import timezone

from queues import actions
from queues.auth import require_action
from queues.models import BulkRun
from queues.zk.errors import DomainError

log = logging.getLogger("queues.bulk")

# How often a working daemon records its progress (and so proves it is alive).
SAVE_EVERY = 0.5
LOST = "lost"  # _advance: another daemon continued the run


def start(
    *,
    user: Any,
    kind: str,
    action: str,
    items: Sequence[tuple[str, int | None]],
    reason: str = "",
    limited: bool = False,
    back: str = "",
    via: str = "web",
) -> BulkRun:
    """Record the run for a bulk-runs daemon to claim; the role and reason are checked first."""
    actions.check_bulk(user=user, kind=kind, action=action, reason=reason)
    run = BulkRun.objects.create(
        user=user,
        kind=kind,
        action=action,
        reason=reason.strip(),
        items=[[item_id, version] for item_id, version in items],
        total=len(items),
        limited=limited,
        back=back,
        via=via,
    )
    return run


def resume(run: BulkRun, *, user: Any) -> bool:
    """Continue an interrupted or failed run from its first item not handled, as ``user``;
    False when there is nothing to continue (still alive, finished, or just taken over by
    another request)."""
    if not run.resumable:
        return False
    taken = BulkRun.objects.filter(pk=run.pk, state=run.state, heartbeat=run.heartbeat).update(
        state=BulkRun.RUNNING,
        heartbeat=timezone.now(),
        error="",
        finished=None,
        stop_requested=False,
        continued_by=user,
        owner="",  # for a daemon to claim
    )
    return bool(taken)


def stop(run: BulkRun) -> bool:
    """Ask a running run to stop after its current item (it can be continued later); an
    interrupted one is marked stopped at once. False when it is not running."""
    if not run.stoppable:
        return False
    running = BulkRun.objects.filter(pk=run.pk, state=BulkRun.RUNNING)
    if run.interrupted or run.waiting:
        # No daemon to obey a request: the run is stopped here (unless claimed meanwhile).
        stopped = running.filter(heartbeat=run.heartbeat, owner=run.owner)
        return bool(stopped.update(state=BulkRun.STOPPED, finished=timezone.now()))
    return bool(running.update(stop_requested=True))


VERBS = ("stop", "continue")


def control(run: BulkRun, verb: str, *, user: Any) -> bool:
    """The run's two buttons, for someone allowed the run's action: ``stop`` or ``continue``.

    False when there is nothing to do (the run has ended, or is going already)."""
    require_action(user, run.kind, run.action)
    if verb == "stop":
        return stop(run)
    if verb == "continue":
        return resume(run, user=user)
    raise ValueError(f"a bulk run can only {' or '.join(VERBS)}, not {verb!r}")


def claim(owner: str) -> BulkRun | None:
    """The oldest waiting run, now ``owner``'s; None when none waits. Several daemons may ask
    at once: the update that takes a run checks it is still unclaimed, so only one gets it."""
    for pk, heartbeat in (
        BulkRun.objects.filter(state=BulkRun.RUNNING, owner="")
        .order_by("started", "id")
        .values_list("pk", "heartbeat")[:10]
    ):
        now = timezone.now()
        taken = BulkRun.objects.filter(
            pk=pk, state=BulkRun.RUNNING, owner="", heartbeat=heartbeat
        ).update(owner=owner, heartbeat=now)
        if taken:
            return BulkRun.objects.get(pk=pk)
    return None


def work(pk: int) -> None:
    """Handle the run's remaining items, saving progress every SAVE_EVERY seconds."""
    try:
        run = BulkRun.objects.get(pk=pk)
        try:
            ended = _advance(run)
            if ended == LOST:
                log.warning("bulk run %s was taken over by another process", pk)
                return
            run.state = ended
        except Exception as exc:
            # Not an item's refusal (those are skips): ZooKeeper gone, the database, a bug.
            log.exception("bulk run %s stopped at item %s of %s", pk, run.position, run.total)
            run.state, run.error = BulkRun.FAILED, str(exc) or type(exc).__name__
        run.finished = timezone.now()
        _save(run, final=True)
    finally:
        close_old_connections()


def _advance(run: BulkRun) -> str:
    """Work through the items: FINISHED at the end, STOPPED when asked to stop, LOST when
    another daemon has taken the run over meanwhile (this one was thought dead)."""
    saved = time.monotonic()
    while run.position < run.total:
        item_id, version = run.items[run.position]
        try:
            actions.perform(
                user=run.continued_by or run.user,
                kind=run.kind,
                action=run.action,
                item_id=item_id,
                expect_version=version,
                reason=run.reason,
                via=run.via,
            )
            run.done += 1
        except DomainError as exc:
            run.skip(item_id, str(exc))
        run.position += 1
        if time.monotonic() - saved >= SAVE_EVERY:
            if not _save(run):
                mine = BulkRun.objects.filter(pk=run.pk, heartbeat=run.heartbeat)
                return BulkRun.STOPPED if mine.exists() else LOST
            saved = time.monotonic()
    return BulkRun.FINISHED


def _save(run: BulkRun, *, final: bool = False) -> bool:
    """Write the progress if this daemon still owns the run (the heartbeat it last wrote is
    still there) and, unless ``final``, nobody asked it to stop; the new heartbeat proves it
    alive."""
    now = timezone.now()
    rows = BulkRun.objects.filter(pk=run.pk, heartbeat=run.heartbeat)
    if not final:
        # A stop asked for, or one made outright while the run looked interrupted (its item in
        # hand took longer than STALE_AFTER): either way this daemon goes no further.
        rows = rows.filter(stop_requested=False, state=BulkRun.RUNNING)
    owned = rows.update(
        position=run.position,
        done=run.done,
        skips=run.skips,
        reasons=run.reasons,
        skipped=run.skipped,
        state=run.state,
        error=run.error,
        finished=run.finished,
        heartbeat=now,
    )
    if owned:
        run.heartbeat = now
    return bool(owned)
