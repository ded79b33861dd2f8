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

An outage (the database away or locked, ZooKeeper unreachable) does not fail a run: it stops
between two items with the reason on its page, still owned by its daemon, which takes it up
again where it stopped once the outage is over. Progress and the audit of the item moved last
that the database could not take are kept in this process meanwhile, so no item is done twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import close_old_connections, transaction
from django.utils import timezone

from queues.core import transient
from queues.models import BulkRun, db_now
from queues.operator import actions, audit
from queues.operator.auth import require_action
from queues.services import moves
from queues.zk.client import connected_client
from queues.zk.errors import DomainError, is_connection_error

log = logging.getLogger("queues.bulk")

# How often a working daemon records its progress (and so proves it is alive).
SAVE_EVERY = 0.5
LOST = "lost"  # _advance: another daemon continued the run


@dataclass
class _Progress:
    """A run as this process holds it: its progress may be ahead of the database's copy, and
    the item it moved last may not be audited yet (the database failed under the audit)."""

    run: BulkRun
    unaudited: list[moves.Outcome] = field(default_factory=list)
    done_as: Any = None  # the user the unaudited move was made as


# Runs an outage stopped with progress the database does not have yet, by pk: the daemon that
# owns the run takes it up again from here, so no item is done a second time.
_unsaved: dict[int, _Progress] = {}
_unsaved_lock = threading.Lock()


class Interrupted(Exception):
    """An outage stopped the run between two items; it stays running and owned, with the
    reason in its ``error``, and ``work`` takes it up there once the outage is over."""


def outage_reason(exc: BaseException) -> str | None:
    """Why ``exc`` is an outage that waiting cures (the database away or locked, ZooKeeper
    unreachable), or None for anything else."""
    if transient.is_transient(exc):
        return transient.reason(exc)
    if is_connection_error(exc):
        detail = " ".join((str(exc).strip() or type(exc).__name__).split())
        return f"ZooKeeper unavailable: {detail}"
    return None


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
    params: dict[str, Any] | None = None,
) -> BulkRun:
    """Record the run for a bulk-runs daemon to claim; the role and reason are checked first.
    ``params`` go to the action with every item (a resume's chosen step "to")."""
    actions.check_bulk(user=user, kind=kind, action=action, reason=reason)
    # The run and its line in the log both or neither: a daemon never does a run nobody audited.
    with transaction.atomic():
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
            params=params or {},
        )
        # One line in the audit log for the run; its items' entries are folded under it.
        audit.record(
            user=user,
            # Not the action's own name: counting an action's entries counts its items, as before.
            action=f"bulk-{action}"[:40],
            kind="bulk",
            item_id=str(run.pk),
            reason=run.reason,
            detail=f"{run.total} {kind}s in the background ({group_of(run)})",
            via=via,
        )
    return run


def group_of(run: BulkRun) -> str:
    """What begins the detail of every audit entry of the run's items."""
    return f"bulk run #{run.pk}"


def resume(run: BulkRun, *, user: Any) -> bool:
    """Continue an interrupted or failed run from its first item not handled, as ``user``;
    False when there is nothing to continue (still alive, finished, or just taken over by
    another request)."""
    if not run.resumable:
        return False
    taken = BulkRun.objects.filter(pk=run.pk, state=run.state, heartbeat=run.heartbeat).update(
        state=BulkRun.RUNNING,
        heartbeat=db_now(),
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
        taken = BulkRun.objects.filter(
            pk=pk, state=BulkRun.RUNNING, owner="", heartbeat=heartbeat
        ).update(owner=owner, heartbeat=db_now())
        if taken:
            with _unsaved_lock:
                # Progress an earlier owner here kept through an outage is not this claim's.
                _unsaved.pop(pk, None)
            return BulkRun.objects.get(pk=pk)
    return None


def work(pk: int) -> None:
    """Handle the run's remaining items, saving progress every SAVE_EVERY seconds.

    An outage ends it with ``Interrupted`` (raised from the outage's own error): the run stays
    running with the reason shown, and its progress is kept here when the database cannot take
    it, for the next ``work(pk)`` of its daemon. Anything else fails the run."""
    try:
        progress = _taken_up(pk)
        if progress is None:
            return
        run = progress.run
        try:
            ended = _advance(progress)
        except Exception as exc:
            why = outage_reason(exc)
            if why is None:
                # Not an item's refusal (those are skips): a bug, or a record that cannot be read.
                log.exception("bulk run %s stopped at item %s of %s", pk, run.position, run.total)
                run.state, run.error = BulkRun.FAILED, str(exc) or type(exc).__name__
            elif _keep(progress, why):
                raise Interrupted(_waits(run)) from exc
            else:
                return
        else:
            if ended == LOST:
                log.warning("bulk run %s was taken over by another process", pk)
                return
            run.state, run.error = ended, ""
        run.finished = timezone.now()
        try:
            _save(run, final=True)
        except Exception as exc:
            why = outage_reason(exc)
            if why is None:
                raise
            run.state, run.finished = BulkRun.RUNNING, None
            _keep(progress, why)
            raise Interrupted(_waits(run)) from exc
    finally:
        close_old_connections()


def _waits(run: BulkRun) -> str:
    return f"bulk run {run.pk} waits at item {run.position + 1} of {run.total}"


def _taken_up(pk: int) -> _Progress | None:
    """The run as this process left it if an outage kept its progress here (saved now, to
    learn that it is still this daemon's), else as the database has it; None when it was
    stopped or taken over meanwhile."""
    with _unsaved_lock:
        progress = _unsaved.pop(pk, None)
    if progress is None:
        return _Progress(BulkRun.objects.get(pk=pk))
    try:
        owned = _save(progress.run)
    except Exception:
        with _unsaved_lock:
            _unsaved.setdefault(pk, progress)
        raise
    if not owned:
        _end_unowned(progress.run)
        return None
    return progress


def _keep(progress: _Progress, why: str) -> bool:
    """Show the outage on the run and keep its progress: saved, or held here while the database
    cannot take it. False when the run was stopped or taken over meanwhile (then it is left)."""
    run = progress.run
    if not run.error:
        log.warning("%s: %s", _waits(run), why)
    run.error = f"waiting: {why}"
    try:
        owned = _save(run)
    except Exception as exc:
        if outage_reason(exc) is None:
            raise
    else:
        if not owned:
            _end_unowned(run)
            return False
        if not progress.unaudited:
            return True
    with _unsaved_lock:
        _unsaved[run.pk] = progress
    return True


def _end_unowned(run: BulkRun) -> None:
    """A run this process may no longer save: stopped meanwhile, or another daemon's now."""
    mine = BulkRun.objects.filter(pk=run.pk, heartbeat=run.heartbeat, state=BulkRun.RUNNING)
    if mine.exists():
        run.state, run.finished = BulkRun.STOPPED, timezone.now()
        _save(run, final=True)
    else:
        log.warning("bulk run %s was taken over by another process", run.pk)


def _advance(progress: _Progress) -> str:
    """Work through the items: FINISHED at the end, STOPPED when asked to stop, LOST when
    another daemon has taken the run over meanwhile (this one was thought dead)."""
    run = progress.run
    saved = time.monotonic()
    _audit(progress)
    while run.position < run.total:
        # Not one refusal per item while ZooKeeper is away: the run waits instead.
        connected_client()
        item_id, version = run.items[run.position]
        done_as = run.continued_by or run.user
        try:
            outcomes = actions.apply(
                user=done_as,
                kind=run.kind,
                action=run.action,
                item_id=item_id,
                expect_version=version,
                reason=run.reason,
                params=run.params or None,
                via=run.via,
            )
        except DomainError as exc:
            if is_connection_error(exc):
                raise
            run.skip(item_id, str(exc))
        else:
            run.done += 1
            progress.unaudited, progress.done_as = outcomes, done_as
        run.position += 1
        run.error = ""  # going again after an outage: the page stops showing it
        _audit(progress)
        if time.monotonic() - saved >= SAVE_EVERY:
            if not _save(run):
                return _unowned(run)
            saved = time.monotonic()
    return BulkRun.FINISHED


def _unowned(run: BulkRun) -> str:
    mine = BulkRun.objects.filter(pk=run.pk, heartbeat=run.heartbeat)
    return BulkRun.STOPPED if mine.exists() else LOST


def _audit(progress: _Progress) -> None:
    """Write the audit entries of the item moved last, if they are not written yet."""
    if not progress.unaudited:
        return
    run = progress.run
    actions.audit_outcomes(
        progress.unaudited,
        user=progress.done_as,
        action=run.action,
        reason=run.reason,
        via=run.via,
        group=group_of(run),
    )
    progress.unaudited = []


def _save(run: BulkRun, *, final: bool = False) -> bool:
    """Write the progress if this daemon still owns the run (the heartbeat it last wrote is
    still there) and, unless ``final``, nobody asked it to stop; the new heartbeat proves it
    alive. The heartbeat is the database server's time (``db_now``), which the web process that
    judges it "interrupted" reads too, whatever either host's own clock says."""
    now = db_now()
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
