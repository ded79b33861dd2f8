"""One holder at a time across hosts: an ephemeral node under the console's own ``/mrt-console``.

A process that wants to be the only one doing some periodic work (evaluating the alert rules)
tries to create the node at every round; the session that created it holds it until the
session ends (the process stops, dies, or loses its session), and then the next round of
another process takes it. No watch and no queue of candidates: the work is periodic, so the
next round is soon enough, and a holder that vanished is replaced within one round after
ZooKeeper expires its session.

The node's JSON says who holds it (host, pid, since), for the page; it is written by any
process that reaches the ensemble, so readers treat it as untrusted text.
"""

from __future__ import annotations

import contextlib
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from . import paths
from .codecs import decode_json, encode_json
from .errors import MalformedNode
from .kazoo_private import session_id

LEADERS = f"{paths.CONSOLE}/leaders"


def leader_path(role: str) -> str:
    if not role.replace("-", "").isalnum():
        raise ValueError(f"leader role {role!r} is malformed")
    return f"{LEADERS}/{role}"


def leader_take(zk: KazooClient, role: str, info: dict[str, Any]) -> bool:
    """True when this client's session holds the role's node (made now, or held already)."""
    path = leader_path(role)
    try:
        zk.create(path, encode_json(info), ephemeral=True, makepath=True)
        return True
    except NodeExistsError:
        stat = zk.exists(path)
        # A create the server applied but answered with a lost connection is ours as well.
        return stat is not None and stat.ephemeralOwner == session_id(zk)


def leader_resign(zk: KazooClient, role: str) -> None:
    """Give the role up if this session holds it (at a clean stop: no wait for the expiry)."""
    path = leader_path(role)
    stat = zk.exists(path)
    if stat is not None and stat.ephemeralOwner == session_id(zk):
        with contextlib.suppress(NoNodeError):
            zk.delete(path, version=stat.version)


def leader_read(zk: KazooClient, role: str) -> dict[str, Any] | None:
    """Who holds the role, as its node says (None: nobody)."""
    path = leader_path(role)
    try:
        body, _stat = zk.get(path)
    except NoNodeError:
        return None
    try:
        return decode_json(path, body)
    except MalformedNode as exc:
        return {"error": exc.reason}
