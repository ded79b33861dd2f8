"""Every operator action, for the web views and the JSON API alike: role check, service call,
audit entry.

Keeping this in one place means a button and an API call cannot differ in who may do what, and
no action can reach a service without leaving its line in the audit log, refusals included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import PermissionDenied

from queues.models import AuditEntry, bulk_summary, short_reason
from queues.operator import audit, catalogue
from queues.operator.audit import record
from queues.operator.auth import require_action
from queues.services import moves
from queues.zk.client import connected_client
from queues.zk.errors import DomainError, StoppedPartway


class ReasonRequired(DomainError):
    """A destructive action was asked for without saying why."""


class NothingMatches(DomainError):
    """A bulk action's filter matches no item now: refused (409, as the state of things refuses
    an action), not answered "0 done", so a script learns its filter caught nothing."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"nothing matches this filter now: no {kind} was acted on")


def is_destructive(kind: str, action: str) -> bool:
    found = catalogue.find(kind, action)
    return found is not None and found.destructive


def check_reason(kind: str, action: str, reason: str) -> None:
    """ReasonRequired when ``action`` needs a reason and none was given (every door)."""
    found = catalogue.find(kind, action)
    if found is not None and found.reason_required and not reason.strip():
        if not found.destructive:
            raise ReasonRequired(f"{action} on a {kind} needs a reason")
        raise ReasonRequired(f"{action} is destructive: give a reason")


def _call(
    kind: str, action: str, item_id: str, version: int | None, reason: str, params: dict[str, Any]
) -> list[moves.Outcome]:
    found = catalogue.find(kind, action)
    if found is None:
        raise PermissionDenied(f"there is no {action} action for a {kind}")
    # Fail fast while ZooKeeper is away instead of queueing the write behind a reconnect.
    connected_client()
    result = found.run(catalogue.Call(item_id, version, reason, params))
    return list(result) if isinstance(result, list) else [result]


def perform(
    *,
    user: Any,
    kind: str,
    action: str,
    item_id: str,
    expect_version: int | None = None,
    reason: str = "",
    params: dict[str, Any] | None = None,
    via: str = "web",
) -> list[moves.Outcome]:
    """Run one action as ``user``; raises PermissionDenied or a DomainError, audited either way.

    Nothing moves without its entry: a database that takes no write now (away, or locked past
    its busy timeout) refuses the action before it moves anything (its outage propagates: the
    door's 503); one that goes away between the move and the entry leaves the entry kept, and
    written once the database answers (``audit.write_or_keep``)."""
    audit.writable()
    outcomes = apply(
        user=user,
        kind=kind,
        action=action,
        item_id=item_id,
        expect_version=expect_version,
        reason=reason,
        params=params,
        via=via,
    )
    audit_made(outcomes, user=user, action=action, reason=reason, params=params, via=via)
    return outcomes


def audit_made(
    outcomes: Sequence[moves.Outcome],
    *,
    user: Any,
    action: str,
    reason: str = "",
    params: dict[str, Any] | None = None,
    via: str = "web",
) -> list[AuditEntry]:
    """The entries of moves just made (``entries_of``), written, or kept through a database
    outage and written once it answers (``audit.write_or_keep``); returns those kept."""
    audit.changed_here.set(True)
    return audit.write_or_keep(
        entries_of(outcomes, user=user, action=action, reason=reason, params=params, via=via)
    )


def apply(
    *,
    user: Any,
    kind: str,
    action: str,
    item_id: str,
    expect_version: int | None = None,
    reason: str = "",
    params: dict[str, Any] | None = None,
    via: str = "web",
) -> list[moves.Outcome]:
    """``perform`` up to the move, a refusal audited: the caller audits the outcomes
    (``audit_outcomes``). A bulk run keeps a move it made when the database fails under the
    audit, and writes the entry once the database is back, instead of doing the item again."""
    reason = reason.strip()
    try:
        require_action(user, kind, action)
        check_reason(kind, action, reason)
        return _call(kind, action, item_id, expect_version, reason, params or {})
    except (PermissionDenied, DomainError, ValueError) as exc:
        audit_refusal(
            exc,
            user=user,
            kind=kind,
            action=action,
            item_id=item_id,
            reason=reason,
            params=params,
            via=via,
        )
        raise


def check(
    *,
    user: Any,
    kind: str,
    action: str,
    item_id: str,
    reason: str = "",
    params: dict[str, Any] | None = None,
    via: str = "web",
    rule: tuple[str, str] | None = None,
) -> None:
    """``apply``'s role check and reason rule without the move, a refusal audited as ``apply``
    audits it: for a door that checks every item before it moves any (``manage.py queue``).
    ``rule``: the catalogue's (kind, action) whose role and reason rule apply, for an action
    with no record of its own (the command's release-held, cleanup, archive)."""
    rule_kind, rule_action = rule or (kind, action)
    try:
        require_action(user, rule_kind, rule_action)
        check_reason(rule_kind, rule_action, reason.strip())
    except (PermissionDenied, DomainError) as exc:
        audit_refusal(
            exc,
            user=user,
            kind=kind,
            action=action,
            item_id=item_id,
            reason=reason,
            params=params,
            via=via,
        )
        raise


def audit_refusal(
    exc: Exception,
    *,
    user: Any,
    kind: str,
    action: str,
    item_id: str,
    reason: str = "",
    params: dict[str, Any] | None = None,
    via: str = "web",
) -> None:
    """The audit entry of a refused action (``ok=False``), whatever door refused it."""
    record(
        user=user,
        action=action,
        kind=kind,
        item_id=f"{(params or {}).get('queue')}/{item_id}" if kind == "access" else item_id,
        reason=reason.strip(),
        # One stopped after its first write names what it did (``StoppedPartway``).
        detail=f"{'stopped' if isinstance(exc, StoppedPartway) else 'refused'}: {exc}",
        ok=False,
        via=via,
    )


def audit_outcomes(
    outcomes: Sequence[moves.Outcome],
    *,
    user: Any,
    action: str,
    reason: str = "",
    params: dict[str, Any] | None = None,
    via: str = "web",
    group: str = "",
) -> None:
    """One audit entry per outcome of an action ``apply`` made; ``group`` (``bulk run #N``)
    begins each entry's detail, so the log can fold a bulk run's entries under one line. An
    outage propagates (a bulk run writes the entries again once the database is back)."""
    for made in entries_of(
        outcomes, user=user, action=action, reason=reason, params=params, via=via, group=group
    ):
        audit.write(made)


def entries_of(
    outcomes: Sequence[moves.Outcome],
    *,
    user: Any,
    action: str,
    reason: str = "",
    params: dict[str, Any] | None = None,
    via: str = "web",
    group: str = "",
) -> list[AuditEntry]:
    """The audit entries of ``outcomes`` (``audit_outcomes``), not written yet."""
    made = []
    for outcome in outcomes:
        detail = f"{outcome.detail}; {outcome.failure}" if outcome.failure else outcome.detail
        item = (
            f"{(params or {}).get('queue')}/{outcome.id}"
            if outcome.kind == "access"
            else outcome.id
        )
        made.append(
            audit.entry(
                user=user,
                action=action,
                kind=outcome.kind,
                item_id=item,
                before=outcome.before,
                after=outcome.after,
                reason=reason.strip(),
                detail=f"{group}: {detail}" if group else detail,
                via=via,
            )
        )
    return made


@dataclass
class BulkResult:
    done: list[moves.Outcome] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (id, why)

    def summary(self) -> str:
        reasons: dict[str, int] = {}
        for _id, why in self.skipped:
            short = short_reason(why)
            reasons[short] = reasons.get(short, 0) + 1
        return bulk_summary(len(self.done), reasons)


def check_bulk(*, user: Any, kind: str, action: str, reason: str) -> None:
    """What a bulk action needs before its first item: the role, and a reason if destructive."""
    require_action(user, kind, action)
    check_reason(kind, action, reason)


def perform_bulk(
    *,
    user: Any,
    kind: str,
    action: str,
    items: Sequence[tuple[str, int | None]],
    reason: str = "",
    params: dict[str, Any] | None = None,
    via: str = "web",
) -> BulkResult:
    """Run one action over many items; each refusal is a skip with its reason, not a stop.

    The role and the reason are checked once up front: without them nothing is attempted.
    """
    check_bulk(user=user, kind=kind, action=action, reason=reason)
    result = BulkResult()
    for item_id, version in items:
        try:
            result.done += perform(
                user=user,
                kind=kind,
                action=action,
                item_id=item_id,
                expect_version=version,
                reason=reason,
                params=params,
                via=via,
            )
        except DomainError as exc:
            result.skipped.append((item_id, str(exc)))
    return result
