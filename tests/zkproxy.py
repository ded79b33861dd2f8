"""A TCP proxy on loopback between one ZooKeeper client and its server, to cause faults.

It reads the client's requests frame by frame (ZooKeeper's 4-byte length prefix; after the
connect request, each starts with its xid and its opcode), so a test can act at the moment a
given request passes:

- ``cut_after(match)``: the matching request reaches the server, its answer never reaches the
  client, and the connection is closed: the client sees ConnectionLoss for a request the
  server applied (and its session survives, so it reconnects through the proxy);
- ``cut_before(match)``: the matching request is dropped and the connection closed: the server
  never sees it;
- ``blackhole()`` / ``heal()``: nothing passes either way, and new connections hang, as behind
  a partition; past the session timeout the server expires the session;
- ``blackhole_at(match)``: a black hole that starts when the matching request has passed.

``match`` is a predicate on (opcode, frame bytes). Opcodes are ZooKeeper's (``CREATE`` 1,
``DELETE`` 2, ``EXISTS`` 3, ``MULTI`` 14, ``MULTI_READ`` 22, ...).
"""

from __future__ import annotations

import collections
import contextlib
import socket
import struct
import threading
from collections.abc import Callable

from queues.services.zkserver import free_port

CREATE, DELETE, EXISTS, MULTI, MULTI_READ = 1, 2, 3, 14, 22

# Opcodes whose request begins with the node's path: create .. getChildren, getChildren2,
# create2, createContainer, createTTL, getEphemerals, getAllChildrenNumber, addWatch.
_PATH_FIRST = frozenset({1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 19, 21, 103, 104, 106})

Match = Callable[[int, bytes], bool]


def request(opcode: int, *needles: bytes, without: bytes | None = None) -> Match:
    """A request of ``opcode`` whose bytes hold every one of ``needles`` (and not ``without``)."""

    def match(op: int, frame: bytes) -> bool:
        return (
            op == opcode
            and all(n in frame for n in needles)
            and (without is None or without not in frame)
        )

    return match


class _Link:
    def __init__(self, proxy: ZkProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = socket.create_connection(("127.0.0.1", proxy.target_port))
        self.closed = False
        threading.Thread(target=self._upstream, daemon=True).start()
        threading.Thread(target=self._downstream, daemon=True).start()

    def close(self) -> None:
        self.closed = True
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _read_exactly(self, count: int) -> bytes | None:
        data = b""
        while len(data) < count:
            try:
                chunk = self.client.recv(count - len(data))
            except OSError:
                return None
            if not chunk:
                return None
            data += chunk
        return data

    def _upstream(self) -> None:
        first = True
        while not self.closed:
            head = self._read_exactly(4)
            if head is None:
                break
            (length,) = struct.unpack("!i", head)
            body = self._read_exactly(length)
            if body is None:
                break
            opcode = -1 if first or length < 8 else struct.unpack("!i", body[4:8])[0]
            first = False
            with self.proxy._lock:
                self.proxy.counts[opcode] += 1
                if opcode in _PATH_FIRST and length >= 12:
                    (size,) = struct.unpack("!i", body[8:12])
                    path = body[12 : 12 + max(size, 0)].decode(errors="replace")
                    self.proxy.paths[(opcode, path)] += 1
            if self.proxy.holed.is_set():
                continue
            action = self.proxy._action_for(opcode, body)
            if action == "cut_before":
                break
            if action in ("cut_after", "blackhole_at"):
                # The answer must not reach the client: the black hole is in place before the
                # request leaves.
                self.proxy.holed.set()
            try:
                self.server.sendall(head + body)
            except OSError:
                break
            if action == "cut_after":
                self.close()  # before the black hole ends: the answer is lost with the link
                self.proxy.holed.clear()
                return
        self.close()

    def _downstream(self) -> None:
        while not self.closed:
            try:
                data = self.server.recv(65536)
            except OSError:
                break
            if not data:
                break
            if self.proxy.holed.is_set():
                continue
            try:
                self.client.sendall(data)
            except OSError:
                break
        self.close()


class ZkProxy:
    """The proxy (see the module's docstring); ``hosts`` is its connection string."""

    def __init__(self, target_port: int, port: int = 0) -> None:
        self.target_port = target_port
        self.port = port or free_port()
        self.holed = threading.Event()
        self.fired = threading.Event()  # the armed action has happened
        # Requests that passed, by opcode (-1: a connect request), for tests that count them.
        self.counts: collections.Counter[int] = collections.Counter()
        # The same by (opcode, path), for the requests whose first field is a path.
        self.paths: collections.Counter[tuple[int, str]] = collections.Counter()
        self._armed: tuple[str, Match] | None = None
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._held: list[socket.socket] = []  # connections accepted inside a black hole
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _address = self._listener.accept()
            except OSError:
                return
            if self.holed.is_set():
                # Behind a partition a new connection gets nowhere: hold it open, silent.
                self._held.append(client)
                continue
            with self._lock:
                self._links = [link for link in self._links if not link.closed]
                self._links.append(_Link(self, client))

    def _action_for(self, opcode: int, frame: bytes) -> str | None:
        with self._lock:
            if self._armed is None or not self._armed[1](opcode, frame):
                return None
            action, _match = self._armed
            self._armed = None
        self.fired.set()
        return action

    def _arm(self, action: str, match: Match) -> None:
        self.fired.clear()
        with self._lock:
            self._armed = (action, match)

    def cut_after(self, match: Match) -> None:
        self._arm("cut_after", match)

    def cut_before(self, match: Match) -> None:
        self._arm("cut_before", match)

    def blackhole_at(self, match: Match) -> None:
        self._arm("blackhole_at", match)

    def blackhole(self) -> None:
        self.holed.set()
        self.fired.set()

    def heal(self) -> None:
        """End the black hole: the connections held in it are closed, so the client connects
        again (and learns whether its session outlived the partition)."""
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()
        held, self._held = self._held, []
        for sock in held:
            with contextlib.suppress(OSError):
                sock.close()
        self.holed.clear()

    def close(self) -> None:
        self._stopped = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self.heal()
