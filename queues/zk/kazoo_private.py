"""Every use of kazoo's private API, in one place, checked against the kazoo it was written for.

kazoo's documented API does not cover what follows; each is done here, on
internals read in kazoo's source of the versions in ``WRITTEN_FOR``:

1. ``Handler``: cheaper socket waits. kazoo's connection thread waits through its handler's
   ``select()`` (``kazoo.protocol.connection``) and kazoo's own ``selector_select`` builds an
   epoll object per wait; the subclass answers the same waits with one ``select.select`` call.
   Its ``create_connection`` wraps the socket kazoo reads from in ``_ReadAhead``, which reads
   up to 64 KiB at a time and hands kazoo's exact-size reads out of memory;
   ``ConnectionHandler._read`` skips its wait when the socket's ``pending()`` says bytes are
   there (kazoo's provision for a TLS socket's buffer), and the handler's ``select()`` answers
   at once for it.
2. ``send``, ``full_path``: hand-written requests (``multiread.py``'s multiRead). A request is an
   object with ``type``, ``serialize()`` and ``deserialize(buffer, offset)``, queued with
   ``KazooClient._call(request, async_result)``; its paths carry the chroot, as
   ``kazoo.protocol.paths._prefix_root`` adds it to kazoo's own requests. ``_prefix_root``
   splits and rejoins every path; ``full_path`` gives a path that is already normal (absolute,
   no empty, ``.`` or ``..`` part, no trailing slash: every path ``paths.py`` makes) the chroot
   by concatenation, and any other path to ``_prefix_root``.
6. ``Multi``: a multi-operation transaction with the bytes on the wire that kazoo's own
   ``Transaction`` of ``Create``, ``Delete``, ``SetData`` and ``CheckVersion`` records
   (``kazoo.protocol.serialization``) sends, each operation encoded as it is added (kazoo
   builds a record per operation and encodes it again, field by field, when it sends), without
   ``KazooClient.transaction()``'s per-operation type checks and path normalising. Its request
   has ``Transaction``'s type, so kazoo's connection strips the chroot from created paths as
   for its own; ``commit_async().get()`` gives the list ``Transaction.deserialize`` gives.
3. ``after_watch_callbacks``: read your own writes through watches (the read index's
   ``settle()``). ``SequentialThreadingHandler`` runs every watch callback on one queue in
   arrival order (``handler.dispatch_callback``); a marker queued behind them runs after all the
   watch events received so far.
5. ``list_children_raw``: a child listing kept as the answer's bytes (the read index parses a
   folder of 600,000 entries straight from them). A ``GetChildren`` subclass whose
   ``deserialize`` returns the bytes; being a ``GetChildren``, kazoo's ``_read_response`` still
   registers its child watch as for its own listing.
4. ``is_dropped_watch`` (and the re-arming in ``watch.py``): when the connection is suspended,
   kazoo drops every watch it holds (``KazooClient._reset_watchers``) and calls each with an
   event of type NONE and no path; it does not set them again on reconnect. Our watchers treat
   that event as "the connection dropped" and arm again themselves on CONNECTED.
7. ``session_ephemerals``: ZooKeeper's ``getEphemerals`` (opcode 103, servers 3.6 and later),
   which kazoo has no call for: the ephemeral nodes the server holds for this client's session.
   Sent through ``send`` (2. above) as a request of our own; the server matches the prefix as
   text against full paths, so the chroot goes on the prefix and comes off the answer.
   ``session_id``: the session the client has, read from kazoo's ``_session_id``. Its public
   ``client_id`` is None whenever the connection is down, though the session and every lock of
   it live on until it expires; code that took a lock for None then forgets a lock it holds.

8. ``add_persistent_watch``: ZooKeeper's ``addWatch`` in its PERSISTENT mode (opcode 106,
   servers 3.6 and later), which kazoo has no call for: a watch on a folder that stays set after
   it fires, so a folder of 600,000 entries is not listed again to be watched again. A
   ``GetChildren`` subclass, so kazoo registers its watcher as a child watcher when the answer
   is read; kazoo's connection hands each event to the watchers it holds for the path, taking
   them out of ``KazooClient._child_watchers`` (``ConnectionHandler._read_watch_event``), so the
   watcher puts itself back there first each time it is called.

9. ``CoalescingClient``: one wake-up for many requests. ``KazooClient._call`` queues a request on
   ``_queue`` and writes a byte to the connection's socket pair (``_write_sock``); the
   connection thread wakes on ``_read_sock`` and ``ConnectionHandler._send_request`` sends one
   request (xid, type, body, as ``_submit`` frames it), moves it to ``_pending`` and reads one
   byte. The subclass writes the byte only when no wake-up is pending, and its connection
   (``_Connection``, put in place of kazoo's ``ConnectionHandler`` when the client is made)
   sends everything queued in one ``_write``, keeping kazoo's xids, its ``Auth`` xid and its
   test hooks (``_SESSION_EXPIRED``, ``_CONNECTION_DROP``).

Upgrading kazoo: read each of these against the new version's source (the names above), run
``tests/core/test_kazoo_private.py``, ``tests/core/test_multiread.py`` and ``tests/live``, then
add the version to ``WRITTEN_FOR`` (and pin it in requirements.txt). Until then importing
``queues.zk`` fails with ``KazooVersionError``, on purpose: a silently different watch or wire
behaviour would lose live updates or misread nodes, which is worse than not starting.
"""

from __future__ import annotations

import contextlib
import functools
import re
import select
import selectors
import struct
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

import kazoo.version
from kazoo.client import KazooClient
from kazoo.exceptions import (
    EXCEPTIONS,
    ConnectionClosedError,
    ConnectionDropped,
    ConnectionLoss,
    SessionExpiredError,
)
from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import selector_select
from kazoo.protocol.connection import (
    _CONNECTION_DROP,
    _SESSION_EXPIRED,
    AUTH_XID,
    ConnectionHandler,
)
from kazoo.protocol.paths import _prefix_root
from kazoo.protocol.serialization import Auth, Close, GetChildren, Transaction
from kazoo.protocol.states import Callback, EventType, KeeperState, WatchedEvent, ZnodeStat
from kazoo.security import ACL, OPEN_ACL_UNSAFE

# The kazoo versions whose source the uses below were checked against (requirements.txt pins one).
WRITTEN_FOR = frozenset({"2.11.0"})


class KazooVersionError(RuntimeError):
    """The installed kazoo is not one this module was written for."""


def check_version(version: str) -> None:
    """Refuse a kazoo this module was not checked against, saying what to do."""
    if version not in WRITTEN_FOR:
        raise KazooVersionError(
            f"kazoo {version} is installed, but queues/zk/kazoo_private.py uses kazoo's private "
            f"API as it is in kazoo {', '.join(sorted(WRITTEN_FOR))}: install the pinned version "
            "(pip install -r requirements.txt), or check each use listed in that module against "
            f"kazoo {version}'s source and add {version!r} to WRITTEN_FOR"
        )


check_version(kazoo.version.__version__)


# 1. The handler's socket waits -------------------------------------------------------------

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
    """kazoo's threading handler with cheaper waits (see above) and a connection socket read in
    large pieces (``_ReadAhead``); same answers."""

    def create_connection(self, *args: Any, **kwargs: Any) -> Any:
        sock = super().create_connection(*args, **kwargs)
        # A TLS socket has its own ``pending()``, which kazoo's reads already look at.
        return sock if hasattr(sock, "pending") else _ReadAhead(sock)

    def select(
        self, rlist: list[Any], wlist: list[Any], xlist: list[Any], timeout: float | None = None
    ) -> Any:
        if not wlist and not xlist:
            ready = [obj for obj in rlist if type(obj) is _ReadAhead and obj.pending()]
            if ready:
                return ready, [], []  # answers already read: no system call, no wait
        try:
            if all(0 <= _fd(obj) < _SELECT_LIMIT for obj in (*rlist, *wlist, *xlist)):
                return select.select(rlist, wlist, xlist, timeout)
        except (OSError, ValueError):
            pass  # let kazoo's own path raise what kazoo expects
        return selector_select(rlist, wlist, xlist, timeout, selectors_module=_POLL)


def _fd(obj: Any) -> int:
    return obj if isinstance(obj, int) else int(obj.fileno())


class _ReadAhead:
    """kazoo's connection socket, read up to 64 KiB at a time. kazoo reads every answer in two
    exact pieces (its length, then its body), each after a wait for the socket, and waits for
    the socket again before each answer: five system calls an answer, each giving up the
    interpreter lock, and in a busy consumer process the connection thread then waits for it
    behind the loop threads at each one. Pipelined answers arrive together; read ahead, they
    are handed out from memory. kazoo asks ``pending()`` before it waits to read (it does for
    a TLS socket's own buffer) and ``Handler.select`` answers at once for a socket with bytes
    pending. Everything else goes to the socket itself."""

    __slots__ = ("_at", "_data", "_sock")

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._data = b""
        self._at = 0

    def pending(self) -> int:
        return len(self._data) - self._at

    def recv(self, size: int) -> bytes:
        if self._at >= len(self._data):
            data = self._sock.recv(max(size, _READ_AHEAD))
            if len(data) <= size:
                return bytes(data)
            self._data, self._at = data, 0
        start = self._at
        self._at = end = min(start + size, len(self._data))
        return self._data[start:end]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


_READ_AHEAD = 65536


# 2. Hand-written requests --------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _root(chroot: str | None) -> str:
    """The chroot as ``_prefix_root`` puts it before a path ("" for none)."""
    return str(_prefix_root(chroot, "/x"))[:-2]


def is_normal(path: str) -> bool:
    """Whether ``_prefix_root`` would leave ``path`` as it is (apart from the chroot): it
    starts with "/", is more than "/", has no "//", no "/." and no "/" at its end. Written
    with slices, not method calls: a consumer checks some ten paths a transition."""
    return path[:1] == "/" and path[-1:] != "/" and "//" not in path and "/." not in path


def full_path(zk: KazooClient, path: str) -> str:
    """``path`` as the server sees it: under the client's chroot, as kazoo's requests send it."""
    if is_normal(path):
        return _root(zk.chroot) + path
    return str(_prefix_root(zk.chroot, path))


def full_paths(zk: KazooClient, node_paths: Sequence[str]) -> list[str]:
    """``full_path`` of each of ``node_paths`` (the chroot looked up once)."""
    root = _root(zk.chroot)
    return [root + p if is_normal(p) else full_path(zk, p) for p in node_paths]


def send(zk: KazooClient, request: Any) -> Any:
    """Queue ``request`` (``type``, ``serialize()``, ``deserialize()``) on the connection.

    Returns kazoo's async result: ``get()`` gives what ``request.deserialize`` returned, or
    raises the error the server answered (the paths in the request must be ``full_path``s).
    """
    answer = zk.handler.async_result()
    zk._call(request, answer)
    return answer


_INT = struct.Struct("!i")
_MULTI_HEADER = struct.Struct("!iBi")  # operation type, done, error
_STAT = struct.Struct("!qqqqiiiqiiq")
_CREATE, _DELETE, _SET_DATA, _CHECK = 1, 2, 5, 13  # kazoo's Create.type, Delete.type, ...
_OP = {kind: _MULTI_HEADER.pack(kind, False, -1) for kind in (_CREATE, _DELETE, _SET_DATA, _CHECK)}
_MULTI_END = _MULTI_HEADER.pack(-1, True, -1)
_OP_CREATE, _OP_DELETE, _OP_SET_DATA, _OP_CHECK = (
    _OP[kind] for kind in (_CREATE, _DELETE, _SET_DATA, _CHECK)
)
_EPHEMERAL, _PERSISTENT = _INT.pack(1), _INT.pack(0)  # a create's flags


def _string(text: str) -> bytes:
    """kazoo's ``write_string``: length and UTF-8, or -1 for an empty string."""
    if not text:
        return _INT.pack(-1)
    encoded = text.encode()
    return _INT.pack(len(encoded)) + encoded


def _buffer(data: bytes | None) -> bytes:
    """kazoo's ``write_buffer``: length and bytes, or -1 for None."""
    return _INT.pack(-1) if data is None else _INT.pack(len(data)) + data


@functools.lru_cache(maxsize=16)
def _acl_bytes(acl: tuple[ACL, ...]) -> bytes:
    """A create's ACL list as ``Create.serialize`` writes it."""
    return _INT.pack(len(acl)) + b"".join(
        _INT.pack(a.perms) + _string(a.id.scheme) + _string(a.id.id) for a in acl
    )


class _MultiRequest:
    """A multi request already encoded (see 6. above); kazoo's connection calls
    ``serialize()`` when it sends it and ``deserialize`` on the answer.

    Reading the answer also notes on the request what a consumer asks of every answer:
    whether an operation failed (``failed``), and the ZnodeStat of each set_data in order
    (``stats``). kazoo copies the answer's list (``Transaction.unchroot``), so they are kept
    here rather than on the list."""

    type = Transaction.type
    __slots__ = ("body", "failed", "stats")

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.failed = True  # until an answer says otherwise
        self.stats: list[ZnodeStat] = []

    def serialize(self) -> bytes:
        return self.body

    def deserialize(self, buffer: Any, offset: int) -> list[Any]:
        """``Transaction.deserialize``'s list: a created path, True for a delete or a check,
        the ZnodeStat of a set, an exception instance for a failed operation."""
        results: list[Any] = []
        stats: list[ZnodeStat] = []
        failed = False
        while True:
            kind, done, _err = _MULTI_HEADER.unpack_from(buffer, offset)
            offset += _MULTI_HEADER.size
            if done:
                self.failed = failed
                self.stats = stats
                return results
            if kind == _CREATE:
                (length,) = _INT.unpack_from(buffer, offset)
                offset += _INT.size
                if length >= 0:
                    path = bytes(buffer[offset : offset + length]).decode()
                    offset += length
                    if path:  # kazoo leaves an empty answer out
                        results.append(path)
            elif kind in (_DELETE, _CHECK):
                results.append(True)
            elif kind == _SET_DATA:
                stat = new_stat(_STAT.unpack_from(buffer, offset))
                offset += _STAT.size
                results.append(stat)
                stats.append(stat)
            elif kind == -1:
                (code,) = _INT.unpack_from(buffer, offset)
                offset += _INT.size
                results.append(EXCEPTIONS[code]())
                failed = True
            else:
                raise ValueError(f"unexpected operation type {kind} in a multi's answer")


# ``ZnodeStat._make`` without its Python frame and length check (the struct gives 11 values).
new_stat: Callable[[tuple[Any, ...]], ZnodeStat] = functools.partial(tuple.__new__, ZnodeStat)


# Paths as a multi sends them, by chroot: a consumer writes the same paths again and again (a
# job's status and lock at every step, an index entry made at one step and deleted at the next).
# Emptied when full; only paths ``is_normal`` leaves alone are kept.
_WIRE_PATHS: dict[str, dict[str, bytes]] = {}
_WIRE_PATHS_MAX = 16384
_NO_VERSION = _INT.pack(-1)
_EMPTY = _INT.pack(0)  # a zero-length value (``_buffer(b"")``)


class Multi:
    """A multi-operation transaction with ``KazooClient.transaction()``'s methods (create,
    delete, set_data, check, commit_async) and the same request on the wire; see 6. above."""

    __slots__ = ("_acl", "_count", "_parts", "_root", "_wire", "zk")

    def __init__(self, zk: KazooClient) -> None:
        self.zk = zk
        self._parts: list[bytes] = []  # the operations' pieces, in order
        self._count = 0
        self._acl = _acl_bytes(tuple(zk.default_acl or OPEN_ACL_UNSAFE))
        self._root = root = _root(zk.chroot)
        wire = _WIRE_PATHS.get(root)
        if wire is None:
            if len(_WIRE_PATHS) >= 64:  # many chroots (tests, benchmarks): start again
                _WIRE_PATHS.clear()
            wire = _WIRE_PATHS[root] = {}
        self._wire = wire

    def _path(self, path: str) -> bytes:
        """``path`` as the server sees it, as a string on the wire (the operations below look
        in ``_wire`` first themselves: one call fewer an operation)."""
        wire = self._wire.get(path)
        if wire is not None:
            return wire
        if not is_normal(path):
            return _string(full_path(self.zk, path))
        encoded = (self._root + path).encode()
        wire = _INT.pack(len(encoded)) + encoded
        if len(self._wire) >= _WIRE_PATHS_MAX:
            self._wire.clear()
        self._wire[path] = wire
        return wire

    def __len__(self) -> int:
        """How many operations were added."""
        return self._count

    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False) -> None:
        self._parts += (
            _OP_CREATE,
            self._wire.get(path) or self._path(path),
            _EMPTY if value == b"" else _buffer(value),
            self._acl,
            _EPHEMERAL if ephemeral else _PERSISTENT,
        )
        self._count += 1

    def delete(self, path: str, version: int = -1) -> None:
        self._parts += (
            _OP_DELETE,
            self._wire.get(path) or self._path(path),
            _NO_VERSION if version == -1 else _INT.pack(version),
        )
        self._count += 1

    def set_data(self, path: str, value: bytes, version: int = -1) -> None:
        self._parts += (
            _OP_SET_DATA,
            self._wire.get(path) or self._path(path),
            _buffer(value),
            _NO_VERSION if version == -1 else _INT.pack(version),
        )
        self._count += 1

    def check(self, path: str, version: int) -> None:
        self._parts += (
            _OP_CHECK,
            self._wire.get(path) or self._path(path),
            _NO_VERSION if version == -1 else _INT.pack(version),
        )
        self._count += 1

    def request(self) -> _MultiRequest:
        """The request as it will be sent."""
        return _MultiRequest(b"".join(self._parts) + _MULTI_END)

    def commit_async(self) -> Any:
        return self.send()[1]

    def send(self) -> tuple[_MultiRequest, Any]:
        """``commit_async``, with the request: once the answer is in, the request's ``failed``
        and ``stats`` say what a caller would otherwise look for in the answer's list."""
        request = self.request()
        return request, send(self.zk, request)

    def commit(self) -> list[Any]:
        return list(self.commit_async().get())


class _RawChildren(GetChildren):  # type: ignore[misc]  # kazoo has no types
    @classmethod
    def deserialize(cls, buffer: Any, offset: int) -> bytes:  # type: ignore[override]
        return bytes(buffer[offset:])


class _Children(GetChildren):  # type: ignore[misc]  # kazoo has no types
    """kazoo's ``GetChildren`` with the answer read at C speed when every child is a job state
    folder's entry (``PP-jidNNNNNNNNNN``), as a consumer's listings are, and as kazoo reads it
    otherwise: a name at a time (``read_string``, a Python call each) was a consumer's largest
    cost in reading answers."""

    @classmethod
    def deserialize(cls, buffer: Any, offset: int) -> list[str]:
        (count,) = _INT.unpack_from(buffer, offset)
        if count <= 0:
            return []
        # A name holds no NUL byte, so a match can only start at a name's length; every name
        # matched is every name there.
        found = _ENTRY.findall(buffer, offset + _INT.size)
        if len(found) == count:
            return b"\n".join(found).decode().split("\n")
        names: list[str] = GetChildren.deserialize(buffer, offset)
        return names


_ENTRY = re.compile(_INT.pack(16) + rb"([0-9]{2}-jid[0-9]{10})")


def list_children(
    zk: KazooClient, path: str, watch: Callable[[WatchedEvent], None] | None = None
) -> Any:
    """Queue a child listing of ``path`` as kazoo's ``get_children_async`` does (``watch`` set
    as its child watch), read faster (``_Children``)."""
    return send(zk, _Children(full_path(zk, path), watch))


def list_children_raw(
    zk: KazooClient, path: str, watch: Callable[[WatchedEvent], None] | None = None
) -> Any:
    """Queue a child listing of ``path`` whose result (``get()``) is the answer's bytes, with
    ``watch`` set as a child watch like kazoo's own ``get_children``'s."""
    return send(zk, _RawChildren(full_path(zk, path), watch))


# 3. Waiting for the watch callbacks received so far ------------------------------------------


def after_watch_callbacks(zk: KazooClient, timeout: float) -> bool:
    """Wait until kazoo has run every watch callback it received before this call.

    ZooKeeper sends a watch event before the reply to the write that caused it, but kazoo runs
    watch callbacks on a thread of their own; this queues a marker behind them and waits for it
    (at most ``timeout`` seconds). True when the marker ran; False at once when the client is
    stopped (its callback thread is gone: a marker would never run, and a reader still holding
    a replaced client, such as a background count, would wait the whole timeout at every read).
    """
    if not zk.handler.running:
        return False
    done = threading.Event()
    zk.handler.dispatch_callback(Callback("watch", done.set, ()))
    return done.wait(timeout)


# 4. Watches and the connection ---------------------------------------------------------------


def is_dropped_watch(event: WatchedEvent) -> bool:
    """True for the event kazoo sends every watch it drops when the connection is suspended.

    Such a watch is gone from kazoo (and its node may have changed meanwhile); whoever holds
    it arms it again once the connection is back (``spawn`` from the CONNECTED listener).
    """
    return bool(event.type == EventType.NONE)


def spawn(zk: KazooClient, func: Callable[[], None]) -> None:
    """Run ``func`` on a thread of the client's handler (from a state listener, which runs on
    kazoo's connection thread and must not call ZooKeeper itself)."""
    zk.handler.spawn(func)


# 7. The ephemeral nodes of this session ----------------------------------------------------


class _GetEphemerals:
    """``GetEphemeralsRequest {ustring prefixPath}``; the answer is ``{vector<ustring>}``."""

    type = 103
    __slots__ = ("prefix",)

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def serialize(self) -> bytes:
        return _string(self.prefix)

    @classmethod
    def deserialize(cls, buffer: Any, offset: int) -> list[str]:
        (count,) = _INT.unpack_from(buffer, offset)
        offset += _INT.size
        found: list[str] = []
        for _ in range(max(count, 0)):
            (length,) = _INT.unpack_from(buffer, offset)
            offset += _INT.size
            found.append(bytes(buffer[offset : offset + max(length, 0)]).decode())
            offset += max(length, 0)
        return found


def session_id(zk: KazooClient) -> int | None:
    """The session this client has, while connected and while it reconnects (kazoo keeps it to
    resume it); None before the first one and from the moment one is lost (kazoo forgets it
    after it has told the state listeners LOST)."""
    session: int | None = zk._session_id
    return session or None


def fail_unsent(zk: KazooClient) -> int:
    """Fail with ConnectionLoss each request queued on ``zk`` and not sent yet; how many.

    kazoo keeps a request made while the connection is down until the connection is back, its
    caller waiting all that time (for an ensemble that never elects a leader: for ever). For a
    caller that must go on whatever ZooKeeper does (``FailWhileDown``); never while connected,
    when the queue is simply what the connection thread has yet to send. A stop's own close
    (no answer to give) is left where it is, with what follows it.
    """
    taking = getattr(zk._connection, "taking", None)
    if taking is None:  # not a CoalescingClient: its connection thread reads the queue unlocked
        return 0
    queue = zk._queue
    taken = []
    with taking:
        while not zk.connected and not zk._stopped.is_set():
            try:
                item = queue.popleft()
            except IndexError:
                break
            if item[1] is None:  # kazoo's own close: not a caller's request
                queue.appendleft(item)
                break
            taken.append(item[1])
    for answer in taken:  # outside the lock: a caller's callback may ask for more
        answer.set_exception(ConnectionLoss())
    return len(taken)


def session_ephemerals(zk: KazooClient) -> list[str]:
    """The ephemeral nodes this session owns under the client's chroot (chroot-less paths).

    Raises ``UnimplementedError`` from a server older than 3.6, and the connection errors of
    any request.
    """
    root = _root(zk.chroot)
    found: list[str] = send(zk, _GetEphemerals(root + "/")).get()
    return [p[len(root) :] for p in found if p.startswith(root + "/")]


# 8. Persistent watches ----------------------------------------------------------------------


class _AddWatch(GetChildren):  # type: ignore[misc]  # kazoo has no types
    """``AddWatchRequest {ustring path; int mode}`` in PERSISTENT mode (the node and its
    children, not recursive); the answer has no body. Being a ``GetChildren``, kazoo's
    ``_read_response`` puts its watcher among the path's child watchers as it reads the answer,
    before any event that follows it."""

    type = 106

    def serialize(self) -> bytes:
        return _string(self.path) + _INT.pack(0)

    @classmethod
    def deserialize(cls, buffer: Any, offset: int) -> bool:  # type: ignore[override]
        return True


def add_persistent_watch(
    zk: KazooClient, path: str, watcher: Callable[[WatchedEvent], bool]
) -> Any:
    """Set a persistent watch on ``path``; returns the async result of the request
    (``UnimplementedError`` from a server older than 3.6).

    ``watcher`` is called on kazoo's callback thread with every child event of the path and its
    deletion, and returns whether it still wants them. The server sends them until the
    connection drops; kazoo then calls it with the NONE event (``is_dropped_watch``), and whoever
    holds it sets it again on reconnect. An event the server sends in the moment between kazoo
    taking the watcher out and the watcher putting itself back is not delivered to it: a watcher
    reads the node's state after it is called, which covers that event too.
    """
    full = full_path(zk, path)

    def relay(event: WatchedEvent) -> None:
        if is_dropped_watch(event):
            watcher(event)
            return
        zk._child_watchers[full].add(relay)
        if not watcher(event):
            zk._child_watchers.get(full, set()).discard(relay)

    return send(zk, _AddWatch(full, relay))


# 9. One wake-up for many requests ------------------------------------------------------------

# kazoo queues every request (``KazooClient._call``) and writes one byte to a socket pair to wake
# its connection thread, which sends one request per wake-up: a system call in the caller, one
# wait and one read of that byte, a wait for the server socket and a send in the connection
# thread, for every request. Each of these gives up the interpreter lock; a process of eight
# busy threads then spends its time handing the lock about (measured: a third of a consumer's
# samples in the caller's one-byte send). Here a caller writes the byte only when no wake-up is
# pending, and the connection thread, woken, sends every request queued so far in one write.
# Same requests, same order, same xids.
_CLOSED_STATES = frozenset(
    {KeeperState.AUTH_FAILED, KeeperState.CLOSED, KeeperState.EXPIRED_SESSION}
)
_SEND_AT_MOST = 1 << 16  # bytes written per wake-up before the answers are looked at again


class _Connection(ConnectionHandler):  # type: ignore[misc]  # kazoo has no types
    """kazoo's connection, sending all that is queued at each wake-up (see above).

    ``wake_pending`` is True from a caller's decision to write the wake byte until the
    connection thread has read the bytes written so far; it is cleared only after that read,
    so a request queued after the queue was emptied always finds it False or a byte still
    unread in the socket."""

    wake_pending = False
    taking: threading.Lock  # set by CoalescingClient

    def start(self) -> None:
        self.wake_pending = False  # a new socket pair when the old one was closed
        super().start()

    def _send_request(self, read_timeout: float, connect_timeout: float) -> None:
        client = self.client
        with contextlib.suppress(OSError):
            self._read_sock.recv(4096)  # every wake byte so far (select said it is readable)
        self.wake_pending = False
        queue = client._queue
        message = bytearray()
        closing = False
        try:
            # Held while the queue is read: ``fail_unsent`` never takes a request from between
            # the look at the queue's head and the pop after it.
            with self.taking:
                while queue and not closing and len(message) < _SEND_AT_MOST:
                    request, async_object = queue[0]
                    if request is _SESSION_EXPIRED:  # kazoo's own test hooks, as kazoo raises them
                        raise SessionExpiredError("Session expired: Testing")
                    if request is _CONNECTION_DROP:
                        raise ConnectionDropped("Connection dropped: Testing")
                    if request.type == Auth.type:
                        xid = AUTH_XID
                    else:
                        self._xid = (self._xid % 2147483647) + 1  # type: ignore[has-type]
                        xid = self._xid
                    body = _INT.pack(xid)
                    if request.type:
                        body += _INT.pack(request.type)
                    body += request.serialize()
                    message += _INT.pack(len(body))
                    message += body
                    queue.popleft()
                    # Pending from here: should the write below fail, kazoo fails them with
                    # ConnectionLoss (sent or not, unknown), as it does for a request it sent.
                    client._pending.append((request, async_object, xid))
                    # Nothing after a close, as when kazoo reads the close's answer first.
                    closing = request.type == Close.type
        finally:
            if message:
                self._write(bytes(message), connect_timeout)
        if queue and not closing:
            self.wake_pending = True  # more than one write's worth: come back after the answers
            self._write_sock.send(b"\0")


class CoalescingClient(KazooClient):  # type: ignore[misc]  # kazoo has no types
    """kazoo's client, waking its connection thread once for many requests (see above)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._connection.__class__ = _Connection
        self._connection.taking = threading.Lock()

    def _call(self, request: Any, async_object: Any) -> Any:
        if self._state in _CLOSED_STATES:
            return super()._call(request, async_object)  # kazoo's own refusal
        self._queue.append((request, async_object))
        connection = self._connection
        if connection.wake_pending:
            return None  # the connection thread has not read the last wake-up yet
        connection.wake_pending = True
        try:
            connection._write_sock.send(b"\0")
        except Exception:  # closed meanwhile (None or a closed socket): as kazoo's own _call
            connection.wake_pending = False
            async_object.set_exception(ConnectionClosedError("Connection has been closed"))
        return None
