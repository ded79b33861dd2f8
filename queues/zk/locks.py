"""Ephemeral item locks and persistent queue / collection holds.

An item lock is the item's ephemeral ``lock`` child: whoever creates it owns the item until it
deletes the node or its session ends. Holds are persistent empty markers under ``/locks``.

A create or delete answered with ConnectionLoss may have been applied by the server, and the
session usually survives the outage: a lock nobody works under would then pin its item for as
long as the process lives. So every lock taken or given up is noted in the client's
:class:`LockLedger`, and a :class:`Reconciler` compares it with what the server holds for the
session after every reconnect and every request left in doubt, deleting the orphans.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    UnimplementedError,
)
from kazoo.protocol.states import KazooState, KeeperState

from . import paths
from .errors import LockLost, is_connection_error
from .kazoo_private import session_ephemerals, session_id
from .nodes import children, exists_many, stamp

log = logging.getLogger(__name__)

R = TypeVar("R")


class LockLedger:
    """The ephemeral locks one client's session holds as far as this process knows.

    Every place that takes or gives up a lock notes it here, so the process can tell a lock of
    its session that a thread works under from one that nobody claims (an orphan: a create or
    delete answered with ConnectionLoss that the server had in fact applied). The consumer
    registration publishes it; the consistency check and /consumers/ compare it with the
    server's locks and their ``ephemeralOwner``; the :class:`Reconciler` deletes the orphans.

    ``doubt`` holds the locks whose create or delete came back without an answer: the server
    may or may not hold them. A lock stays in doubt until a reconciliation has looked at it
    while no thread held it, even when a thread takes it meanwhile (a claim that then fails on
    it leaves it there). Only a lock in doubt may be found on the server as this session's and
    taken over by a claim: any other is another thread's work or an orphan.

    While a reconciliation runs, every lock taken or given up is also noted in ``_touched``:
    the reconciler's view of the server is from before, and it leaves such a lock alone (it may
    have been given up and taken since by another client).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}  # path -> the thread that took it
        self._doubt: set[str] = set()
        self._touched: set[str] | None = None
        self._generation = 0  # sessions lost (``forget_all``)
        self.on_doubt: Callable[[], None] | None = None  # the reconciler's wake-up

    def _touch(self, paths_: Iterable[str]) -> None:
        if self._touched is not None:
            self._touched.update(paths_)

    def claim(self, path: str) -> bool:
        """Note ``path`` as taken unless another thread of this process holds it already."""
        with self._lock:
            if path in self._held:
                return False
            self._held[path] = threading.get_ident()
            self._touch((path,))
            return True

    def claim_free(self, paths_: Iterable[str]) -> set[str]:
        """``claim`` for several locks at once: those of ``paths_`` no thread of this process
        holds are noted as this thread's and returned; the others are left to their holder.
        Called before the request creating them leaves, so that a reconciliation never takes
        one of them for an orphan, and so that a claim that then fails gives up only its own
        (another thread's lock noted as this one's would be given up with it, and a claimer
        would then take that lock, this session's own on the server, for a free one)."""
        me = threading.get_ident()
        with self._lock:
            free = {p for p in paths_ if p not in self._held}
            self._held.update((p, me) for p in free)
            self._touch(free)
        return free

    def given_up(self, paths_: Iterable[str]) -> None:
        """Note locks deleted, or not taken after all (after their request was sent)."""
        paths_ = list(paths_)
        with self._lock:
            for path in paths_:
                self._held.pop(path, None)
            self._touch(paths_)

    def in_doubt(self, paths_: Iterable[str]) -> None:
        """No thread works under these locks any more, but the server may still hold them (a
        create or delete answered with a connection error): the reconciler looks."""
        paths_ = list(paths_)
        if not paths_:
            return
        with self._lock:
            for path in paths_:
                self._held.pop(path, None)
            self._doubt.update(paths_)
            self._touch(paths_)
        if self.on_doubt is not None:
            self.on_doubt()

    def abandon_thread(self) -> list[str]:
        """The calling thread gave up what it was doing (an error escaped a claim after the
        lock was taken): its locks are left in doubt, for the reconciler. Returns them."""
        me = threading.get_ident()
        with self._lock:
            mine = [p for p, owner in self._held.items() if owner == me]
        self.in_doubt(mine)
        return mine

    def doubt_unclaimed(self, paths_: Iterable[str]) -> list[str]:
        """Put in doubt those of ``paths_`` (found on the server for this session) that no
        thread holds now, for the reconciler; a lock a thread took meanwhile is left alone.
        Returns the paths put in doubt."""
        with self._lock:
            doubted = [p for p in paths_ if p not in self._held]
            self._doubt.update(doubted)
            self._touch(doubted)
        if doubted and self.on_doubt is not None:
            self.on_doubt()
        return doubted

    def forget_all(self) -> None:
        """The session is gone, and every ephemeral lock with it."""
        with self._lock:
            self._held.clear()
            self._doubt.clear()
            self._generation += 1

    def held(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._held)

    def doubtful(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._doubt)

    def begin_check(self) -> int:
        """Start noting what is taken and given up; returns the session generation."""
        with self._lock:
            self._touched = set()
            return self._generation

    def end_check(self, checked: Iterable[str]) -> None:
        """The reconciliation is over: ``checked`` are settled unless touched meanwhile or
        held now (a thread's claim of a lock in doubt may be meeting it on the server: it is
        that claim's to take over, so the doubt stays until the lock is given up)."""
        with self._lock:
            touched = self._touched or set()
            self._doubt.difference_update(
                p for p in checked if p not in touched and p not in self._held
            )
            self._touched = None

    def generation(self) -> int:
        """How many sessions this client has lost (``forget_all``)."""
        with self._lock:
            return self._generation

    def send_if_current(
        self, zk: KazooClient, generation: int, session: int | None, send: Callable[[], R]
    ) -> R:
        """Call ``send`` (which must only queue requests) unless the session of ``generation``
        is lost or the client's session is no longer ``session``: then LockLost, nothing sent.

        Under the ledger's lock: kazoo calls the LOST listener (``forget_all``, which waits for
        this lock) before it fails the requests still queued, so a request queued here goes out
        in ``session`` or is failed with it, never sent in a new one."""
        with self._lock:
            if generation != self._generation or session_id(zk) != session:
                raise LockLost()
            return send()

    def send_deletes(
        self, zk: KazooClient, owned: dict[str, int], generation: int, session: int | None
    ) -> list[tuple[str, Any]]:
        """Send a delete of each lock of ``owned`` (path -> the version its owner read showed)
        that no thread holds and none took or gave up since the check began; returns the
        requests under way (waited for by the caller, not here).

        ``owned`` must come from a read of each node made after the check began that showed
        ``session`` as its owner (``Reconciler.reconcile``). The requests are queued under the
        ledger's lock, so a thread that claims one of these paths afterwards sends its create
        after the delete, and the server applies them in that order. Nothing is sent once the
        session of ``generation`` is lost (``send_if_current``).
        """
        sent: list[tuple[str, Any]] = []
        with self._lock:
            if generation != self._generation or session_id(zk) != session:
                return sent
            touched = self._touched or set()
            for path, version in owned.items():
                if path not in self._held and path not in touched:
                    sent.append((path, zk.delete_async(path, version=version)))
        return sent


LEDGER = LockLedger()

# Each client's ledger: the process's shared client has LEDGER (``adopt``); any other client
# (a test's second consumer, a tool's own connection) gets one of its own on first use.
_ledgers: weakref.WeakKeyDictionary[KazooClient, LockLedger] = weakref.WeakKeyDictionary()
_ledgers_lock = threading.Lock()


def locks_held() -> frozenset[str]:
    """The locks this process believes it holds (see :class:`LockLedger`)."""
    return LEDGER.held()


def ledger_of(zk: KazooClient) -> LockLedger:
    """The ledger of ``zk``'s locks, with its reconciler listening to the client's states."""
    with _ledgers_lock:
        ledger = _ledgers.get(zk)
        if ledger is None:
            ledger = _ledgers[zk] = LockLedger()
            Reconciler(zk, ledger).listen()
        return ledger


def adopt(zk: KazooClient) -> None:
    """Make LEDGER the ledger of ``zk``, the process's shared client (``client.client``)."""
    with _ledgers_lock:
        if _ledgers.get(zk) is not LEDGER:
            LEDGER.forget_all()  # a new client: what an earlier one held went with its session
            _ledgers[zk] = LEDGER
            Reconciler(zk, LEDGER).listen()


def is_item_lock(path: str) -> bool:
    """Whether ``path`` is an item's lock or a per-object lock (what the ledger keeps)."""
    if path.startswith(tuple(f"{root}/" for root in paths.OBJECT_LOCK_ROOTS)):
        return True
    return path.endswith("/lock") and path.startswith(
        (paths.JOBS + "/", paths.BATCHES + "/", paths.ACCESS + "/")
    )


def unclaimed_locks(zk: KazooClient) -> set[str]:
    """The locks the server holds for ``zk``'s session that its ledger neither holds nor has
    in doubt: one ``getEphemerals`` request (empty on a server older than 3.6, which cannot
    say). A lock met here may have been taken or given up while the answer travelled: the
    caller judges only what it meets in two checks in a row."""
    ledger = ledger_of(zk)
    try:
        ours = {p for p in session_ephemerals(zk) if is_item_lock(p)}
    except UnimplementedError:
        return set()
    return ours - ledger.held() - ledger.doubtful()


class Reconciler:
    """Deletes the locks the server holds for this client's session that no thread claims.

    It runs after the connection comes back with the session kept (CONNECTED after SUSPENDED:
    a create or delete sent just before may have been applied without an answer) and whenever a
    lock request ended in doubt, in a short-lived thread of its own (a state listener must not
    call ZooKeeper). It asks the server for the session's ephemeral nodes (``getEphemerals``,
    ZooKeeper 3.6 and later); an older server is asked about each lock in doubt instead. A run
    that meets a connection error is tried again with back-off until it is done, or until the
    session is gone (then the ledger is empty and nothing is left to do).
    """

    FIRST_DELAY = 0.2
    MAX_DELAY = 5.0

    def __init__(self, zk: KazooClient, ledger: LockLedger) -> None:
        self.zk = zk
        self.ledger = ledger
        self._lock = threading.Lock()
        self._wanted = False
        self._running = False
        self._suspended = False
        self._wake = threading.Event()

    def listen(self) -> None:
        self.ledger.on_doubt = self.request
        self.zk.add_listener(self.on_state)

    def on_state(self, state: str) -> None:
        """kazoo's connection thread: flags only, and a thread started."""
        if state == KazooState.LOST:
            self._suspended = False
            self.ledger.forget_all()
        elif state == KazooState.SUSPENDED:
            self._suspended = True
        elif state == KazooState.CONNECTED:
            self._wake.set()
            if self._suspended:
                self._suspended = False
                self.request()

    def request(self) -> None:
        """Reconcile soon (now when connected, else once the connection is back)."""
        with self._lock:
            self._wanted = True
            if self._running:
                self._wake.set()
                return
            self._running = True
        threading.Thread(target=self._run, name="lock-reconciler", daemon=True).start()

    def _run(self) -> None:
        delay = self.FIRST_DELAY
        while True:
            with self._lock:
                if not self._wanted or self.zk.client_state == KeeperState.CLOSED:
                    self._running = False
                    return
                self._wanted = False
            self._wake.clear()
            try:
                if not self.zk.connected:
                    raise ConnectionLoss("not connected")
                self.reconcile()
                if not self.ledger.doubtful():
                    delay = self.FIRST_DELAY
                    continue
                # Locks a thread took or gave up while this run looked are still in doubt: the
                # run left them alone, the next one decides.
            except Exception as exc:
                if not is_connection_error(exc):
                    log.exception("lock reconciliation failed")
            with self._lock:
                self._wanted = True
            self._wake.wait(delay)
            delay = min(delay * 2, self.MAX_DELAY)

    def reconcile(self) -> list[str]:
        """One reconciliation; returns the orphan locks it deleted.

        1. ``sync``: the server this client reads from applies every write the leader committed
           before it, this session's unanswered requests among them (a reconnect moves the
           session to the new server, and the leader refuses whatever the old one forwards
           after that). Without it a server behind the leader may still list a lock this
           session deleted, whose path another session has locked since.
        2. The session's ephemeral locks (on a server older than 3.6, the locks in doubt), then
           each one's own stat, read after the list: its owner must be this session. A list is
           no proof: a node of it may have gone, and another session's lock taken its path.
        3. The deletes, under the ledger's lock, of those no thread holds or touched since the
           check began, each at the version its read showed, in this session only.
        """
        ledger = self.ledger
        generation = ledger.begin_check()
        session = session_id(self.zk)
        doubt = ledger.doubtful()
        checked: set[str] = set()
        deleted: list[str] = []
        try:
            self.zk.sync("/")
            try:
                listed = {p for p in session_ephemerals(self.zk) if is_item_lock(p)}
            except UnimplementedError:
                listed = set(doubt)
            stats = exists_many(self.zk, sorted(listed))
            owned = {
                p: s.version
                for p, s in stats.items()
                if s is not None and session and s.ephemeralOwner == session
            }
            sent = ledger.send_deletes(self.zk, owned, generation, session)
            for path, answer in sent:
                try:
                    answer.get()
                except (NoNodeError, BadVersionError):
                    continue  # gone, or not the node read: left alone
                deleted.append(path)
            checked = {*doubt, *listed}
        finally:
            ledger.end_check(checked)
        if deleted:
            log.warning(
                "deleted %d lock(s) this session held that no thread works under: %s",
                len(deleted),
                ", ".join(deleted[:20]),
            )
        return deleted


def lock_create(zk: KazooClient, path: str) -> bool:
    """Take an item's ephemeral lock; False when another client (or another thread of this
    process) has it or the item is gone.

    A lock that exists already, belongs to this session and is in doubt (a create or a
    release answered with a connection error, which the server may have applied) is this
    caller's to work under. Any other lock of this session is some thread's work or an orphan
    the reconciler deletes, never taken over. A create answered with a connection error leaves
    the lock in doubt (the reconciler looks once the connection is back) and raises.
    """
    ledger = ledger_of(zk)
    if not ledger.claim(path):
        return False
    try:
        try:
            zk.create(path, b"", ephemeral=True)
        except NodeExistsError:
            if ours_in_doubt(zk, path):
                return True
            ledger.given_up((path,))
            return False
        except NoNodeError:
            ledger.given_up((path,))
            return False
    except Exception as exc:
        if is_connection_error(exc):
            ledger.in_doubt((path,))
        else:
            ledger.given_up((path,))
        raise
    return True


def ours_in_doubt(zk: KazooClient, path: str) -> bool:
    """Whether the existing lock ``path`` is this session's and in doubt (its create or
    release answered with a connection error that the server had applied): the only lock of
    its own session a claim takes over. Any other is another thread's work or an orphan."""
    if path not in ledger_of(zk).doubtful():
        return False
    zk.sync(path)  # the unanswered request may have landed after what this server has applied
    return lock_owned(zk, path)


def lock_owned(zk: KazooClient, path: str) -> bool:
    stat = zk.exists(path)
    return stat is not None and stat.ephemeralOwner == session_id(zk)


def lock_release(zk: KazooClient, path: str) -> None:
    """Delete the lock if this session owns it; another session's lock is left alone.

    A release that meets a connection error is left to the reconciler, which deletes the lock
    once the connection is back (or finds it gone with the session): the caller goes on.
    """
    ledger = ledger_of(zk)
    try:
        generation = ledger.generation()
        session = session_id(zk)
        if path in ledger.doubtful():
            zk.sync(path)  # see ``ours_in_doubt``
        stat = zk.exists(path)
        if session and stat is not None and stat.ephemeralOwner == session:
            # Sent only in the session just seen to own it (a new session's delete of the
            # path could meet another session's lock).
            answer = ledger.send_if_current(
                zk, generation, session, lambda: zk.delete_async(path, version=stat.version)
            )
            with contextlib.suppress(NoNodeError, BadVersionError):
                answer.get()
    except LockLost:
        pass  # the session went, and its lock with it
    except Exception as exc:
        if not is_connection_error(exc):
            ledger.given_up((path,))
            raise
        log.info("releasing %s: %s; the lock reconciler will delete it", path, exc)
        ledger.in_doubt((path,))
        return
    ledger.given_up((path,))


def lock_break(zk: KazooClient, path: str, owner: int) -> bool:
    """Remove the lock ``owner`` (a session id) holds, whatever session this is: an operator's
    repair of a lock held far too long (``queuecheck --repair --break-stale-locks``), the one
    delete of a lock that is not its owner's. Only the node the operator's check saw: a lock
    taken since by another session is left alone."""
    try:
        stat = zk.exists(path)
        if stat is None or stat.ephemeralOwner != owner:
            return False
        zk.delete(path, version=stat.version)
    except NoNodeError:
        return False
    finally:
        ledger_of(zk).given_up((path,))
    return True


@dataclass(frozen=True)
class Holds:
    queues: dict[str, datetime | None]  # every holdable queue -> when it was held, or None
    collections: dict[str, datetime]  # held profile -> when

    def queue_held(self, name: str) -> bool:
        return self.queues.get(name) is not None


def _set(zk: KazooClient, path: str) -> bool:
    try:
        zk.create(path, b"", makepath=True)
    except NodeExistsError:
        return False
    return True


def _clear(zk: KazooClient, path: str) -> bool:
    try:
        zk.delete(path)
    except NoNodeError:
        return False
    return True


def queue_hold_set(zk: KazooClient, name: str) -> bool:
    """Hold a queue ("ingest", "access-small", "access-large"); False if already held."""
    return _set(zk, paths.queue_lock(name))


def queue_hold_clear(zk: KazooClient, name: str) -> bool:
    return _clear(zk, paths.queue_lock(name))


def queue_held(zk: KazooClient, name: str) -> bool:
    return zk.exists(paths.queue_lock(name)) is not None


def collection_hold_set(zk: KazooClient, profile: str) -> bool:
    return _set(zk, paths.collection_lock(profile))


def collection_hold_clear(zk: KazooClient, profile: str) -> bool:
    return _clear(zk, paths.collection_lock(profile))


def collection_held(zk: KazooClient, profile: str) -> bool:
    """The check a consumer makes before starting work for a profile."""
    if not profile or not paths.PROFILE_RE.fullmatch(profile):
        return False
    return zk.exists(paths.collection_lock(profile)) is not None


def holds_list(zk: KazooClient) -> Holds:
    queue_paths = {name: paths.queue_lock(name) for name in paths.QUEUE_HOLDS}
    queue_stats = exists_many(zk, list(queue_paths.values()))
    names = [n for n in children(zk, paths.COLLECTION_LOCKS) if paths.PROFILE_RE.fullmatch(n)]
    coll_stats = exists_many(zk, [f"{paths.COLLECTION_LOCKS}/{n}" for n in names])
    return Holds(
        queues={
            name: stamp(s.ctime) if (s := queue_stats[path]) else None
            for name, path in queue_paths.items()
        },
        collections={
            name: stamp(s.ctime)
            for name in sorted(names)
            if (s := coll_stats[f"{paths.COLLECTION_LOCKS}/{name}"]) is not None
        },
    )
