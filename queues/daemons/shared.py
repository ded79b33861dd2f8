"""What the one-item loop (``base``) and the batched loop (``pipeline``) both use: the move a
step asks for (``Next``) or its wait (``Stay``), an item's result, a claim's session and the
session gate that fences every write made under a claim.

Kept apart so that neither loop imports the other for these: ``base`` builds the batched loop
(``pipeline``), and ``pipeline`` knows the daemon it runs only by what it asks of it
(``pipeline.PipelinedDaemon``). ``base`` re-exports every name here, so a step's daemon goes on
importing them from ``queues.daemons.base``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from queues.zk.errors import LockLost
from queues.zk.fence import Gate
from queues.zk.kazoo_private import session_id

R = TypeVar("R")


@dataclass(frozen=True)
class Next:
    """The one move a step asks for."""

    target: str
    message: str = ""
    priority: int | None = None
    permanent: bool = False
    # The step could not do its work (as opposed to a step whose result is a Failed item, like
    # a report on a batch with failed jobs): logged as "failed", and --once exits 1.
    error: bool = False
    # Records of the job's side effects that the move ends, deleted in the move's own multi
    # (``TransitionPlan.drops``).
    drops: tuple[str, ...] = ()


@dataclass(frozen=True)
class Stay:
    """The item stays where it is (it waits for a resource); it is unlocked untouched.
    ``outcome``: "waiting", or "retry" when its next try is written on it
    (``queues.core.retries``)."""

    reason: str = ""
    outcome: str = "waiting"


Step = Next | Stay


@dataclass(frozen=True)
class ItemResult:
    id: str
    step: str
    # ok | held | failed (the step failed the item) | waiting | retry (to be tried again after
    # an outage of a service outside: queues.core.retries) | dropped | skipped (not
    # processable here: left untouched)
    outcome: str
    duration: float
    detail: str = ""

    @property
    def is_error(self) -> bool:
        return self.outcome == "failed"

    def line(self) -> str:
        text = f"{self.id} {self.step} {self.outcome} {self.duration:.2f}s"
        return f"{text} {self.detail}" if self.detail else text


# A claim's session: the gate's generation and the client's session id when it was made.
Claim = tuple[int, "int | None"]


class SessionGate:
    """The ZooKeeper session as the daemons see it; fed by the client's state listener.

    Kazoo calls the listener from its connection thread, so this only flips flags. ``generation``
    counts lost sessions: a step that started in an older generation no longer holds its lock.
    """

    def __init__(self) -> None:
        self._connected = threading.Event()
        self._connected.set()
        self._lock = threading.Lock()
        self.generation = 0

    def on_state(self, state: str) -> None:
        if state == "CONNECTED":
            self._connected.set()
            return
        self._connected.clear()
        if state == "LOST":
            with self._lock:
                self.generation += 1

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def fence(self, zk: Any, generation: int, session: int | None) -> Gate:
        """The gate of a claim made in ``generation`` of the client's session ``session``:
        ``send_if_current`` that also refuses once the client's session is another. Every
        write a step makes for its job goes through it (``queues.zk.fence``), as its move does.
        """

        def gate(send: Callable[[], Any]) -> Any:
            def in_session() -> Any:
                if session_id(zk) != session:
                    raise LockLost()
                return send()

            return self.send_if_current(generation, in_session)

        return gate

    def send_if_current(self, generation: int, send: Callable[[], R]) -> R:
        """Run ``send`` unless a session was lost since ``generation``: then LockLost, and
        nothing is sent.

        The client calls ``on_state("LOST")`` before it fails the requests still queued for the
        expired session, and ``on_state`` waits for this lock: a request sent here either goes
        out in the session that holds the locks or is failed with it, never sent in a new one.
        So ``send`` must only hand requests to the client (kazoo's ``*_async`` calls) and
        return their answers unread: waiting for an answer here would keep the connection
        thread from failing it, and both would wait for ever.
        """
        with self._lock:
            if self.generation != generation:
                raise LockLost()
            return send()
