"""The three queue state machines (job, batch, access) as one table of data.

Nothing here touches ZooKeeper: the service module asks this table whether a move is legal, what
follows a successful or failed step, and which administrative moves an operator may make. The
console draws its diagrams from the same table, so the picture and the rules cannot disagree.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum


class DomainError(Exception):
    """Base of the errors the service layer raises for callers to turn into messages."""


class InvalidTransition(DomainError):
    """A move the state machine does not allow."""


class Kind(StrEnum):
    SUCCESS = "success"  # the step did its work
    FAIL = "fail"  # the step could not do its work
    HOLD = "hold"  # a hold stopped the item before it started
    ADMIN = "admin"  # an operator's move (drawn dashed)


@dataclass(frozen=True)
class Move:
    source: str
    target: str
    kind: Kind
    action: str = ""  # the operator action name for admin moves ("resume", "delete", ...)


# The operator action that removes an item already marked Deleted (by Merritt's library, which
# writes the status Deleted and leaves the nodes): no state change, the nodes go.
REMOVE = "remove"


@dataclass(frozen=True)
class Machine:
    name: str
    states: tuple[str, ...]
    initial: str
    moves: tuple[Move, ...]
    terminal: frozenset[str]
    # States whose items an operator may remove outright (``REMOVE``): no move, so no arrow.
    removable: frozenset[str] = frozenset()
    # Where each state sits on the diagram: (column, row) on a grid.
    layout: dict[str, tuple[int, int]] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        known = set(self.states)
        for move in self.moves:
            if move.source not in known or move.target not in known:
                raise ValueError(f"{self.name}: move {move} names an unknown state")
        if not self.removable <= known:
            raise ValueError(f"{self.name}: removable names an unknown state")

    def is_state(self, state: str) -> bool:
        return state in self.states

    def successor(self, state: str) -> str | None:
        """Where a successful step in ``state`` leads, or None when nothing follows."""
        for move in self.moves:
            if move.source == state and move.kind is Kind.SUCCESS:
                return move.target
        return None

    def allows(self, source: str, target: str, *, admin: bool = False) -> bool:
        return any(
            move.source == source
            and move.target == target
            and (move.kind is not Kind.ADMIN or admin)
            for move in self.moves
        )

    def check(self, source: str, target: str, *, admin: bool = False) -> None:
        """Raise InvalidTransition unless ``source -> target`` is a legal move."""
        if not self.is_state(source):
            raise InvalidTransition(f"{self.name}: unknown current state {source!r}")
        if not self.is_state(target):
            raise InvalidTransition(f"{self.name}: unknown target state {target!r}")
        if not self.allows(source, target, admin=admin):
            who = "an operator" if admin else "a consumer"
            raise InvalidTransition(
                f"{self.name}: {who} cannot move an item from {source} to {target}"
            )

    def check_delete(self, source: str) -> None:
        """Raise InvalidTransition unless an operator may delete an item in ``source``.

        An item already Deleted (as Merritt's library leaves it) may be deleted again: that
        removes its nodes. It is never refused as a move "from Deleted to Deleted".
        """
        if source in self.removable:
            return
        self.check(source, "Deleted", admin=True)

    def check_remove(self, source: str) -> None:
        """Raise InvalidTransition unless an item in ``source`` may be removed (``REMOVE``)."""
        if source not in self.removable:
            allowed = ", ".join(sorted(self.removable)) or "no state"
            raise InvalidTransition(
                f"{self.name}: only an item in {allowed} can be removed; this one is {source}"
                + (" (delete it instead)" if self.allows(source, "Deleted", admin=True) else "")
            )

    def action_sources(self, action: str) -> frozenset[str]:
        """The states from which the operator ``action`` may start."""
        if action == REMOVE:
            return self.removable
        return frozenset(m.source for m in self.moves if m.action == action)

    def action_targets(self, action: str, source: str) -> tuple[str, ...]:
        return tuple(m.target for m in self.moves if m.action == action and m.source == source)

    def actions_for(self, state: str) -> tuple[str, ...]:
        """Operator actions valid for an item in ``state``, in table order, without repeats."""
        seen: list[str] = []
        for move in self.moves:
            if move.source == state and move.action and move.action not in seen:
                seen.append(move.action)
        if state in self.removable:
            seen.append(REMOVE)
        return tuple(seen)

    @property
    def actions(self) -> tuple[str, ...]:
        seen: list[str] = []
        for move in self.moves:
            if move.action and move.action not in seen:
                seen.append(move.action)
        if self.removable:
            seen.append(REMOVE)
        return tuple(seen)


def _chain(states: Iterable[str]) -> list[Move]:
    steps = list(states)
    return [Move(a, b, Kind.SUCCESS) for a, b in itertools.pairwise(steps)]


# The job steps in order; each hands over to the next when its work is done.
JOB_STEPS: tuple[str, ...] = (
    "Pending",
    "Estimating",
    "Provisioning",
    "Downloading",
    "Processing",
    "Storing",
    "Recording",
    "Notify",
    "Completed",
)
JOB_WORKING = JOB_STEPS[1:-1]  # the states a consumer daemon works on after Pending

JOB = Machine(
    name="job",
    states=(*JOB_STEPS[:1], "Held", *JOB_STEPS[1:], "Failed", "Deleted"),
    initial="Pending",
    terminal=frozenset({"Completed", "Failed", "Deleted"}),
    removable=frozenset({"Deleted"}),
    moves=(
        *_chain(JOB_STEPS),
        Move("Pending", "Held", Kind.HOLD),
        Move("Pending", "Failed", Kind.FAIL),
        *(Move(s, "Failed", Kind.FAIL) for s in JOB_WORKING),
        Move("Pending", "Held", Kind.ADMIN, "hold"),
        Move("Held", "Pending", Kind.ADMIN, "release"),
        *(Move("Failed", s, Kind.ADMIN, "resume") for s in JOB_STEPS[:-1]),
        *(Move(s, "Failed", Kind.ADMIN, "fail") for s in ("Pending", *JOB_WORKING)),
        Move("Held", "Deleted", Kind.ADMIN, "delete"),
        Move("Failed", "Deleted", Kind.ADMIN, "delete"),
        Move("Completed", "Deleted", Kind.ADMIN, "delete"),
    ),
    layout={
        "Pending": (0, 1),
        "Held": (0, 0),
        "Estimating": (1, 1),
        "Provisioning": (2, 1),
        "Downloading": (3, 1),
        "Processing": (4, 1),
        "Storing": (5, 1),
        "Recording": (6, 1),
        "Notify": (7, 1),
        "Completed": (8, 1),
        "Failed": (4, 2),
        "Deleted": (8, 2),
    },
)

BATCH = Machine(
    name="batch",
    states=(
        "Pending",
        "Held",
        "Processing",
        "Reporting",
        "UpdateReporting",
        "Completed",
        "Failed",
        "Deleted",
    ),
    initial="Pending",
    terminal=frozenset({"Completed", "Failed", "Deleted"}),
    removable=frozenset({"Deleted"}),
    moves=(
        Move("Pending", "Processing", Kind.SUCCESS),
        Move("Processing", "Reporting", Kind.SUCCESS),
        Move("Reporting", "Completed", Kind.SUCCESS),
        Move("Reporting", "Failed", Kind.FAIL),
        Move("UpdateReporting", "Completed", Kind.SUCCESS),
        Move("UpdateReporting", "Failed", Kind.FAIL),
        Move("Pending", "Held", Kind.HOLD),
        Move("Pending", "Failed", Kind.FAIL),
        Move("Processing", "Failed", Kind.FAIL),
        Move("Held", "Pending", Kind.ADMIN, "release"),
        Move("Failed", "UpdateReporting", Kind.ADMIN, "update-reporting"),
        Move("Held", "Deleted", Kind.ADMIN, "delete"),
        Move("Failed", "Deleted", Kind.ADMIN, "delete"),
        Move("Completed", "Deleted", Kind.ADMIN, "delete"),
    ),
    layout={
        "Pending": (0, 1),
        "Held": (0, 0),
        "Processing": (1, 1),
        "Reporting": (2, 1),
        "Completed": (3, 1),
        "Failed": (3, 2),
        "UpdateReporting": (2, 2),
        "Deleted": (4, 2),
    },
)

ACCESS = Machine(
    name="access",
    states=("Pending", "Processing", "Completed", "Failed", "Deleted"),
    initial="Pending",
    terminal=frozenset({"Completed", "Failed", "Deleted"}),
    removable=frozenset({"Deleted"}),
    moves=(
        Move("Pending", "Processing", Kind.SUCCESS),
        Move("Processing", "Completed", Kind.SUCCESS),
        Move("Processing", "Failed", Kind.FAIL),
        Move("Failed", "Processing", Kind.ADMIN, "resume"),
        Move("Failed", "Pending", Kind.ADMIN, "resume"),
        Move("Failed", "Deleted", Kind.ADMIN, "delete"),
        Move("Completed", "Deleted", Kind.ADMIN, "delete"),
    ),
    layout={
        "Pending": (0, 1),
        "Processing": (1, 1),
        "Completed": (2, 1),
        "Failed": (2, 2),
        "Deleted": (3, 2),
    },
)

MACHINES: dict[str, Machine] = {m.name: m for m in (JOB, BATCH, ACCESS)}


def job_resume_target(last_successful_status: str | None) -> str:
    """The step a resumed job restarts at: the one after its last successful step.

    A job that never finished a step (null, Pending, or Held after a release) restarts at
    Estimating, because Pending only re-checks holds and digests the job already passed.
    """
    if last_successful_status in (None, "", "Pending", "Held"):
        return "Estimating"
    nxt = JOB.successor(last_successful_status)
    if nxt is None or nxt in JOB.terminal:
        raise InvalidTransition(
            f"job: no step follows last successful status {last_successful_status!r}"
        )
    return nxt


def job_index_folder(state: str) -> str:
    """The lowercase folder name under /jobs/states for a job state."""
    return state.lower()


def job_batch_folder(state: str) -> str:
    """The batch index folder a job in ``state`` belongs to."""
    return {
        "Completed": "batch-completed",
        "Failed": "batch-failed",
        "Deleted": "batch-deleted",
    }.get(state, "batch-processing")


BATCH_INDEX_FOLDERS = ("batch-processing", "batch-completed", "batch-failed", "batch-deleted")
