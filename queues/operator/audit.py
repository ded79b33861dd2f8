"""Writing and reading the audit log of operator actions (its table and the API tokens' are in
queues/models.py).

Queue state never lives here: an entry records what a person asked for and what ZooKeeper said,
so that "who deleted bid0000000042, and why?" has an answer after the batch is gone.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, close_old_connections, transaction

from queues.core import transient
from queues.models import ApiToken as ApiToken  # for the many importers of queues.operator.audit
from queues.models import AuditEntry

log = logging.getLogger(__name__)

# Entries of moves already made whose write met a database outage, oldest first: written before
# any other entry once the database answers (``write_kept``), never dropped. Each is logged as
# it is kept, so that a process that ends before the database is back leaves it in its log.
_kept: list[AuditEntry] = []
_kept_lock = threading.Lock()

# Whether the request (or task) in hand has changed something already: its answer to an outage
# met afterwards must not say that nothing was changed. Set by ``actions.perform``.
changed_here: ContextVar[bool] = ContextVar("changed_here", default=False)


def entry(
    *,
    user: Any,
    action: str,
    kind: str,
    item_id: str,
    before: str = "",
    after: str = "",
    reason: str = "",
    detail: str = "",
    ok: bool = True,
    via: str = "web",
) -> AuditEntry:
    """One audit entry, not written yet; its time is now, when it is made."""
    authenticated = user is not None and getattr(user, "is_authenticated", False)
    return AuditEntry(
        user=user if authenticated else None,
        username=user.get_username() if authenticated else "",
        action=action[:40],
        kind=kind[:20],
        item_id=item_id[:120],
        before=before[:40],
        after=after[:40],
        reason=reason,
        detail=detail,
        ok=ok,
        via=via,
    )


def _save(made: AuditEntry) -> None:
    try:
        with transaction.atomic(using=AuditEntry.objects.db):
            made.save(force_insert=True)
    except IntegrityError:
        if made.user_id is None:
            raise
        # Its user was removed while the entry was kept: the entry keeps the name.
        made.user = None
        made.save(force_insert=True)


def kept() -> list[AuditEntry]:
    """The entries kept through a database outage, not written yet (oldest first)."""
    with _kept_lock:
        return list(_kept)


def write_kept() -> int:
    """Write the entries kept through an outage, oldest first; how many. A database outage
    met on the way propagates, the entries not written yet kept still."""
    with _kept_lock:
        written = 0
        while _kept:
            _save(_kept[0])
            _kept.pop(0)
            written += 1
    if written:
        log.warning("wrote %d audit entries kept through a database outage", written)
    return written


def write_kept_if_answering() -> None:
    """``write_kept`` when some are kept, for a request or a daemon's round: while the
    database does not answer they stay kept and the caller goes on."""
    if not kept():
        return
    try:
        write_kept()
    except Exception as exc:
        if not transient.is_database_outage(exc):
            raise
        close_old_connections()  # a connection the outage broke: a new one next time


def writable() -> None:
    """Raise the database's outage now, before an action moves anything, when the database
    takes no write (away, or SQLite's write lock held by another writer past its busy timeout),
    so that no move is made that its entry cannot follow; entries kept from an earlier outage
    are written first. An update that matches no row is a write all the same: SQLite takes its
    write lock for it, PostgreSQL a connection that can write."""
    write_kept()
    with transaction.atomic(using=AuditEntry.objects.db):
        AuditEntry.objects.filter(pk__lt=0).update(ok=True)


def write_or_keep(entries: Iterable[AuditEntry]) -> list[AuditEntry]:
    """Write the entries of a move already made; those a database outage refuses are kept,
    logged, and written once the database answers (``write_kept``). Returns those kept."""
    entries = list(entries)
    for index, made in enumerate(entries):
        try:
            write_kept()
            _save(made)
        except Exception as exc:
            if not transient.is_database_outage(exc):
                raise
            refused = entries[index:]
            with _kept_lock:
                _kept.extend(refused)
            for one in refused:
                log.warning(
                    "audit entry kept until the database answers (%s): %s %s %s %s %s -> %s "
                    "by %r, reason %r: %s",
                    transient.reason(exc),
                    one.at.isoformat(),
                    one.action,
                    one.kind,
                    one.item_id,
                    one.before,
                    one.after,
                    one.username,
                    one.reason,
                    one.detail,
                )
            return refused
    return []


def record(**fields: Any) -> AuditEntry:
    """Write one audit entry (``entry``'s fields); refused attempts are recorded too, with
    ``ok=False``. Entries kept through an earlier outage are written first; an outage now
    propagates."""
    return write(entry(**fields))


def write(made: AuditEntry) -> AuditEntry:
    """Write ``made`` (an ``entry``), the entries kept through an earlier outage first; an
    outage propagates."""
    write_kept()
    _save(made)
    return made


# "retry 2; failed in Downloading: HTTP 404 on payload": the detail of a resume's entry, which
# keeps the failure message the move replaced (the status node keeps only its five keys).
_FAILURE = re.compile(
    r"^retry (?P<retry>[0-9]+); failed in (?P<step>[A-Za-z]+): (?P<message>.*)$", re.S
)


@dataclass(frozen=True)
class EarlierFailure:
    at: Any
    step: str  # the step it failed in (where the resume restarted it)
    message: str
    retry: int
    resumed_by: str
    resumed_to: str
    reason: str


def failure_of(entry: AuditEntry) -> EarlierFailure | None:
    """The failure a successful resume entry moved the job away from, or None."""
    if entry.action != "resume" or entry.kind != "job" or not entry.ok:
        return None
    match = _FAILURE.match(entry.detail or "")
    if match is None:
        return None
    return EarlierFailure(
        at=entry.at,
        step=match["step"],
        message=match["message"],
        retry=int(match["retry"]),
        resumed_by=entry.username,
        resumed_to=entry.after,
        reason=entry.reason,
    )


def earlier_failures(jid: str) -> list[EarlierFailure]:
    """The job's failures before its current status, oldest first, from its resume entries."""
    entries = AuditEntry.objects.filter(item_id=jid, kind="job", action="resume", ok=True)
    found = (failure_of(e) for e in entries.order_by("at", "id")[:200])
    return [f for f in found if f is not None]
