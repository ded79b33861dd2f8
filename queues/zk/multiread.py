"""ZooKeeper's read-only multi (``multiRead``, opcode 22, servers 3.6 and later) for kazoo.

Kazoo sends one request per node read. Every request costs the client a trip through its
connection thread (a select, a send, a response to parse and a waiter to wake), and that, not
the server, is what limits a Python consumer. ``multiRead`` asks for many nodes in ONE request:
the server answers each read on its own (a missing node is an error for that read only), from
one consistent point of its history, in one response.

The wire format is the one ZooKeeper's own clients use for ``ZooKeeper.multi(List<Op>)`` with
``Op.getData``: the operations as ``MultiHeader(type, done=false, err=-1)`` + ``GetDataRequest``
(path, watch=false), closed by ``MultiHeader(-1, true, -1)``; the answer as one
``MultiHeader(type, done, err)`` per operation followed by a ``GetDataResponse`` (data, stat) or,
for a failed read, an ``ErrorResponse`` (the error code).

A server without ``multiRead`` (3.5 and older) refuses the opcode; ``supported`` then
remembers that for the client and the callers fall back to one request per node. Sending a
hand-written request uses kazoo's private API, through ``kazoo_private``.
"""

from __future__ import annotations

import struct
import weakref
from collections.abc import Sequence
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import EXCEPTIONS, NoNodeError, UnimplementedError
from kazoo.protocol.states import ZnodeStat
from kazoo.retry import KazooRetry

from .kazoo_private import full_paths, new_stat, send

OPCODE = 22  # ZooDefs.OpCode.multiRead
GET_DATA = 4  # ZooDefs.OpCode.getData
ERROR = -1  # ZooDefs.OpCode.error

_INT = struct.Struct("!i")
_HEADER = struct.Struct("!i?i")  # MultiHeader: type, done, err
_STAT = struct.Struct("!qqqqiiiqiiq")
_END = _HEADER.pack(-1, True, -1)
# A MultiHeader and the int after it: a request's path length; an answer's data length (or,
# for a failed read, its error code).
_HEADER_INT = struct.Struct(_HEADER.format + "i")
_NO_NODE = NoNodeError.code

# Reads sent again after a server refused multiRead (and dropped the connection with it).
_FALLBACK_RETRY = KazooRetry(max_tries=10, delay=0.05, max_delay=1.0, ignore_expire=False)

# The most reads sent in one request: keeps every answer far below the 1 MB packet limit of
# ZooKeeper's own clients, even for large configuration nodes.
CHUNK = 200

Read = tuple[bytes, ZnodeStat] | None


class MalformedAnswer(Exception):
    """The server's answer does not parse as a multiRead response."""


class MultiReadRequest:
    """One multiRead request, in the shape kazoo's connection expects of a request object."""

    type = OPCODE

    def __init__(self, full_paths: Sequence[str]) -> None:
        self.full_paths = list(full_paths)
        self.errors: list[int] = []  # the places of the failed reads, once the answer is read

    def serialize(self) -> bytes:
        parts = []
        for path in self.full_paths:
            encoded = path.encode()
            parts.append(_HEADER_INT.pack(GET_DATA, False, -1, len(encoded)))  # and the length
            parts.append(encoded)
            parts.append(b"\0")  # no watch
        parts.append(_END)
        return b"".join(parts)

    def deserialize(self, buffer: bytes, offset: int) -> list[Read | int]:
        """One entry per read: ``(data, stat)``, or the error code of a failed read (their
        places are noted in ``errors``)."""
        results: list[Read | int] = []
        errors: list[int] = []
        append = results.append
        buffer = bytes(buffer)  # slices of it are then the reads' own bytes
        end = len(buffer)
        try:
            while True:
                # A read's header and its data's length at once (a header at the very end,
                # the closing one, has no length after it).
                if offset + _HEADER_INT.size <= end:
                    kind, done, _err, length = _HEADER_INT.unpack_from(buffer, offset)
                else:
                    kind, done, _err = _HEADER.unpack_from(buffer, offset)
                    length = -1
                if done:
                    self.errors = errors
                    return results
                offset += _HEADER.size
                if kind == GET_DATA:
                    offset += _INT.size
                    data = None
                    if length >= 0:
                        data = buffer[offset : offset + length]
                        offset += length
                    # Null data (length -1) stays None, as kazoo's own get returns it.
                    append((data, new_stat(_STAT.unpack_from(buffer, offset))))  # type: ignore[arg-type]
                    offset += _STAT.size
                elif kind == ERROR:
                    (code,) = _INT.unpack_from(buffer, offset)
                    offset += _INT.size
                    errors.append(len(results))
                    results.append(code)
                else:
                    raise MalformedAnswer(f"unexpected operation type {kind} in a multiRead answer")
        except struct.error as exc:
            raise MalformedAnswer(f"truncated multiRead answer: {exc}") from exc


# Clients whose server refused multiRead (kept off kazoo's own object, and gone with it).
_refused: weakref.WeakSet[KazooClient] = weakref.WeakSet()


def supported(zk: KazooClient) -> bool:
    """Whether this client's server has answered (or may answer) multiRead."""
    return zk not in _refused


class PendingMultiRead:
    """Reads sent as multiRead requests; ``collect()`` waits for the answers."""

    def __init__(self, zk: KazooClient, node_paths: Sequence[str]) -> None:
        self.zk = zk
        node_paths = list(node_paths)
        self.requests = []
        for start in range(0, len(node_paths), CHUNK):
            chunk = node_paths[start : start + CHUNK]
            request = MultiReadRequest(full_paths(zk, chunk))
            self.requests.append((chunk, request, send(zk, request)))

    def wait(self) -> None:
        """Wait for the last answer: the server answers a session's requests in order, so then
        every request sent before these has its answer too, and collecting them (and this)
        wakes the caller once instead of once per answer."""
        if self.requests:
            self.requests[-1][2].wait()

    def ready(self) -> bool:
        """Whether every answer is here (``collect()`` would not wait)."""
        return not self.requests or bool(self.requests[-1][2].ready())

    def collect(self) -> dict[str, Read]:
        result: dict[str, Read] = {}
        for chunk, request, answer in self.requests:
            try:
                reads = answer.get()
            except (UnimplementedError, MalformedAnswer):
                # An older server: remember it, and read this chunk one node at a time. Such a
                # server also drops the connection, so the reads wait for the next one.
                _refused.add(self.zk)
                retry = _FALLBACK_RETRY.copy()  # a retry object counts its attempts
                result.update(retry(_read_singly, self.zk, chunk))
                continue
            if len(reads) != len(chunk):
                raise MalformedAnswer(f"{len(reads)} answers for {len(chunk)} reads")
            result.update(zip(chunk, reads, strict=True))
            for place in request.errors:  # a read that failed: None for a missing node
                path, code = chunk[place], reads[place]
                if code != _NO_NODE:
                    raise _error(code, path)
                result[path] = None
        return result


def _error(code: int, path: str) -> Exception:
    error: Exception = EXCEPTIONS[code](f"reading {path}")
    return error


def start(zk: KazooClient, node_paths: Sequence[str]) -> Any:
    """Send the reads now; the returned object's ``collect()`` gives path -> (data, stat) | None."""
    if supported(zk):
        return PendingMultiRead(zk, node_paths)
    return _PendingSingles(zk, node_paths)


def _read_singly(zk: KazooClient, node_paths: Sequence[str]) -> dict[str, Read]:
    return _PendingSingles(zk, node_paths).collect()


class _PendingSingles:
    """The same reads, one request per node (servers without multiRead)."""

    def __init__(self, zk: KazooClient, node_paths: Sequence[str]) -> None:
        self.pending = [(p, zk.get_async(p)) for p in node_paths]

    def wait(self) -> None:
        if self.pending:
            self.pending[-1][1].wait()

    def ready(self) -> bool:
        return not self.pending or bool(self.pending[-1][1].ready())

    def collect(self) -> dict[str, Read]:
        result: dict[str, Read] = {}
        for path, answer in self.pending:
            try:
                result[path] = answer.get()
            except NoNodeError:
                result[path] = None
        return result
