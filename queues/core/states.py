"""The three queue state machines (job, batch, access) as one table of data.

Nothing here touches ZooKeeper: the service module asks this table whether a move is legal, what
follows a successful or failed step, and which administrative moves an operator may make. The
console draws its diagrams from the same table, so the picture and the rules cannot disagree.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
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


class JobState(StrEnum):
    """A job's status as the contract writes it (``status`` in the job's status node)."""

    PENDING = "Pending"
    HELD = "Held"
    ESTIMATING = "Estimating"
    PROVISIONING = "Provisioning"
    DOWNLOADING = "Downloading"
    PROCESSING = "Processing"
    STORING = "Storing"
    RECORDING = "Recording"
    NOTIFY = "Notify"
    COMPLETED = "Completed"
    FAILED = "Failed"
    DELETED = "Deleted"


class BatchState(StrEnum):
    """A batch's status as the contract writes it."""

    PENDING = "Pending"
    HELD = "Held"
    PROCESSING = "Processing"
    REPORTING = "Reporting"
    UPDATE_REPORTING = "UpdateReporting"
    COMPLETED = "Completed"
    FAILED = "Failed"
    DELETED = "Deleted"


class AccessState(StrEnum):
    """An access request's status as the contract writes it."""

    PENDING = "Pending"
    PROCESSING = "Processing"
    COMPLETED = "Completed"
    FAILED = "Failed"
    DELETED = "Deleted"


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
        return self._successors.get(state)

    @functools.cached_property
    def _successors(self) -> dict[str, str]:
        """state -> where a successful step there leads (the first such move in the table)."""
        found: dict[str, str] = {}
        for move in self.moves:
            if move.kind is Kind.SUCCESS:
                found.setdefault(move.source, move.target)
        return found

    @functools.cached_property
    def _allowed(self) -> dict[tuple[str, str], bool]:
        """(source, target) -> whether an operator's move only (a consumer may not make it)."""
        allowed: dict[tuple[str, str], bool] = {}
        for move in self.moves:
            key = (move.source, move.target)
            allowed[key] = allowed.get(key, True) and move.kind is Kind.ADMIN
        return allowed

    def allows(self, source: str, target: str, *, admin: bool = False) -> bool:
        admin_only = self._allowed.get((source, target))
        return admin_only is not None and (admin or not admin_only)

    def check(self, source: str, target: str, *, admin: bool = False) -> None:
        """Raise InvalidTransition unless ``source -> target`` is a legal move."""
        admin_only = self._allowed.get((source, target))
        if admin_only is not None and (admin or not admin_only):
            return  # a legal move (known states both): the consumers' path, once a transition
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
        self.check(source, JobState.DELETED, admin=True)  # one wire name in all three

    def check_remove(self, source: str) -> None:
        """Raise InvalidTransition unless an item in ``source`` may be removed (``REMOVE``)."""
        if source not in self.removable:
            allowed = ", ".join(sorted(self.removable)) or "no state"
            deletable = self.allows(source, JobState.DELETED, admin=True)
            raise InvalidTransition(
                f"{self.name}: only an item in {allowed} can be removed; this one is {source}"
                + (" (delete it instead)" if deletable else "")
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


J, B, A = JobState, BatchState, AccessState

# The job steps in order; each hands over to the next when its work is done.
JOB_STEPS: tuple[JobState, ...] = (
    J.PENDING,
    J.ESTIMATING,
    J.PROVISIONING,
    J.DOWNLOADING,
    J.PROCESSING,
    J.STORING,
    J.RECORDING,
    J.NOTIFY,
    J.COMPLETED,
)
# The status message batch-pending parks a batch with while the ingest queue is held: releasing
# the queue releases exactly those batches (a batch held by hand, or by its collection, stays).
INGEST_HELD_MESSAGE = "the ingest queue is held"

JOB_WORKING = JOB_STEPS[1:-1]  # the states a consumer daemon works on after Pending

JOB = Machine(
    name="job",
    states=(*JOB_STEPS[:1], J.HELD, *JOB_STEPS[1:], J.FAILED, J.DELETED),
    initial=J.PENDING,
    terminal=frozenset({J.COMPLETED, J.FAILED, J.DELETED}),
    removable=frozenset({J.DELETED}),
    moves=(
        *_chain(JOB_STEPS),
        Move(J.PENDING, J.HELD, Kind.HOLD),
        Move(J.PENDING, J.FAILED, Kind.FAIL),
        *(Move(s, J.FAILED, Kind.FAIL) for s in JOB_WORKING),
        Move(J.PENDING, J.HELD, Kind.ADMIN, "hold"),
        Move(J.HELD, J.PENDING, Kind.ADMIN, "release"),
        *(Move(J.FAILED, s, Kind.ADMIN, "resume") for s in JOB_STEPS[:-1]),
        *(Move(s, J.FAILED, Kind.ADMIN, "fail") for s in (J.PENDING, *JOB_WORKING)),
        Move(J.HELD, J.DELETED, Kind.ADMIN, "delete"),
        Move(J.FAILED, J.DELETED, Kind.ADMIN, "delete"),
        Move(J.COMPLETED, J.DELETED, Kind.ADMIN, "delete"),
    ),
)

BATCH = Machine(
    name="batch",
    states=tuple(BatchState),
    initial=B.PENDING,
    terminal=frozenset({B.COMPLETED, B.FAILED, B.DELETED}),
    removable=frozenset({B.DELETED}),
    moves=(
        Move(B.PENDING, B.PROCESSING, Kind.SUCCESS),
        Move(B.PROCESSING, B.REPORTING, Kind.SUCCESS),
        Move(B.REPORTING, B.COMPLETED, Kind.SUCCESS),
        Move(B.REPORTING, B.FAILED, Kind.FAIL),
        Move(B.UPDATE_REPORTING, B.COMPLETED, Kind.SUCCESS),
        Move(B.UPDATE_REPORTING, B.FAILED, Kind.FAIL),
        Move(B.PENDING, B.HELD, Kind.HOLD),
        Move(B.PENDING, B.FAILED, Kind.FAIL),
        Move(B.PROCESSING, B.FAILED, Kind.FAIL),
        Move(B.HELD, B.PENDING, Kind.ADMIN, "release"),
        Move(B.FAILED, B.UPDATE_REPORTING, Kind.ADMIN, "update-reporting"),
        Move(B.HELD, B.DELETED, Kind.ADMIN, "delete"),
        Move(B.FAILED, B.DELETED, Kind.ADMIN, "delete"),
        Move(B.COMPLETED, B.DELETED, Kind.ADMIN, "delete"),
    ),
)

ACCESS = Machine(
    name="access",
    states=tuple(AccessState),
    initial=A.PENDING,
    terminal=frozenset({A.COMPLETED, A.FAILED, A.DELETED}),
    removable=frozenset({A.DELETED}),
    moves=(
        Move(A.PENDING, A.PROCESSING, Kind.SUCCESS),
        Move(A.PROCESSING, A.COMPLETED, Kind.SUCCESS),
        Move(A.PROCESSING, A.FAILED, Kind.FAIL),
        Move(A.FAILED, A.PROCESSING, Kind.ADMIN, "resume"),
        Move(A.FAILED, A.PENDING, Kind.ADMIN, "resume"),
        Move(A.FAILED, A.DELETED, Kind.ADMIN, "delete"),
        Move(A.COMPLETED, A.DELETED, Kind.ADMIN, "delete"),
    ),
)

MACHINES: dict[str, Machine] = {m.name: m for m in (JOB, BATCH, ACCESS)}


def job_resume_target(last_successful_status: str | None) -> str:
    """The step a resumed job restarts at: the one after its last successful step.

    A job that never finished a step (null, Pending, or Held after a release) restarts at
    Estimating, because Pending only re-checks holds and digests the job already passed.
    """
    if last_successful_status in (None, "", J.PENDING, J.HELD):
        return J.ESTIMATING
    nxt = JOB.successor(last_successful_status)
    if nxt is None or nxt in JOB.terminal:
        raise InvalidTransition(
            f"job: no step follows last successful status {last_successful_status!r}"
        )
    return nxt


def job_index_folder(state: str) -> str:
    """The lowercase folder name under /jobs/states for a job state."""
    return state.lower()


_ENDED_FOLDERS: dict[str, str] = {
    J.COMPLETED: "batch-completed",
    J.FAILED: "batch-failed",
    J.DELETED: "batch-deleted",
}


@functools.lru_cache(maxsize=64)
def job_batch_folder(state: str) -> str:
    """The batch index folder a job in ``state`` belongs to."""
    return _ENDED_FOLDERS.get(state, "batch-processing")


BATCH_INDEX_FOLDERS = ("batch-processing", "batch-completed", "batch-failed", "batch-deleted")
# What each batch index folder holds, in the words the console shows (not the folder names).
BATCH_FOLDER_WORDS = {
    "batch-processing": "in process",
    "batch-completed": "completed",
    "batch-failed": "failed",
    "batch-deleted": "deleted",
}
