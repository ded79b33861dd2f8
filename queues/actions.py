"""Every operator action, for the web views and the JSON API alike: role check, service call,
audit entry.

Keeping this in one place means a button and an API call cannot differ in who may do what, and
no action can reach a service without leaving its line in the audit log, refusals included.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.core.exceptions import PermissionDenied

from queues import services
from queues.audit import record
from queues.auth import require_action
from queues.selectors import zk_client
from queues.states import REMOVE, DomainError

DESTRUCTIVE = frozenset(
    {("job", "delete"), ("job", "fail"), ("batch", "delete"), ("access", "delete")}
    | {(kind, REMOVE) for kind in ("job", "batch", "access")}
    | {("consistency", "repair")}
)


class ReasonRequired(DomainError):
    """A destructive action was asked for without saying why."""


# Not destructive, but stopping all ingest must say why (the holds page shows it).
REASON_REQUIRED = DESTRUCTIVE | {("queue", "hold")}


def is_destructive(kind: str, action: str) -> bool:
    return (kind, action) in DESTRUCTIVE


def check_reason(kind: str, action: str, reason: str) -> None:
    """ReasonRequired when ``action`` needs a reason and none was given (every door)."""
    if (kind, action) in REASON_REQUIRED and not reason.strip():
        if kind == "queue":
            raise ReasonRequired("holding a whole queue needs a reason")
        raise ReasonRequired(f"{action} is destructive: give a reason")


def _as_list(result: Any) -> list[services.Outcome]:
    return list(result) if isinstance(result, list) else [result]


def _repair(**_: Any) -> list[services.Outcome]:
    from queues.zk.check import repair, run_check

    zk = zk_client()
    report = run_check(zk)
    fixable = sum(1 for f in report.findings if f.repairable)
    lines = repair(zk, report)
    return [
        services.Outcome(
            "consistency",
            "tree",
            f"{fixable} repairable",
            f"{len(lines)} changes",
            "; ".join(lines)[:2000],
        )
    ]


def _drain(name: str, reason: str, params: dict[str, Any], *, cancel: bool) -> services.Outcome:
    """Ask a consumer process to stop claiming (or to claim again): queues/zk/consumers.py."""
    from datetime import UTC, datetime

    from queues.zk import consumers

    zk = zk_client()
    if cancel:
        had = consumers.drain_cancel(zk, name)
        return services.Outcome("consumer", name, "draining" if had else "running", "running")
    info = {"by": params.get("by", ""), "at": datetime.now(UTC).isoformat(), "reason": reason}
    consumers.drain_request(zk, name, info)
    return services.Outcome("consumer", name, "running", "draining", "stops claiming")


def _submit(**params: Any) -> services.Outcome:
    bid = services.batch_submit(**params)
    return services.Outcome("batch", bid, "", "Pending", "submitted")


def _call(
    kind: str, action: str, item_id: str, version: int | None, reason: str, params: dict[str, Any]
) -> list[services.Outcome]:
    runners: dict[tuple[str, str], Callable[[], Any]] = {
        ("job", "fail"): lambda: services.job_fail(
            jid=item_id, message=reason, expect_version=version
        ),
        **{
            ("job", name): partial(fn, jid=item_id, expect_version=version)
            for name, fn in services.JOB_ACTIONS.items()
            if name != "fail"
        },
        **{
            ("batch", name): partial(fn, bid=item_id, expect_version=version)
            for name, fn in services.BATCH_ACTIONS.items()
        },
        ("batch", "submit"): lambda: _submit(**params),
        ("access", "resume"): lambda: services.access_resume(
            queue=params.get("queue", ""),
            qid=item_id,
            to=params.get("to") or "Pending",
            expect_version=version,
        ),
        ("access", "delete"): lambda: services.access_remove(
            queue=params.get("queue", ""), qid=item_id, expect_version=version
        ),
        ("access", REMOVE): lambda: services.access_remove_deleted(
            queue=params.get("queue", ""), qid=item_id, expect_version=version
        ),
        ("queue", "hold"): lambda: services.queue_hold(name=item_id),
        ("queue", "release"): lambda: services.queue_release(name=item_id),
        ("collection", "hold"): lambda: services.collection_hold(profile=item_id),
        ("collection", "release"): lambda: services.collection_release(
            profile=item_id, release_jobs=bool(params.get("release_jobs"))
        ),
        ("consistency", "repair"): _repair,
        ("consumer", "drain"): lambda: _drain(item_id, reason, params, cancel=False),
        ("consumer", "undrain"): lambda: _drain(item_id, reason, params, cancel=True),
    }
    runner = runners.get((kind, action))
    if runner is None:
        raise PermissionDenied(f"there is no {action} action for a {kind}")
    # Fail fast while ZooKeeper is away instead of queueing the write behind a reconnect.
    zk_client()
    return _as_list(runner())


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
) -> list[services.Outcome]:
    """Run one action as ``user``; raises PermissionDenied or a DomainError, audited either way."""
    audit_id = f"{(params or {}).get('queue')}/{item_id}" if kind == "access" else item_id
    reason = reason.strip()
    try:
        require_action(user, kind, action)
        check_reason(kind, action, reason)
        outcomes = _call(kind, action, item_id, expect_version, reason, params or {})
    except (PermissionDenied, DomainError, ValueError) as exc:
        record(
            user=user,
            action=action,
            kind=kind,
            item_id=audit_id,
            reason=reason,
            detail=f"refused: {exc}",
            ok=False,
            via=via,
        )
        raise
    for outcome in outcomes:
        item = (
            f"{(params or {}).get('queue')}/{outcome.id}"
            if outcome.kind == "access"
            else outcome.id
        )
        record(
            user=user,
            action=action,
            kind=outcome.kind,
            item_id=item,
            before=outcome.before,
            after=outcome.after,
            reason=reason,
            detail=f"{outcome.detail}; {outcome.failure}" if outcome.failure else outcome.detail,
            via=via,
        )
    return outcomes


@dataclass
class BulkResult:
    done: list[services.Outcome] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (id, why)

    def summary(self) -> str:
        reasons: dict[str, int] = {}
        for _id, why in self.skipped:
            short = short_reason(why)
            reasons[short] = reasons.get(short, 0) + 1
        return bulk_summary(len(self.done), reasons)


def bulk_summary(done: int, reasons: dict[str, int]) -> str:
    """ "N done, M skipped (the three commonest reasons)" from skip reasons and their counts."""
    text = f"{done} done, {sum(reasons.values())} skipped"
    if reasons:
        common = sorted(reasons.items(), key=lambda kv: -kv[1])[:3]
        text += " (" + "; ".join(f"{n} x {why}" for why, n in common) + ")"
    return text


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


_ITEM_ID = re.compile(r"\b(?:jid|bid|qid)[0-9]{10}\b")


def short_reason(why: str) -> str:
    """The reason without the item ID, so that equal reasons group in the summary."""
    return _ITEM_ID.sub("the item", why)
