"""The ZooKeeper service module: the only package that imports kazoo.

Submodules: ``paths`` and ``codecs`` (the contract), ``records`` (what is read), ``jobs``,
``batches``, ``access`` and ``locks`` (reads and writes of each kind of node), ``check`` (the
consistency check), ``tree`` (dumps), ``client`` (one client per process), ``server`` (the
project's own ZooKeeper for development and tests).
"""

from .client import client, close, connect, is_connected
from .errors import (
    Conflict,
    DomainError,
    InvalidID,
    InvalidTransition,
    ItemLocked,
    MalformedNode,
    NotFound,
    QueueHeld,
    Unavailable,
)

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
    "client",
    "close",
    "connect",
    "is_connected",
]
