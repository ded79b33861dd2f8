"""Every operator action, written once.

One record per action: the kind of item it acts on, its name, the role it needs, whether it is
destructive (a confirmation with a reason) or needs a reason anyway, and the service it calls
with which parameters. The role checks (``auth.may``), the reason rule and the call path
(``actions.perform``), the confirmation pages and the buttons shown per state read this table;
the URL patterns of the console and the API take the job, batch and access action names from
the state machines (``queues/core/states.py``), whose operator moves name the same actions, and
``tests/web/test_action_catalogue.py`` holds the two against each other, every route and the API.

Adding an action: one ``Action`` here and its function in ``queues/services/moves.py`` (plus, for an
action that moves an item, the move in ``queues/core/states.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from queues.core.roles import ADMIN, OPERATOR
from queues.core.states import REMOVE, AccessState
from queues.services import hold_moves, moves
from queues.zk.client import connected_client


@dataclass(frozen=True)
class Call:
    """What one request asks of an action: the item, the status version it saw, the reason
    the operator gave and any further parameters of the form (a queue, a target state)."""

    item_id: str
    version: int | None = None
    reason: str = ""
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Action:
    kind: str  # job | batch | access | queue | collection | node | consistency | consumer
    name: str
    role: str
    run: Callable[[Call], Any]  # the service call; returns an Outcome or a list of them
    destructive: bool = False
    needs_reason: bool = False  # not destructive, but must say why (holding all ingest)
    # A move of its kind's state machine (queues/core/states.py names it); False for an action that
    # changes the item where it is (a waiting job's priority).
    moves: bool = True

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.name)

    @property
    def reason_required(self) -> bool:
        return self.destructive or self.needs_reason


def _job(fn: Callable[..., moves.Outcome]) -> Callable[[Call], moves.Outcome]:
    return lambda c: fn(jid=c.item_id, expect_version=c.version)


def _batch(fn: Callable[..., moves.Outcome]) -> Callable[[Call], moves.Outcome]:
    return lambda c: fn(bid=c.item_id, expect_version=c.version)


def _access(fn: Callable[..., moves.Outcome]) -> Callable[[Call], moves.Outcome]:
    return lambda c: fn(queue=c.params.get("queue", ""), qid=c.item_id, expect_version=c.version)


def _submit(call: Call) -> moves.Outcome:
    return moves.batch_submit_outcome(**call.params)


def _window(call: Call) -> dict[str, Any]:
    """A hold's maintenance window from the form: its end (``until``), reason and author."""
    return {
        "until": call.params.get("until"),
        "reason": call.reason,
        "by": call.params.get("by", ""),
    }


def _whole(call: Call, name: str) -> int:
    """A whole-number parameter of the form (a priority, a cap); ValueError when it is not."""
    value = call.params.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    return value


def _release(call: Call, kind: str, release: Callable[[], Any], *, parks_jobs: bool) -> Any:
    """A hold's release; ``release_jobs`` ("also release what it held") only where the hold
    parks jobs or batches (the ingest queue's, a collection's): asked of another it would be
    left out while the release was done, so it is refused and nothing moves."""
    if call.params.get("release_jobs") and not parks_jobs:
        raise ValueError(
            "release_jobs goes with the ingest queue's or a collection's release: "
            f"the hold of {kind} {call.item_id} parks no jobs to release"
        )
    return release()


def _repair(_call: Call) -> moves.Outcome:
    """Repair from the findings of the latest finished check run
    (queues/operator/consistency.py)."""
    from queues.operator import consistency

    run, lines = consistency.repair_latest(connected_client())
    return moves.Outcome(
        "consistency",
        "tree",
        f"{run.repairable} repairable",
        f"{len(lines)} changes",
        "; ".join(lines)[:2000],
    )


def _drain(call: Call) -> moves.Outcome:
    """Ask a consumer process to stop claiming: queues/zk/consumers.py."""
    from queues.zk import consumers

    info = {
        "by": call.params.get("by", ""),
        "at": datetime.now(UTC).isoformat(),
        "reason": call.reason,
    }
    zk = connected_client()
    # Asked again (a form posted twice): its reason is noted anew, and nothing is said to move.
    again = consumers.drain_read(zk, call.item_id) is not None
    consumers.drain_request(zk, call.item_id, info)
    if again:
        return moves.Outcome("consumer", call.item_id, "draining", "draining", "already draining")
    return moves.Outcome("consumer", call.item_id, "running", "draining", "stops claiming")


def _undrain(call: Call) -> moves.Outcome:
    from queues.zk import consumers

    had = consumers.drain_cancel(connected_client(), call.item_id)
    if not had:
        return moves.Outcome("consumer", call.item_id, "running", "running", "was not draining")
    return moves.Outcome("consumer", call.item_id, "draining", "running")


ACTIONS: tuple[Action, ...] = (
    Action("job", "hold", OPERATOR, _job(moves.job_hold)),
    Action("job", "release", OPERATOR, _job(moves.job_release)),
    Action(
        "job",
        "resume",
        OPERATOR,
        # "to": an earlier step the operator chose; empty, the step after the last one done.
        lambda c: moves.job_resume(
            jid=c.item_id, expect_version=c.version, to=c.params.get("to") or ""
        ),
    ),
    Action(
        "job",
        "fail",
        ADMIN,
        lambda c: moves.job_fail(jid=c.item_id, message=c.reason, expect_version=c.version),
        destructive=True,
    ),
    Action("job", "delete", ADMIN, _job(moves.job_delete), destructive=True),
    Action("job", REMOVE, ADMIN, _job(moves.job_remove_deleted), destructive=True),
    Action("batch", "release", OPERATOR, _batch(moves.batch_release)),
    Action("batch", "update-reporting", OPERATOR, _batch(moves.batch_update_reporting)),
    Action("batch", "delete", ADMIN, _batch(moves.batch_delete), destructive=True),
    Action("batch", REMOVE, ADMIN, _batch(moves.batch_remove_deleted), destructive=True),
    Action("batch", "submit", OPERATOR, _submit),
    Action(
        "access",
        "resume",
        OPERATOR,
        lambda c: moves.access_resume(
            queue=c.params.get("queue", ""),
            qid=c.item_id,
            to=c.params.get("to") or AccessState.PENDING,
            expect_version=c.version,
        ),
    ),
    Action("access", "delete", ADMIN, _access(moves.access_delete), destructive=True),
    Action("access", REMOVE, ADMIN, _access(moves.access_remove_deleted), destructive=True),
    Action(
        "queue",
        "hold",
        ADMIN,
        lambda c: hold_moves.queue_hold(name=c.item_id, **_window(c)),
        needs_reason=True,
    ),
    Action(
        "queue",
        "release",
        ADMIN,
        lambda c: _release(
            c,
            "queue",
            lambda: hold_moves.queue_release(
                name=c.item_id, release_held=bool(c.params.get("release_jobs"))
            ),
            parks_jobs=c.item_id == "ingest",
        ),
    ),
    Action(
        "collection",
        "hold",
        OPERATOR,
        lambda c: hold_moves.collection_hold(profile=c.item_id, **_window(c)),
    ),
    # Storage nodes: the jobs bound for a node wait before Storing and Recording.
    Action(
        "node",
        "hold",
        OPERATOR,
        lambda c: hold_moves.node_hold(node=c.item_id, **_window(c)),
        needs_reason=True,
    ),
    Action(
        "node",
        "release",
        OPERATOR,
        lambda c: _release(
            c, "node", lambda: hold_moves.node_release(node=c.item_id), parks_jobs=False
        ),
    ),
    # Services outside (inventory, EZID, a depositor's or callback receiver's server): opening
    # and closing a breaker by hand.
    Action(
        "service",
        "hold",
        OPERATOR,
        lambda c: hold_moves.service_hold(service=c.item_id, **_window(c)),
        needs_reason=True,
    ),
    Action(
        "service",
        "release",
        OPERATOR,
        lambda c: _release(
            c, "service", lambda: hold_moves.service_release(service=c.item_id), parks_jobs=False
        ),
    ),
    Action(
        "collection",
        "release",
        OPERATOR,
        lambda c: hold_moves.collection_release(
            profile=c.item_id, release_jobs=bool(c.params.get("release_jobs"))
        ),
    ),
    # Priorities and caps: a waiting job's priority (a batch's or a collection's is this action
    # over their waiting jobs, as a bulk run); a collection's cap on its jobs in flight.
    Action(
        "job",
        "priority",
        OPERATOR,
        lambda c: hold_moves.job_priority_set(
            jid=c.item_id, priority=_whole(c, "priority"), expect_version=c.version
        ),
        moves=False,
    ),
    Action(
        "collection",
        "cap",
        OPERATOR,
        lambda c: hold_moves.collection_cap_set(
            profile=c.item_id,
            limit=_whole(c, "limit"),
            reason=c.reason,
            by=c.params.get("by", ""),
        ),
    ),
    Action(
        "collection",
        "uncap",
        OPERATOR,
        lambda c: hold_moves.collection_cap_clear(profile=c.item_id),
    ),
    Action(
        "collection",
        "recount",
        OPERATOR,
        lambda c: hold_moves.collection_cap_recount(profile=c.item_id),
    ),
    Action("consistency", "repair", ADMIN, _repair, destructive=True),
    # Draining may leave a step with no consumer at all: it says why, like a queue hold.
    Action("consumer", "drain", OPERATOR, _drain, needs_reason=True),
    Action("consumer", "undrain", OPERATOR, _undrain),
)

BY_KEY: dict[tuple[str, str], Action] = {action.key: action for action in ACTIONS}
if len(BY_KEY) != len(ACTIONS):
    raise ValueError("an operator action is written twice in the catalogue")


def find(kind: str, name: str) -> Action | None:
    return BY_KEY.get((kind, name))
