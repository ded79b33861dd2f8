"""Node sizes: what one ZooKeeper request may carry, checked before it is sent, and lists of
strings split into parts that each fit.

A ZooKeeper server closes the connection of a client that sends a request longer than its
``jute.maxbuffer`` (the write is lost, the session survives, the client reconnects and would
send it again), and Merritt's Java clients refuse an answer longer than their own. Both default
to 0xfffff bytes (1 MiB - 1). A client cannot learn the server's value: Debian's ZooKeeper
3.8 prints no ``jute.maxbuffer`` in any four-letter word (``conf``, ``envi``, ``mntr``; the
first two are not even allowed by default) nor in the AdminServer's commands, which print the
same. So every write is held to the default, which is also the most any of Merritt's clients
can read back, whatever the server would take.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from .errors import DomainError

JUTE_MAXBUFFER = 0xFFFFF
# What a request carries besides the node's data: its header, the path, the ACL, the version,
# a multi's framing. A few hundred bytes; kept generous.
HEADROOM = 16 * 1024
NODE_BUDGET = JUTE_MAXBUFFER - HEADROOM
# The most jobs one batch may hold: a listing of one of its job folders
# (``/batches/BID/states/...``), four bytes of length and the job ID's 13 bytes a child, must
# come back within what Merritt's Java clients read (the contract's "Sizes"). 60,717.
BATCH_JOBS_MAX = NODE_BUDGET // (4 + len("jid0000000000"))


class TooLarge(DomainError):
    """A write that ZooKeeper would refuse by dropping the connection; refused before sending."""


def fits(path: str, data: bytes, *, budget: int = NODE_BUDGET) -> bool:
    return len(path.encode("utf-8")) + len(data) <= budget


def check(path: str, data: bytes, *, what: str = "") -> bytes:
    """``data`` when one request can carry it to ``path``; TooLarge naming the sizes if not."""
    if not fits(path, data):
        raise TooLarge(
            f"{what or path}: {len(data):,} bytes is more than one ZooKeeper node may hold "
            f"({NODE_BUDGET:,} bytes: the default jute.maxbuffer less {HEADROOM:,} for the "
            "request around it)"
        )
    return data


def check_many(items: Iterable[tuple[str, bytes]], *, what: str) -> None:
    """One multi-operation request: every node's path and data together must fit."""
    total = sum(len(p.encode("utf-8")) + len(d) + 32 for p, d in items)
    if total > NODE_BUDGET:
        raise TooLarge(
            f"{what}: {total:,} bytes in one transaction is more than ZooKeeper takes in one "
            f"request ({NODE_BUDGET:,} bytes)"
        )


def _item_size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")) + 1


def split_lists(
    lists: Mapping[str, Sequence[Any]], *, budget: int = NODE_BUDGET - 1024
) -> list[dict[str, list[Any]]]:
    """Cut several named lists into parts, each a JSON object of the same keys holding a slice,
    each part within ``budget`` bytes encoded; concatenated in order they give the lists back.
    """
    keys = list(lists)
    base = _item_size({k: [] for k in keys})
    parts: list[dict[str, list[Any]]] = []
    current: dict[str, list[Any]] = {k: [] for k in keys}
    size = base
    for key in keys:
        for value in lists[key]:
            grow = _item_size(value)
            if base + grow > budget:
                raise TooLarge(f"one entry of {key} alone is {grow:,} bytes")
            if size + grow > budget:
                parts.append(current)
                current = {k: [] for k in keys}
                size = base
            current[key].append(value)
            size += grow
    if any(current.values()) or not parts:
        parts.append(current)
    return parts


def put(zk: KazooClient, path: str, data: bytes, *, what: str = "") -> None:
    """Create ``path`` with ``data``, or replace what a node left there holds (a part a writer
    that died before naming it left behind); checked against the size first."""
    check(path, data, what=what)
    try:
        zk.create(path, data)
    except NodeExistsError:
        zk.set(path, data)
