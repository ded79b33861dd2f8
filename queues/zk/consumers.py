"""The consumers registry: one ephemeral node per running ``runconsumer`` process.

Outside the contract's folders, beside the local minter's counters, under the console's own
``/mrt-console``:

- ``/mrt-console/consumers/<host>-<pid>``: ephemeral, JSON written by the process itself (host,
  pid, version, steps, start time, what each thread holds since when, whether it drains). It
  goes with the process's ZooKeeper session, so a lost process vanishes by itself.
- ``/mrt-console/consumer-drains/<host>-<pid>``: persistent, written by an operator's drain
  request (who, when, why). The process watches it: it stops claiming, finishes the items in
  hand and says "drained". Deleting it lets the process claim again. A process removes a request
  of its own name left over from an earlier process when it registers, and requests of
  processes that are gone.
- ``/mrt-console/claimers/<state>/<member>``: ephemeral, empty, one per batched job loop (or
  per process, when its loops keep locks from one step to the next) claiming in that state.
  The sorted names divide the state's fresh jobs between the loops (``zk.pipeline.ClaimShare``),
  so loops on several hosts do not all race for the same entries. A loop that drains or stops
  removes its node; a lost session takes it away by itself.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError, NotEmptyError

from . import paths
from .codecs import decode_json, encode_json
from .errors import InvalidID, MalformedNode, NotFound
from .nodes import read_many

CONSUMERS = f"{paths.CONSOLE}/consumers"
DRAINS = f"{paths.CONSOLE}/consumer-drains"
CLAIMERS = f"{paths.CONSOLE}/claimers"
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")


def consumer_name(host: str, pid: int) -> str:
    """A node name for ``host`` and ``pid``: characters a path may not hold become ``_``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", host)[:180] or "host"
    return f"{safe}-{int(pid)}"


def name(value: str) -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value) or value in (".", ".."):
        raise InvalidID(f"consumer name {value!r} is malformed")
    return value


def consumer_path(value: str) -> str:
    return f"{CONSUMERS}/{name(value)}"


def drain_path(value: str) -> str:
    return f"{DRAINS}/{name(value)}"


def claimers_folder(state: str) -> str:
    """Where the loops claiming in job state ``state`` are listed (a state's folder name)."""
    return f"{CLAIMERS}/{name(state)}"


def claimer_join(zk: KazooClient, state: str, member: str) -> None:
    """List ``member`` among the claimers of ``state`` (ephemeral; there already is fine)."""
    with contextlib.suppress(NodeExistsError):
        zk.create(f"{claimers_folder(state)}/{name(member)}", b"", ephemeral=True, makepath=True)


def claimer_leave(zk: KazooClient, state: str, member: str) -> None:
    with contextlib.suppress(NoNodeError):
        zk.delete(f"{claimers_folder(state)}/{name(member)}")


def claimers_list(
    zk: KazooClient, state: str, watch: Callable[[Any], None] | None = None
) -> list[str]:
    """The claimers of ``state``, sorted, setting ``watch`` on the folder's children."""
    folder = claimers_folder(state)
    try:
        return sorted(zk.get_children(folder, watch=watch))
    except NoNodeError:
        zk.ensure_path(folder)
        return sorted(zk.get_children(folder, watch=watch))


def consumer_publish(zk: KazooClient, consumer: str, data: dict[str, Any]) -> None:
    """Write this process's node, creating it (ephemeral) when it is not there: at the start,
    and again after a lost session took it away."""
    path = consumer_path(consumer)
    body = encode_json(data)
    try:
        zk.set(path, body)
        return
    except NoNodeError:
        pass
    try:
        zk.create(path, body, ephemeral=True, makepath=True)
    except NodeExistsError:
        zk.set(path, body)


def _own(zk: KazooClient, stat: Any) -> bool:
    client_id = zk.client_id
    return stat is not None and client_id is not None and stat.ephemeralOwner == client_id[0]


def consumer_register(zk: KazooClient, wanted: str, data: dict[str, Any]) -> str:
    """Create this process's node under ``wanted``, or ``wanted-2``, ``-3``... when another
    live session holds that name (two containers on one host, each its own pid 1). Returns the
    name registered."""
    for n in range(1, 100):
        candidate = wanted if n == 1 else f"{wanted}-{n}"
        path = consumer_path(candidate)
        try:
            zk.create(path, encode_json(data), ephemeral=True, makepath=True)
            return candidate
        except NodeExistsError:
            stat = zk.exists(path)
            if stat is None:
                continue  # gone meanwhile: try the next name rather than race for this one
            if _own(zk, stat):
                zk.set(path, encode_json(data))
                return candidate
    raise MalformedNode(CONSUMERS, f"no free consumer name for {wanted}")


def consumer_remove(zk: KazooClient, consumer: str) -> None:
    with contextlib.suppress(NoNodeError):
        zk.delete(consumer_path(consumer))


def consumers_list(zk: KazooClient) -> list[dict[str, Any]]:
    """Every registered process's node (``name`` added), sorted by name; unreadable ones are
    listed with an ``error``."""
    try:
        names = sorted(zk.get_children(CONSUMERS))
    except NoNodeError:
        return []
    found = []
    reads = read_many(zk, [f"{CONSUMERS}/{n}" for n in names])
    for n in names:
        path = f"{CONSUMERS}/{n}"
        read = reads.get(path)
        if read is None:
            continue  # gone between the listing and the read
        try:
            data = decode_json(path, read[0])
        except MalformedNode as exc:
            data = {"error": str(exc)}
        data["name"] = n
        found.append(data)
    return found


def consumer_exists(zk: KazooClient, consumer: str) -> bool:
    return zk.exists(consumer_path(consumer)) is not None


def drain_request(zk: KazooClient, consumer: str, info: dict[str, Any]) -> None:
    """Ask a registered process to stop claiming; NotFound when it is not registered."""
    if not consumer_exists(zk, consumer):
        raise NotFound(f"consumer {consumer} is not running")
    body = encode_json(info)
    try:
        zk.create(drain_path(consumer), body, makepath=True)
    except NodeExistsError:
        zk.set(drain_path(consumer), body)


def drain_cancel(zk: KazooClient, consumer: str) -> bool:
    """Let the process claim again; False when no drain was asked for."""
    try:
        zk.delete(drain_path(consumer))
    except NoNodeError:
        return False
    return True


def drain_read(
    zk: KazooClient, consumer: str, watch: Callable[[Any], None] | None = None
) -> dict[str, Any] | None:
    """The drain request for ``consumer`` (None: none), setting ``watch`` on its node."""
    path = drain_path(consumer)
    try:
        stat = zk.exists(path, watch=watch)
        if stat is None:
            return None
        data, _stat = zk.get(path)
    except NoNodeError:
        return None
    try:
        return decode_json(path, data)
    except MalformedNode:
        return {}


def drains_list(zk: KazooClient) -> dict[str, dict[str, Any]]:
    try:
        names = zk.get_children(DRAINS)
    except NoNodeError:
        return {}
    reads = read_many(zk, [f"{DRAINS}/{n}" for n in names])
    found = {}
    for n in names:
        read = reads.get(f"{DRAINS}/{n}")
        if read is None:
            continue
        try:
            found[n] = decode_json(f"{DRAINS}/{n}", read[0])
        except MalformedNode:
            found[n] = {}
    return found


def drains_prune(zk: KazooClient, *, keep: str = "") -> int:
    """Remove drain requests whose process is gone (``keep``: a name not to touch). Returns how
    many were removed."""
    try:
        names = zk.get_children(DRAINS)
    except NoNodeError:
        return 0
    try:
        alive = set(zk.get_children(CONSUMERS))
    except NoNodeError:
        alive = set()
    removed = 0
    for n in names:
        if n == keep or n in alive:
            continue
        try:
            zk.delete(f"{DRAINS}/{n}")
            removed += 1
        except (NoNodeError, NotEmptyError):
            pass
    return removed
