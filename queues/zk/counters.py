"""Counters kept in ZooKeeper (the local minter's), safe with any number of clients."""

from __future__ import annotations

import re

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError

from . import paths
from .codecs import decode_int, encode_int


def counter_path(name: str) -> str:
    return f"{paths.MINTER_COUNTERS}/{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}"


def counter_next(zk: KazooClient, name: str) -> int:
    """Return the next value (1, 2, ...) of the named counter; never the same value twice.

    A compare-and-set loop on the node's version: two clients incrementing at once make one of
    them retry with the new value.
    """
    path = counter_path(name)
    while True:
        stat = zk.exists(path)
        if stat is None:
            try:
                zk.create(path, encode_int(1), makepath=True)
            except NodeExistsError:
                continue
            return 1
        data, stat = zk.get(path)
        value = decode_int(path, data) + 1
        try:
            zk.set(path, encode_int(value), version=stat.version)
        except BadVersionError:
            continue
        return value
