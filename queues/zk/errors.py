"""Domain errors raised by the ZooKeeper service module."""

from queues.states import DomainError, InvalidTransition

__all__ = [
    "Conflict",
    "DomainError",
    "InvalidID",
    "InvalidTransition",
    "ItemLocked",
    "MalformedNode",
    "NotFound",
    "QueueHeld",
    "Unavailable",
]


class NotFound(DomainError):
    """The item or node does not exist (any more)."""


class InvalidID(DomainError):
    """An identifier does not match its exact pattern; it never reaches a ZooKeeper path."""


class ItemLocked(DomainError):
    """Another client holds the item's ephemeral lock."""


class Conflict(DomainError):
    """The item changed since it was read: a stale page or a concurrent move."""


class QueueHeld(DomainError):
    """A queue or collection hold stops the move."""


class Unavailable(DomainError):
    """ZooKeeper cannot be reached."""


class MalformedNode(DomainError):
    """A node's bytes do not decode to what the contract says; the path is named."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
