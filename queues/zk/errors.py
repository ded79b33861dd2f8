"""Domain errors raised by the ZooKeeper service module, and the node errors it lets through.

``NoNode``, ``NodeExists``, ``BadVersion`` and ``NotEmpty`` are kazoo's own exception classes
under the contract's names, for the modules above ``queues.zk`` that write nodes directly (the
consistency check's repairs): they catch these and never import kazoo.
"""

import time
from collections.abc import Callable
from typing import TypeVar

from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionDropped,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError

from queues.core.states import DomainError, InvalidTransition

R = TypeVar("R")

__all__ = [
    "BadVersion",
    "Conflict",
    "DomainError",
    "InvalidID",
    "InvalidTransition",
    "ItemLocked",
    "LockLost",
    "MalformedNode",
    "NoNode",
    "NodeExists",
    "NotEmpty",
    "NotFound",
    "QueueHeld",
    "StaleVersion",
    "StoppedPartway",
    "Unavailable",
    "is_connection_error",
    "patiently",
]

# ZooKeeper's answers about one node, as kazoo raises them.
NoNode = NoNodeError
NodeExists = NodeExistsError
BadVersion = BadVersionError
NotEmpty = NotEmptyError


class NotFound(DomainError):
    """The item or node does not exist (any more)."""


class LockLost(Exception):
    """The session that took an item's lock is gone (or another took its place in this
    process): nothing may be written for that item any more."""


class InvalidID(DomainError):
    """An identifier does not match its exact pattern; it never reaches a ZooKeeper path."""


class ItemLocked(DomainError):
    """Another client holds the item's ephemeral lock."""


class Conflict(DomainError):
    """The item changed since it was read: a stale page or a concurrent move."""


class StaleVersion(Conflict):
    """The status node's version is not the one read: someone else wrote it since."""


class StoppedPartway(DomainError):
    """An action of several transactions stopped after its first write (a lock taken, a change
    or a connection lost meanwhile): the message says what was done, what was not, and that
    the same action again finishes it; ``done`` names the items it changed, ``cause`` is what
    stopped it (also ``__cause__``: a connection error stays one, ``is_connection_error``)."""

    def __init__(self, message: str, *, done: tuple[str, ...], cause: BaseException) -> None:
        super().__init__(message)
        self.done = done
        self.cause = cause


class QueueHeld(DomainError):
    """A queue or collection hold stops the move."""


class Unavailable(DomainError):
    """ZooKeeper cannot be reached."""


class StillLoading(DomainError):
    """The read index is still filling after a start: an action that must see every item it
    names (a whole collection's priority, a cap's count, a bulk action over a filter) waits
    until it has (503, retry)."""

    @classmethod
    def about(cls, what: str) -> "StillLoading":
        """The refusal naming ``what`` (the items the action would not all see)."""
        return cls(
            f"the console is still reading the queue after a start, so {what} are not all "
            "known yet: nothing was changed; try again in a moment"
        )


class StillReading(StillLoading):
    """A page asked right after a start needs what the background fill is reading now, and
    would wait for it longer than a page may (``index.answer_within``): it says so instead
    (503, retry in a few seconds)."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        super().__init__(
            f"the console is still reading the queue after a start ({stage}), and this page "
            "needs that; it shows as soon as that is read"
        )


class MalformedNode(DomainError):
    """A node's bytes do not decode to what the contract says; the path is named."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionLoss,
    ConnectionClosedError,
    ConnectionDropped,
    SessionExpiredError,
    OperationTimeoutError,
    KazooTimeoutError,
    Unavailable,
)


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) says ZooKeeper was unreachable.

    Such an error is about the connection, not the data: a page says ZooKeeper is gone, and a
    daemon leaves the item alone (its lock goes with the session) instead of failing it.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, CONNECTION_ERRORS):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def patiently(call: Callable[[], R], *, patience: float = 30.0) -> R:
    """``call()``, made again after a connection error for up to ``patience`` seconds, with
    back-off: for an idempotent write recording a side effect outside ZooKeeper that already
    happened (a mail sent), where giving up at the first ConnectionLoss leaves the next claim
    to repeat it. A closed client (the process is stopping) is not waited for."""
    deadline = time.monotonic() + patience
    delay = 0.1
    while True:
        try:
            return call()
        except Exception as exc:
            if (
                not is_connection_error(exc)
                or isinstance(exc, ConnectionClosedError)
                or time.monotonic() + delay > deadline
            ):
                raise
        time.sleep(delay)
        delay = min(delay * 2, 2.0)
