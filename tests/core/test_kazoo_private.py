"""kazoo's private API is used in one module, which refuses a kazoo it was not written for."""

from __future__ import annotations

import contextlib
import inspect
import subprocess
import sys
import threading
from typing import Any

import kazoo.version
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError
from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import selector_select
from kazoo.protocol.connection import ConnectionHandler
from kazoo.protocol.paths import _prefix_root
from kazoo.protocol.serialization import Transaction
from kazoo.protocol.states import ZnodeStat

from queues.zk import kazoo_private
from queues.zk.kazoo_private import KazooVersionError, check_version


def test_the_installed_kazoo_is_one_it_was_written_for() -> None:
    assert kazoo.version.__version__ in kazoo_private.WRITTEN_FOR
    check_version(kazoo.version.__version__)


@pytest.mark.parametrize("version", ["2.10.0", "2.11.1", "3.0.0", ""])
def test_an_unknown_version_is_refused_saying_what_to_do(version: str) -> None:
    with pytest.raises(KazooVersionError) as raised:
        check_version(version)
    message = str(raised.value)
    assert f"kazoo {version} is installed" in message
    assert "queues/zk/kazoo_private.py" in message
    assert "requirements.txt" in message and "WRITTEN_FOR" in message


def test_importing_the_contract_with_another_kazoo_fails_at_once() -> None:
    program = "import kazoo.version\nkazoo.version.__version__ = '9.9.9'\nimport queues.zk.client\n"
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "KazooVersionError: kazoo 9.9.9 is installed" in done.stderr


def test_the_private_names_used_are_still_there() -> None:
    """What a kazoo upgrade must be read for (the module's docstring names each)."""
    assert inspect.signature(KazooClient._call).parameters.keys() >= {"request", "async_object"}
    assert callable(KazooClient._reset_watchers)
    assert "selectors_module" in inspect.signature(selector_select).parameters
    assert callable(SequentialThreadingHandler.select)
    send_request = inspect.signature(ConnectionHandler._send_request).parameters
    assert list(send_request) == ["self", "read_timeout", "connect_timeout"]
    assert list(inspect.signature(ConnectionHandler._write).parameters) == [
        "self",
        "msg",
        "timeout",
    ]


def test_after_watch_callbacks_waits_for_the_events_already_received(zk: KazooClient) -> None:
    zk.create("/watched", b"")
    seen = threading.Event()

    def slow(event: object) -> None:
        threading.Event().wait(0.2)  # a callback still running when the write returns
        seen.set()

    zk.get("/watched", watch=slow)
    zk.set("/watched", b"changed")
    assert kazoo_private.after_watch_callbacks(zk, 5.0)
    assert seen.is_set()


def test_after_watch_callbacks_does_not_wait_on_a_stopped_client(other_zk: KazooClient) -> None:
    """A stopped client runs no callbacks: the wait ends at once (a background reader still
    holding a replaced client must not wait out its timeout at every read)."""
    other_zk.stop()
    answers: list[bool] = []
    waiter = threading.Thread(
        target=lambda: answers.append(kazoo_private.after_watch_callbacks(other_zk, 3600.0)),
        daemon=True,
    )
    waiter.start()
    waiter.join(60.0)
    assert answers == [False]


def test_full_path_is_inside_the_chroot(zk: KazooClient, zk_hosts: str) -> None:
    chroot = zk_hosts[zk_hosts.index("/") :]
    assert kazoo_private.full_path(zk, "/jobs") == f"{chroot}/jobs"


PATHS = [
    "/jobs",
    "/jobs/jid0000000001/status",
    "/jobs/states/estimating/05-jid0000000001",
    "/",
    "",
    "jobs",
    "//jobs",
    "/jobs//x",
    "/jobs/",
    "/jobs/./x",
    "/jobs/../x",
    "/.hidden",
    "/a.b/c.d",
]


@pytest.mark.parametrize("chroot", ["", "/", "/a", "/a/b/", "//c", "/tests-12ab"])
def test_full_path_gives_what_kazoo_would_send_for_every_path(chroot: str) -> None:
    """The concatenation shortcut is taken only where it equals kazoo's own normalising."""

    class Client:
        pass

    client = Client()
    client.chroot = chroot  # type: ignore[attr-defined]
    for path in PATHS:
        try:
            expected = str(_prefix_root(chroot, path))
        except ValueError as exc:
            with pytest.raises(ValueError, match=str(exc)):
                kazoo_private.full_path(client, path)  # type: ignore[arg-type]
            continue
        assert kazoo_private.full_path(client, path) == expected, path  # type: ignore[arg-type]
    # Many at once (the chroot looked up once) give what one at a time gives.
    valid = [p for p in PATHS if _sendable(chroot, p)]
    assert kazoo_private.full_paths(client, valid) == [  # type: ignore[arg-type]
        kazoo_private.full_path(client, p)  # type: ignore[arg-type]
        for p in valid
    ]


def _sendable(chroot: str, path: str) -> bool:
    try:
        _prefix_root(chroot, path)
    except ValueError:
        return False
    return True


def test_a_multi_is_the_request_kazoo_transaction_sends(zk: KazooClient) -> None:
    ours, theirs = kazoo_private.Multi(zk), zk.transaction()
    for txn in (ours, theirs):
        txn.check("/jobs/jid0000000001/status", 3)
        txn.set_data("/jobs/jid0000000001/status", b'{"status":"Provisioning"}', 3)
        txn.delete("/jobs/states/estimating/05-jid0000000001")
        txn.create("/jobs/states/provisioning/05-jid0000000001", b"")
        txn.create("/jobs/jid0000000001/lock", b"", ephemeral=True)
    assert len(ours) == 5
    assert ours.request().serialize() == Transaction(theirs.operations).serialize()


def test_a_multis_answer_reads_as_kazoos_transaction_reads_it(zk: KazooClient) -> None:
    """Every kind of operation's answer, and a failed multi's (one error per operation)."""
    zk.create("/r/a", b"1", makepath=True)
    zk.create("/r/b", b"")
    answers: list[bytes] = []

    class Keep(kazoo_private._MultiRequest):
        def deserialize(self, buffer, offset):  # type: ignore[no-untyped-def]
            answers.append(bytes(buffer[offset:]))
            return super().deserialize(buffer, offset)

    for version in (0, 7):  # the second multi fails on the stale version
        txn = kazoo_private.Multi(zk)
        txn.check("/r/a", version)
        txn.set_data("/r/a", b"2", version)
        txn.delete("/r/b")
        txn.create("/r/b", b"x")
        txn.create("/r/c", b"", ephemeral=True)
        kazoo_private.send(zk, Keep(txn.request().body)).get()
    assert len(answers) == 2
    for answer in answers:
        ours = kazoo_private._MultiRequest(b"").deserialize(answer, 0)
        theirs = Transaction.deserialize(answer, 0)
        assert [type(r) for r in ours] == [type(r) for r in theirs]
        assert [r for r in ours if not isinstance(r, Exception)] == [
            r for r in theirs if not isinstance(r, Exception)
        ]
    # What the request notes while reading an answer: whether an operation failed, and the
    # stat of each set_data, in order.
    good, bad = kazoo_private._MultiRequest(b""), kazoo_private._MultiRequest(b"")
    good_answer, bad_answer = good.deserialize(answers[0], 0), bad.deserialize(answers[1], 0)
    assert isinstance(good_answer[1], ZnodeStat)
    assert not good.failed and good.stats == [good_answer[1]]
    assert any(isinstance(r, BadVersionError) for r in bad_answer)
    assert bad.failed and bad.stats == []


def test_a_multi_commits_all_or_nothing_like_kazoos(zk: KazooClient) -> None:
    zk.create("/m/a", b"1", makepath=True)
    good = kazoo_private.Multi(zk)
    good.set_data("/m/a", b"2", 0)
    good.create("/m/b", b"")
    results = good.commit()
    assert results[0].version == 1 and results[1].endswith("/m/b")
    assert zk.get("/m/a")[0] == b"2"
    bad = kazoo_private.Multi(zk)
    bad.delete("/m/b")
    bad.set_data("/m/a", b"3", 0)  # stale version: nothing is written
    results = bad.commit()
    assert any(isinstance(r, BadVersionError) for r in results)
    assert zk.exists("/m/b") is not None and zk.get("/m/a")[0] == b"2"


def test_the_connection_socket_hands_out_pipelined_answers_from_one_read() -> None:
    """kazoo reads each answer as its length and then its body; answers that arrived together
    come out of one read of the socket, exactly as kazoo asks for them, and the handler's wait
    answers at once while bytes are pending (no system call, nothing else waited for)."""
    import socket
    import struct

    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    reads: list[int] = []

    class Counting:
        def __init__(self, sock: socket.socket) -> None:
            self.sock = sock

        def recv(self, size: int) -> bytes:
            reads.append(size)
            return self.sock.recv(size)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.sock, name)

    sock = kazoo_private._ReadAhead(Counting(ours))
    handler = kazoo_private.Handler()
    bodies = [bytes([n]) * (10 * n + 1) for n in range(1, 11)]
    theirs.sendall(b"".join(struct.pack("!i", len(b)) + b for b in bodies))
    assert handler.select([sock], [], [], 5)[0] == [sock]  # a real wait: nothing read yet
    got = []
    for _ in bodies:
        if not sock.pending():
            assert handler.select([sock], [], [], 5)[0] == [sock]
        (length,) = struct.unpack("!i", sock.recv(4))
        got.append(sock.recv(length))
    assert got == bodies
    assert len(reads) == 1 and sock.pending() == 0
    # With nothing pending it waits on the socket as before, and a closed peer reads as b"".
    assert handler.select([sock], [], [], 0.01)[0] == []
    theirs.close()
    assert handler.select([sock], [], [], 5)[0] == [sock]
    assert sock.recv(4) == b""
    sock.close()  # the socket's own methods pass through


def test_a_client_reads_through_the_read_ahead_socket(other_zk: KazooClient) -> None:
    """A client's many pipelined requests and their answers, read through ``_ReadAhead``."""
    client = other_zk
    assert type(client._connection._socket) is kazoo_private._ReadAhead
    client.ensure_path("/read-ahead")
    pending = [client.create_async(f"/read-ahead/n{n}", b"x" * n) for n in range(200)]
    assert [p.get() for p in pending] == [f"/read-ahead/n{n}" for n in range(200)]
    answers = [client.get_async(f"/read-ahead/n{n}") for n in range(200)]
    assert [a.get()[0] for a in answers] == [b"x" * n for n in range(200)]


class _HeldWrites:
    """Holds the connection thread inside its first write of requests until ``release()``,
    and counts the writes and the wake-up bytes callers send meanwhile."""

    def __init__(self, client: KazooClient) -> None:
        connection = client._connection
        self.writes: list[int] = []
        self.wakes = 0
        self.inside = threading.Event()
        self._go = threading.Event()
        write = connection._write
        wake_socket = connection._write_sock

        def held_write(message: bytes, timeout: float) -> None:
            self.writes.append(len(message))
            if len(self.writes) == 1:
                self.inside.set()
                self._go.wait(30)
            write(message, timeout)

        test = self

        class CountingWake:
            def send(self, data: bytes) -> int:
                test.wakes += 1
                return wake_socket.send(data)

            def __getattr__(self, name: str) -> Any:
                return getattr(wake_socket, name)

        connection._write = held_write
        connection._write_sock = CountingWake()
        self._connection, self._wake_socket = connection, wake_socket

    def release(self) -> None:
        self._go.set()

    def undo(self) -> None:
        del self._connection._write  # kazoo's own method again
        self._connection._write_sock = self._wake_socket


def test_requests_queued_meanwhile_go_out_in_one_write_after_one_wake_up(
    other_zk: KazooClient,
) -> None:
    """While the connection thread is busy writing, callers queue requests without writing a
    wake-up byte each; woken once, it sends them all in one write, in the order they were
    queued (sequence numbers rise in that order), and every one is answered."""
    client = other_zk
    assert isinstance(client, kazoo_private.CoalescingClient)
    client.ensure_path("/coalesced")
    held = _HeldWrites(client)
    try:
        first = client.exists_async("/coalesced")
        assert held.inside.wait(10)
        held.wakes = 0
        pending = [
            client.create_async("/coalesced/n-", b"%d" % n, sequence=True) for n in range(300)
        ]
        assert held.wakes == 1  # one byte for 300 requests
        held.release()
        assert first.get(timeout=10) is not None
        names = [p.get(timeout=10) for p in pending]
    finally:
        held.release()
        held.undo()
    assert names == sorted(names) and len(set(names)) == 300
    assert [client.get(name)[0] for name in names[:3]] == [b"0", b"1", b"2"]
    assert len(held.writes) == 2  # the held one, then the 300 together
    assert held.writes[1] > 300 * len("/coalesced/n-")


def test_many_threads_queueing_at_once_are_all_answered(other_zk: KazooClient) -> None:
    """No request waits for a wake-up that never comes: eight threads, each sending bursts of
    pipelined requests and single synchronous ones, all answered, each thread's in order."""
    client = other_zk
    client.ensure_path("/burst")
    failures: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            client.ensure_path(f"/burst/t{index}")
            for round_ in range(20):
                answers = [
                    client.create_async(f"/burst/t{index}/n-", b"", sequence=True)
                    for _ in range(25)
                ]
                names = [a.get(timeout=20) for a in answers]
                assert names == sorted(names)
                assert client.exists(f"/burst/t{index}") is not None, round_
        except BaseException as exc:  # reported by the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures
    assert all(len(client.get_children(f"/burst/t{i}")) == 500 for i in range(8))


@pytest.mark.slow
def test_a_connection_cut_inside_one_write_loses_no_request_silently(
    proxy: Any, proxied_client: Any
) -> None:
    """Requests written together, the connection cut in the middle of them (the proxy forwards
    the first half and drops the rest): each is answered or fails with ConnectionLoss, none
    waits for ever, nothing past the cut is applied, and the client reconnects and goes on."""
    from kazoo.exceptions import ConnectionLoss

    from tests.zkproxy import CREATE, request

    client = proxied_client()
    client.ensure_path("/cut")
    held = _HeldWrites(client)
    try:
        first = client.exists_async("/cut")
        assert held.inside.wait(10)
        proxy.cut_before(request(CREATE, b"/cut/n50"))
        pending = [client.create_async(f"/cut/n{n}", b"") for n in range(100)]
        held.release()
        with contextlib.suppress(ConnectionLoss):  # its answer may be lost with the link
            first.get(timeout=10)
    finally:
        held.release()
        held.undo()
    answered, lost = [], []
    for n, answer in enumerate(pending):
        try:
            answer.get(timeout=20)
            answered.append(n)
        except ConnectionLoss:
            lost.append(n)
    assert proxy.fired.is_set()
    assert lost and 50 in lost and sorted(answered + lost) == list(range(100))
    # After reconnecting: what the server applied is among what passed the proxy (it may
    # drop what it had not read when the link closed), and holds every answered create.
    made = {int(name[1:]) for name in client.get_children("/cut")}
    assert set(answered) <= made <= set(range(50))
    assert client.create("/cut/after", b"") == "/cut/after"


@pytest.mark.parametrize(
    "names",
    [
        [],
        ["05-jid0000000001", "00-jid0000000002", "99-jid0000000003"],
        ["05-jid0000000001", "other", "05-jid00000000022", "é-ü"],
        ["x" * 16, "05-jid0000000001"],
    ],
)
def test_a_listing_reads_as_kazoos_get_children_reads_it(zk: KazooClient, names: list[str]) -> None:
    """The fast reading of a folder's entries gives kazoo's names, state entries or not."""
    folder = "/listing-test"
    zk.ensure_path(folder)
    try:
        for name in names:
            zk.create(f"{folder}/{name}")
        listed = kazoo_private.list_children(zk, folder).get()
        assert sorted(listed) == sorted(zk.get_children(folder)) == sorted(names)
    finally:
        zk.delete(folder, recursive=True)


def test_a_listing_of_no_folder_is_kazoos_no_node(zk: KazooClient) -> None:
    from kazoo.exceptions import NoNodeError

    with pytest.raises(NoNodeError):
        kazoo_private.list_children(zk, "/no-such-folder").get()


def test_a_listings_watch_fires_as_kazoos_does(zk: KazooClient) -> None:
    folder = "/listing-watch"
    zk.ensure_path(folder)
    fired = threading.Event()
    try:
        assert kazoo_private.list_children(zk, folder, lambda _e: fired.set()).get() == []
        zk.create(f"{folder}/05-jid0000000001")
        assert fired.wait(10)
    finally:
        zk.delete(folder, recursive=True)
