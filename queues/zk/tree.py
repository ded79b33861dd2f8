"""Walk a subtree and decode every node, for ``manage.py zkdump``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from .codecs import decode_any


def walk(zk: KazooClient, root: str = "/") -> Iterator[tuple[str, Any, bool]]:
    """Yield (path, decoded data, is_ephemeral) depth first, children in sorted order."""
    try:
        data, stat = zk.get(root)
    except NoNodeError:
        return
    yield root, decode_any(data), bool(stat.ephemeralOwner)
    try:
        kids = sorted(zk.get_children(root))
    except NoNodeError:
        return
    for kid in kids:
        yield from walk(zk, f"{root.rstrip('/')}/{kid}")
