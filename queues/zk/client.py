"""One ZooKeeper client per process, with bounded retries and a session-state listener.

``client()`` returns the process's client, connecting on first use. With ``ZK_HOSTS=local`` the
project's own server (``server.py``) is started on ``ZK_LOCAL_PORT`` under ``MRT_VAR_DIR``; with
``ZK_HOSTS`` empty that server is used only when it already runs (``bin/run-console`` or
``manage.py zkserver start`` started it), never started behind the operator's back.
"""

from __future__ import annotations

import logging
import select
import selectors
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.handlers.utils import selector_select
from kazoo.retry import KazooRetry

from . import paths
from .errors import Unavailable
from .server import LocalZooKeeper

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ZkSettings:
    """What this module needs to know, handed in by the application (it imports no Django)."""

    hosts: str  # ZK_HOSTS
    timeout: float  # ZK_TIMEOUT, seconds
    var_dir: Path  # MRT_VAR_DIR: the local server's data lives in var_dir/zookeeper
    local_port: int  # ZK_LOCAL_PORT


_settings_source: Callable[[], ZkSettings] | None = None


def configure(source: Callable[[], ZkSettings]) -> None:
    """Where the settings come from: called for each connection, so changes are seen."""
    global _settings_source
    _settings_source = source


def _settings() -> ZkSettings:
    if _settings_source is None:
        raise RuntimeError(
            "queues.zk is not configured: call queues.zk.client.configure() first "
            "(the Django app does so when it starts)"
        )
    return _settings_source()


_lock = threading.Lock()
_client: KazooClient | None = None
_listeners: list[Callable[[str], None]] = []

BASE_NODES = (
    paths.BATCHES,
    paths.BATCH_UUIDS,
    paths.JOBS,
    paths.JOB_STATES,
    *(f"{paths.ACCESS}/{q}" for q in paths.ACCESS_QUEUES),
    paths.QUEUE_LOCKS,
    paths.COLLECTION_LOCKS,
    paths.STORAGE_LOCKS,
    paths.INVENTORY_LOCKS,
)


# kazoo's connection thread waits on its sockets before every request it sends and every answer
# it reads (about seven waits per request), each time through a fresh ``selectors`` object: an
# epoll instance made, filled, waited on and closed. With thousands of requests a second, that
# bookkeeping is most of a consumer process's CPU. These waits are on one or two sockets, which
# ``select.select`` answers in one C call; descriptors past select()'s limit (a web process
# with many connections) and an unexpected error go kazoo's own way, with poll() instead of a
# new epoll instance per wait.
_POLL = types.SimpleNamespace(
    DefaultSelector=selectors.PollSelector,
    EVENT_READ=selectors.EVENT_READ,
    EVENT_WRITE=selectors.EVENT_WRITE,
)
_SELECT_LIMIT = 1024  # FD_SETSIZE


class Handler(SequentialThreadingHandler):  # type: ignore[misc]  # kazoo has no types
    """kazoo's threading handler with cheaper waits (see above); same answers."""

    def select(
        self, rlist: list[Any], wlist: list[Any], xlist: list[Any], timeout: float | None = None
    ) -> Any:
        try:
            if all(0 <= _fd(obj) < _SELECT_LIMIT for obj in (*rlist, *wlist, *xlist)):
                return select.select(rlist, wlist, xlist, timeout)
        except (OSError, ValueError):
            pass  # let kazoo's own path raise what kazoo expects
        return selector_select(rlist, wlist, xlist, timeout, selectors_module=_POLL)


def _fd(obj: Any) -> int:
    return obj if isinstance(obj, int) else int(obj.fileno())


def local_server() -> LocalZooKeeper:
    config = _settings()
    return LocalZooKeeper(Path(config.var_dir) / "zookeeper", config.local_port)


LOCAL = "local"


def configured_hosts() -> str:
    """The connection string: ZK_HOSTS, or the project's own server when asked for.

    ``local`` starts that server when needed. Empty uses it only while it runs from
    MRT_VAR_DIR (a shell command beside ``bin/run-console``); otherwise Unavailable says what to
    set: a production host with ZK_HOSTS forgotten must not quietly get an empty queue of its own.
    """
    hosts = _settings().hosts.strip()
    if hosts and hosts != LOCAL:
        return hosts
    server = local_server()
    if hosts == LOCAL:
        server.start()
        return server.hosts
    if server.running() is not None:
        server.follow_running()
        return server.hosts
    raise Unavailable(
        "ZK_HOSTS is not set: name the ensemble (host:port,host:port[/chroot]), or set "
        "ZK_HOSTS=local for the project's own ZooKeeper under MRT_VAR_DIR"
    )


def connect(hosts: str | None = None, *, timeout: float | None = None) -> KazooClient:
    """A new, started client with bounded retries. The caller owns it (and stops it)."""
    timeout = timeout or _settings().timeout
    hosts = hosts or configured_hosts()
    zk = KazooClient(
        hosts=hosts,
        timeout=timeout,
        handler=Handler(),
        connection_retry=KazooRetry(max_tries=-1, delay=0.2, max_delay=5),
        command_retry=KazooRetry(max_tries=3, delay=0.1, max_delay=2),
    )
    try:
        zk.start(timeout=timeout)
    except KazooTimeoutError as exc:
        zk.stop()
        zk.close()
        raise Unavailable(f"cannot reach ZooKeeper at {hosts}: {exc}") from exc
    ensure_layout(zk)
    return zk


def ensure_layout(zk: KazooClient) -> None:
    """Create the shared top-level folders when missing (a fresh ensemble or chroot)."""
    for node in BASE_NODES:
        zk.ensure_path(node)


def client() -> KazooClient:
    """The process's shared client."""
    global _client
    with _lock:
        if _client is None:
            zk = connect()
            zk.add_listener(_on_state)
            _client = zk
        return _client


def _on_state(state: str) -> None:
    if state == KazooState.LOST:
        log.warning("ZooKeeper session lost; ephemeral locks are gone")
    elif state == KazooState.SUSPENDED:
        log.warning("ZooKeeper connection suspended")
    for listener in list(_listeners):
        try:
            listener(state)
        except Exception:
            log.exception("ZooKeeper state listener failed")


def add_state_listener(listener: Callable[[str], None]) -> None:
    """Call ``listener`` with "CONNECTED", "SUSPENDED" or "LOST" on every change."""
    _listeners.append(listener)


def remove_state_listener(listener: Callable[[str], None]) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def is_connected() -> bool:
    return _client is not None and _client.connected


def close() -> None:
    """Stop the shared client (tests, process exit)."""
    global _client
    with _lock:
        if _client is not None:
            # A deliberate close is not a lost session: nobody needs to hear about it.
            _client.remove_listener(_on_state)
            try:
                _client.stop()
                _client.close()
            except KazooException:
                log.debug("error closing ZooKeeper client", exc_info=True)
            _client = None


def connected_client() -> KazooClient:
    """The process's client, refusing at once while the connection is down.

    kazoo queues requests during a reconnect; without this check a page would hang until
    ZooKeeper returned instead of saying that it is gone.
    """
    zk = client()
    if not zk.connected:
        raise Unavailable("the connection to ZooKeeper is down; reconnecting")
    return zk
