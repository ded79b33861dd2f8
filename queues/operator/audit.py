"""Writing and reading the audit log of operator actions (its table and the API tokens' are in
queues/models.py).

Queue state never lives here: an entry records what a person asked for and what ZooKeeper said,
so that "who deleted bid0000000042, and why?" has an answer after the batch is gone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from queues.models import ApiToken as ApiToken  # for the many importers of queues.operator.audit
from queues.models import AuditEntry


def record(
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
    """Write one audit entry; refused attempts are recorded too, with ``ok=False``."""
    authenticated = user is not None and getattr(user, "is_authenticated", False)
    return AuditEntry.objects.create(
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
