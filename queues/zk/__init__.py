"""The ZooKeeper service module: the only package that imports kazoo.

Submodules: ``paths`` and ``codecs`` (the contract), ``records`` (what is read), ``jobs``,
``batches``, ``access`` and ``locks`` (reads and writes of each kind of node), ``tree`` (dumps),
``client`` (one client per process, handed its settings), ``watch`` (watches), ``index`` (the
read index), ``errors``. Not here: the consistency check (``queues.check``), the project's own
ZooKeeper server (``queues.zkserver``), the benchmark loader (``bench.loader``).
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
