"""The shared consumer loop: claim one item (ephemeral lock) -> run its step -> one move -> unlock.

Every daemon is a subclass that says how to claim, what the step does and how to move its kind
of item (job, batch, access request). The loop itself knows nothing about the steps:

- ``run_once()`` claims at most one item and returns whether there may be more work right away;
- ``run(stop)`` repeats it, waiting ``poll`` seconds when idle, until ``stop`` is set;
- a queue hold, or a suspended ZooKeeper connection, stops claiming (the item in hand finishes);
- a lost session drops every lock this process held (ZooKeeper removed them): the step in hand
  re-takes its item's lock before moving it, or leaves the item to whoever took it meanwhile;
- an exception in a step fails that item with ``"<step>: <reason>"`` as its message; the daemon
  goes on. A ZooKeeper connection error fails nothing: the item is simply claimed again later;
- an item this console cannot work on at all (a job written by Merritt's ingest, whose payload
  is on ingest's own disk: ``unprocessable``, or a step raising :class:`NotProcessable`) is
  unlocked untouched, neither moved nor failed, with one log line; the daemon then passes it
  over until it changes (its status, or a job's configuration), so it never spins on it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Generic, TypeVar

from django.db import close_old_connections

from queues.core import retries, transient
from queues.core.retries import RETRY_KEY, service_at
from queues.core.states import AccessState, JobState
from queues.services import moves
from queues.steps.submission import processing_problem
from queues.zk import paths as zpaths
from queues.zk.access import access_acquire, access_transition, access_unlock
from queues.zk.batches import (
    CompletionCheck,
    batch_transition,
    batch_try_acquire,
    batch_unlock,
    batches_in_state,
)
from queues.zk.batchstates import BatchStates, batch_states
from queues.zk.client import client
from queues.zk.errors import (
    Conflict,
    InvalidID,
    InvalidTransition,
    NotFound,
    StaleVersion,
    is_connection_error,
)
from queues.zk.fence import current_gate, fenced
from queues.zk.jobs import JobClaimer, job_load, job_unlock, transition_apply, transition_plan
from queues.zk.kazoo_private import session_id
from queues.zk.locks import ledger_of, lock_create, queue_held
from queues.zk.maintenance import held_services, held_services_watch
from queues.zk.pipeline import Parking
from queues.zk.records import AccessRequest, Batch, Job
from queues.zk.servertime import server_now, server_now_known
from queues.zk.watch import ChangeSignal, PresenceWatch

from .breakers import breakers, note_outage, outlived, outlived_from
from .completions import REPORTING_MOVES
from .fetching import depositor_server
from .pipeline import LOCK_LOST, JobPipeline, LockKeeper, LockLost
from .retrying import RetryWaits, retry_later

# The step daemons (and tests) import these from here: they are defined in ``shared`` so that
# the batched loop (``pipeline``) can use them without importing this module.
from .shared import Claim, ItemResult, Next, SessionGate, Stay, Step
from .waiting import RetryScreen

log = logging.getLogger("queues.daemons")

# A job moved to one of these may complete its batch (``JobDaemon.after``); none other can.
_BATCH_ENDS = frozenset({JobState.COMPLETED, JobState.FAILED})

DEFAULT_POLL = 5.0
T = TypeVar("T", Job, Batch, AccessRequest)


class StepFailed(Exception):
    """A step that cannot do its work; ``permanent`` means a resume cannot help either."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class NotProcessable(Exception):
    """This console's daemons cannot work on the item at all (e.g. a job written by Merritt's
    ingest: no ``payload_url``, its payload on ingest's own disk). It is unlocked untouched, not
    moved and not failed, and passed over until it changes."""


NOT_PROCESSABLE = "not processable by this console's daemons"
SKIP_MEMORY = 10_000  # items remembered as passed over, per daemon


def describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 2000 else text[:1997] + "..."


class WakeSignal:
    """An idle loop's signal whose watches are set by the loop's own reads (a batch daemon's
    ``BatchStates``), not by arming it: it is always armed, and waiting on it waits for
    ``event``, set by those watches (and by a hold's), or the timeout."""

    armed = True

    def __init__(self, event: threading.Event) -> None:
        self._event = event

    def arm(self) -> None:
        return None

    def wait(self, stop: threading.Event, timeout: float) -> bool:
        """As ``ChangeSignal.wait``: until ``event`` is set, ``stop`` is or ``timeout`` passes;
        whether ``event`` was set."""
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._event.wait(min(remaining, 0.25)):
                break
        changed = self._event.is_set()
        self._event.clear()
        return changed


class Daemon(ABC, Generic[T]):
    """One consumer daemon. Subclasses set ``name``/``step`` and implement the hooks."""

    name: ClassVar[str]
    step: ClassVar[str]  # the word in log lines and failure messages
    # The queue hold that stops this daemon claiming (None: never held).
    queue_hold: ClassVar[str | None] = "ingest"
    claims: ClassVar[bool] = True  # it claims items: a drain of its process stops it
    # Set by the runner's Host: registration, drain and step history (registration.py).
    observer: Any = None

    def __init__(
        self, *, zk: Any = None, gate: SessionGate | None = None, poll: float = DEFAULT_POLL
    ) -> None:
        self.zk = zk if zk is not None else client()
        self.gate = gate or SessionGate()
        self.poll = poll
        self._backoff: transient.Backoff | None = None
        self.last: ItemResult | None = None
        # Items passed over as not processable: id -> their fingerprint when they were.
        self.skipped: dict[str, object] = {}
        self.loop_started = threading.Event()  # set once its loop has said that it started
        # The queue hold as a watch last saw it (a daemon whose loop sets one up: ``idle_signal``)
        self._hold_watch: PresenceWatch | None = None

    @classmethod
    def default_copies(cls) -> int:
        """Loops of this daemon a process runs at least (``--threads`` may ask for more)."""
        return 1

    # Hooks --------------------------------------------------------------------------------

    @abstractmethod
    def claim(self) -> T | None:
        """Lock and return one item to work on, or None."""

    @abstractmethod
    def work(self, item: T) -> Step:
        """Do the step's work; raise to fail the item."""

    @abstractmethod
    def item_id(self, item: T) -> str: ...

    @abstractmethod
    def lock_path(self, item: T) -> str: ...

    @abstractmethod
    def move(self, item: T, step: Next) -> bool:
        """The one transition; Conflict when the item changed meanwhile.

        Returns True when the transition also deleted the item's lock.
        """

    @abstractmethod
    def unlock(self, item: T) -> None: ...

    def prepare(self, item: T) -> T:
        """Runs before ``work``; may move the item into a working state and return it anew."""
        return item

    def after(self, item: T, step: Next) -> None:
        """Work that follows a successful move (cleanup, batch completion)."""

    def not_moved(self, item: T, exc: Exception) -> None:
        """A move refused (``exc``: Conflict, InvalidTransition, NotFound): nothing by default;
        the item is given back and claimed again as any other."""

    def wake_path(self) -> str | None:
        """A folder whose children changing means new work: the idle loop wakes on it."""
        return None

    def unprocessable(self, item: T) -> str | None:
        """Why this console cannot work on ``item`` at all (it is then left untouched), or None."""
        return None

    def fingerprint(self, item: T) -> object:
        """What must change before an item passed over as not processable is looked at again."""
        return item.status.version

    def passed_over(self, ident: str, fingerprint: object) -> bool:
        return ident in self.skipped and self.skipped[ident] == fingerprint

    # The loop -----------------------------------------------------------------------------

    def claiming_allowed(self) -> bool:
        if not self.gate.connected or (self.observer is not None and self.observer.draining):
            return False
        if not self.queue_hold:
            return True
        if self._hold_watch is not None:
            present = self._hold_watch.present()
            if present is not None:
                return not present
        return not queue_held(self.zk, self.queue_hold)

    def run_once(self) -> bool:
        """Claim and handle at most one item; True when it is worth looking again at once."""
        self.last = None
        if not self.claiming_allowed():
            return False
        # The session the claim is made in, taken before it: a session lost meanwhile fences
        # the step's writes off (a lock the claim took in a newer session is then given up).
        claim = (self.gate.generation, session_id(self.zk))
        item = self.claim()
        if item is None:
            return False
        if self.passed_over(self.item_id(item), self.fingerprint(item)):
            # Claimed again unchanged (a daemon with a claim of its own): give it back quietly.
            self._unlock_quietly(item)
            return False
        result = self.handle(item, claim)
        self.last = result
        self.log_result(result)
        return result.outcome not in ("waiting", "dropped")

    def wake_on(self, event: threading.Event) -> None:
        """Have ``event`` set when what keeps this daemon's items waiting may have gone (a
        hold released): its idle loop then looks again at once, not at its next poll."""

    def idle_signal(self, wake: threading.Event) -> ChangeSignal | WakeSignal | None:
        """What the idle loop waits on (``run``), its changes setting ``wake``: by default the
        children watch of ``wake_path``; None: only the poll."""
        path = self.wake_path()
        return ChangeSignal(self.zk, path, wake) if path else None

    def idle_wait(self) -> float:
        """How long the idle loop waits for its signal before it looks again anyway."""
        return self.poll

    def idle_end(self, wake: threading.Event) -> None:
        """The loop has stopped: what ``idle_signal`` set up for ``wake`` goes."""

    def run(self, stop: threading.Event) -> None:
        log.info("%s: started (poll %.1fs)", self.name, self.poll)
        self.loop_started.set()
        wake = threading.Event()
        signal = self.idle_signal(wake)
        self.wake_on(wake)
        while not stop.is_set():
            if self._run_once_logged():
                continue
            if signal is None:
                stop.wait(self.idle_wait())
                continue
            if not signal.armed:
                # The watch is set only once there is nothing to do: on a busy folder it would
                # fire at every change, and setting it lists the whole folder each time. Work
                # that arrived between the empty claim and the watch is found by one more claim.
                signal.arm()
                if self._run_once_logged():
                    continue
            signal.wait(stop, self.idle_wait())
        self.idle_end(wake)
        log.info("%s: stopped", self.name)

    def _run_once_logged(self) -> bool:
        """``run_once`` for the long-running loop: an error is logged and counts as idle."""
        try:
            return self.run_once()
        except Exception as exc:
            if is_connection_error(exc):
                log.warning("%s: ZooKeeper unavailable: %s", self.name, describe(exc))
            else:
                log.exception("%s: unexpected error outside a step", self.name)
            # An error that escapes a claim after its lock was taken (the item's read, a
            # daemon's own check) leaves nobody working under the lock: the reconciler
            # deletes it if the server holds it, instead of it pinning the item.
            ledger_of(self.zk).abandon_thread()
            return False
        finally:
            # Long-lived threads must not keep a broken or stale database connection.
            close_old_connections()

    def handle(self, item: T, claim: Claim | None = None) -> ItemResult:
        """Step ``item`` and move it; ``claim``: the session generation and id it was claimed
        in (by default, the current ones)."""
        if claim is None:
            claim = (self.gate.generation, session_id(self.zk))
        if self.observer is None:
            return self._handle(item, claim)
        token = self.observer.begin(self, item)
        result = None
        try:
            result = self._handle(item, claim)
            return result
        finally:
            self.observer.end(token, result)

    def run_step(
        self, item: T, started: float, claim: Claim
    ) -> tuple[T, Next | None, ItemResult | None]:
        """Everything of one item up to its move: the item as ``prepare`` left it, and the move
        asked for or the result of an item that ends here (skipped, dropped, waiting; the caller
        unlocks those). ``claim``: the session generation and id the item's lock was taken in;
        every write the step makes for the item is fenced by it (``queues.zk.fence``)."""
        try:
            with fenced(self.gate.fence(self.zk, *claim)):
                return self._run_step(item, started)
        except LockLost:
            ident = self.item_id(item)
            return item, None, self._result(ident, "dropped", started, LOCK_LOST)

    def _run_step(self, item: T, started: float) -> tuple[T, Next | None, ItemResult | None]:
        ident = self.item_id(item)
        reason = self.unprocessable(item)
        if reason:
            return item, None, self._skip(item, reason, started)
        try:
            item = self.prepare(item)
        except (Conflict, InvalidTransition, NotFound) as exc:
            return (
                item,
                None,
                self._result(ident, "dropped", started, f"not started: {describe(exc)}"),
            )
        except NotProcessable as exc:
            return item, None, self._skip(item, describe(exc), started)
        except LockLost:
            raise
        except Exception as exc:
            # An outage met while preparing waits like one met in the step; anything else is
            # the loop's error, as before.
            stay = self.failure(item, exc) if transient.is_transient(exc) else None
            if not isinstance(stay, Stay):
                raise
            return item, None, self._result(ident, "waiting", started, stay.reason)
        try:
            step = self.work(item)
        except NotProcessable as exc:
            return item, None, self._skip(item, describe(exc), started)
        except LockLost:
            raise  # the claim's session is gone: ``run_step`` drops the item
        except (Conflict, StaleVersion) as exc:
            # A fenced write of the step found the job changed meanwhile (an operator's move):
            # theirs wins, as for the move.
            return item, None, self._result(ident, "dropped", started, f"not moved: {exc}")
        except Exception as exc:
            if is_connection_error(exc):
                return (
                    item,
                    None,
                    self._result(ident, "dropped", started, f"ZooKeeper: {describe(exc)}"),
                )
            step = self.failure(item, exc)
        else:
            self.worked(item)
            backoff = transient.backoff_of(self) if self._backoff is None else self._backoff
            self._backoff = backoff  # looked up once: the batched loop runs thousands a second
            if backoff.failures and backoff.clear():
                log.info("%s: working again: the outage it waited for is over", self.name)
        if isinstance(step, Stay):
            return item, None, self._result(ident, step.outcome, started, step.reason)
        return item, step, None

    def worked(self, item: T) -> None:
        """The step went through for ``item`` (whatever it asked for next)."""

    def moved_result(self, ident: str, step: Next, started: float) -> ItemResult:
        outcome = "failed" if step.error else "held" if step.target == JobState.HELD else "ok"
        detail = f"-> {step.target}" + (f": {step.message}" if step.message else "")
        return self._result(ident, outcome, started, detail)

    def log_result(self, result: ItemResult) -> None:
        level = logging.WARNING if result.outcome == "skipped" else logging.INFO
        if log.isEnabledFor(level):  # a batched loop logs thousands a second
            log.log(level, "%s", result.line())

    def log_moved(self, results: list[ItemResult]) -> None:
        """The jobs one move took on, each step gone through: one line for those sent to the
        same place (``<step> ok -> <state>: <n> jobs: <id> <seconds>s, ...``), or each job's
        own line when it went alone; as well the jobs of a task whose steps were not begun, one
        line for those alike (``<step> waiting <service> held: <n> jobs: ...``). A batched loop
        moves thousands of jobs a second, and a log
        record a job was a third of its process's CPU (docs/benchmarks.md)."""
        if not log.isEnabledFor(logging.INFO):
            return
        alike: dict[tuple[str, str], list[ItemResult]] = {}
        for result in results:
            alike.setdefault((result.outcome, result.detail), []).append(result)
        for (outcome, detail), together in alike.items():
            if len(together) == 1:
                log.info("%s", together[0].line())
                continue
            jobs = ", ".join(f"{r.id} {r.duration:.2f}s" for r in together)
            step = together[0].step
            log.info("%s %s %s: %d jobs: %s", step, outcome, detail, len(together), jobs)

    def _handle(self, item: T, claim: Claim) -> ItemResult:
        started = time.monotonic()
        generation = claim[0]
        ident = self.item_id(item)
        released = False
        try:
            item, step, ended = self.run_step(item, started, claim)
            if ended is not None:
                return ended
            assert step is not None
            if self.gate.generation != generation:
                # The session was lost during the step: our lock is gone. Take it back, or
                # leave the item to the consumer that took it meanwhile.
                retaken = (self.gate.generation, session_id(self.zk))
                if not lock_create(self.zk, self.lock_path(item)):
                    return self._result(ident, "dropped", started, LOCK_LOST)
                claim = retaken
                generation = retaken[0]
            try:
                # The move goes out in the session that holds the lock, or not at all: sent
                # in a newer one, its delete of the lock would take another consumer's.
                with fenced(self.gate.fence(self.zk, *claim)):
                    released = self.move(item, step)
            except LockLost:
                return self._result(ident, "dropped", started, LOCK_LOST)
            except (Conflict, InvalidTransition, NotFound) as exc:
                # An operator (or another client) moved the item meanwhile: theirs wins.
                self.not_moved(item, exc)
                return self._result(ident, "dropped", started, f"not moved: {describe(exc)}")
            try:
                self.after(item, step)
            except Exception as exc:
                log.warning("%s %s: after %s: %s", ident, self.step, step.target, describe(exc))
            return self.moved_result(ident, step, started)
        finally:
            if self.gate.generation == generation and not released:
                try:
                    self.unlock(item)
                except Exception as exc:
                    # The lock is ephemeral: if it cannot be deleted now it goes with the session.
                    log.warning("%s %s: unlock failed: %s", ident, self.step, describe(exc))

    def _skip(self, item: T, reason: str, started: float) -> ItemResult:
        """Leave ``item`` as it is (``handle`` unlocks it) and pass it over until it changes."""
        if len(self.skipped) >= SKIP_MEMORY:
            self.skipped.clear()
        self.skipped[self.item_id(item)] = self.fingerprint(item)
        return self._result(self.item_id(item), "skipped", started, f"{NOT_PROCESSABLE}: {reason}")

    def _unlock_quietly(self, item: T) -> None:
        try:
            self.unlock(item)
        except Exception as exc:
            log.warning("%s %s: unlock failed: %s", self.item_id(item), self.step, describe(exc))

    def failure(self, item: T, exc: Exception) -> Step:
        """What a step's exception means for its item: Failed, with the reason as its message,
        unless an outage caused it (the database away or locked, the working disk full). Then
        the item stays where it is, to be tried again: this loop waits a back-off first (growing
        while the outage lasts, short enough that a stop is never held up long), and a thread's
        broken database connection is closed so the next try opens a fresh one."""
        if transient.is_transient(exc):
            why = transient.reason(exc)
            if transient.is_database_outage(exc):
                close_old_connections()
            backoff = transient.backoff_of(self)
            if backoff.failures == 0:
                log.warning("%s: %s; items wait in their step until it is back", self.name, why)
            transient.pause(backoff.next_delay())
            return Stay(why)
        if isinstance(exc, StepFailed):
            log.debug("%s %s failed", self.item_id(item), self.step, exc_info=True)
        else:
            log.warning("%s %s raised", self.item_id(item), self.step, exc_info=True)
        permanent = isinstance(exc, StepFailed) and exc.permanent
        return Next(
            JobState.FAILED, f"{self.step}: {describe(exc)}", permanent=permanent, error=True
        )

    def _result(self, ident: str, outcome: str, started: float, detail: str = "") -> ItemResult:
        return ItemResult(ident, self.step, outcome, time.monotonic() - started, detail)

    result = _result


class PeriodicDaemon(Daemon[Any]):
    """A daemon that claims no item: it does one round of its work every ``every()`` seconds
    (retention's sweep, the maintenance windows, the alert rules). A round that fails on
    ZooKeeper is logged as an outage and tried again at the next round; the loop never ends on
    an error."""

    queue_hold: ClassVar[str | None] = None  # nothing it does is stopped by a held queue
    claims: ClassVar[bool] = False  # a drain does not stop it
    round_name: ClassVar[str] = "round"
    _stop: threading.Event | None = None  # the loop's stop, for a round that checks it

    def every(self) -> float:
        raise NotImplementedError

    def tick(self) -> bool:
        """One round; False when it could not run (not connected): then the next comes after
        ``poll`` seconds rather than a whole interval."""
        raise NotImplementedError

    def stopping(self) -> None:
        """Called once the loop has stopped (a leader resigns here)."""

    def run(self, stop: threading.Event) -> None:
        self._stop = stop
        every = self.every()
        log.info("%s: started (a %s every %gs)", self.name, self.round_name, every)
        self.loop_started.set()
        while not stop.is_set():
            ran = True
            try:
                ran = self.tick()
            except Exception as exc:
                if is_connection_error(exc):
                    log.warning("%s: ZooKeeper unavailable: %s", self.name, describe(exc))
                else:
                    log.exception("%s: unexpected error in a %s", self.name, self.round_name)
            finally:
                close_old_connections()
            stop.wait(every if ran else min(every, self.poll))
        self.stopping()
        log.info("%s: stopped", self.name)

    # The consumer hooks: it claims nothing, so none of them is ever called.

    def claim(self) -> None:
        return None

    def work(self, item: Any) -> Step:
        return Next(str(item))

    def item_id(self, item: Any) -> str:
        return str(item)

    def lock_path(self, item: Any) -> str:
        raise NotImplementedError(f"{self.name} takes no item lock")

    def move(self, item: Any, step: Next) -> bool:
        raise NotImplementedError(f"{self.name} moves no item")

    def unlock(self, item: Any) -> None:
        return None


# How long a loop passes over a job whose batch is gone before it tries the job again (an
# operator may have put the batch back meanwhile).
ORPHAN_WAIT = 600.0


class JobDaemon(Daemon[Job]):
    """A daemon working on the jobs of one state, in priority order.

    ``run`` uses the batched loop (``queues.daemons.pipeline``) when the daemon takes more than
    one job per claim (``batch``) or shares a ``LockKeeper`` with the next step's daemon in the
    same process, unless a subclass claims or handles its jobs its own way; ``run_once`` always
    handles one job.
    """

    state: ClassVar[str]
    # Jobs one claim takes at most (one lock multi, one read, one move multi for all of them).
    batch: ClassVar[int] = 1
    # The step waits on servers outside (a depositor's, a callback's receiver): in the batched
    # loop it runs in threads of its own, the jobs of one server (``server_of``) one after
    # another, so a slow or silent server holds up only its own jobs, not the other servers'
    # jobs of this step nor the other loops sharing the loop's thread.
    steps_elsewhere: ClassVar[bool] = False
    _claimer: JobClaimer | None = None

    def __init__(
        self,
        *,
        batch: int | None = None,
        keeper: LockKeeper | None = None,
        strict: bool = False,
        workers: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.batch_size = max(1, batch if batch is not None else type(self).batch)
        self.keeper = keeper
        # A step as long as its object (``runner.LONG_STEPS``) in the batched loop: its jobs'
        # steps run in this many threads of the loop's own, and a claim takes no more jobs
        # than those threads can begin soon (``JobPipeline`` says how). 0: not such a loop.
        self.workers = max(0, workers)
        self.strict = strict  # claim exactly in run order (no spreading after lost races)
        self._deferred: set[str] | None = None
        # Jobs waiting for their next try (``failure``), or for a held service (``_accept``).
        self.retry_waits = RetryWaits(
            held=lambda: held_services(self.zk), clock=lambda: server_now(self.zk)
        )
        # Jobs whose move found their batch gone (``not_moved``), with that batch: looked at
        # again after ORPHAN_WAIT, their batch is read before their step runs again.
        self.orphans: dict[str, str] = {}

    def batched(self) -> bool:
        """Whether ``run`` uses the batched loop."""
        cls = type(self)
        plain = (
            cls.claim is JobDaemon.claim
            and cls.handle is Daemon.handle
            and cls.run_once is Daemon.run_once
        )
        return plain and (self.batch_size > 1 or self.keeper is not None or self.workers > 0)

    def run(self, stop: threading.Event) -> None:
        if not self.batched():
            super().run(stop)
            return
        self.pipeline().run(stop)

    def pipeline(self) -> JobPipeline:
        """The batched loop this daemon runs in (when ``batched()``)."""
        pipeline = JobPipeline(self, keeper=self.keeper)
        pipeline.listing.skip = self.unclaimed_skip()
        pipeline.listing.screen = self.listing_screen()
        pipeline.listing.parking = self.listing_parking()
        self.wake_on(pipeline.wake)
        return pipeline

    def wake_on(self, event: threading.Event) -> None:
        """A service's hold released wakes the loop: the jobs it passes over for that service
        (``RetryWaits.note_held``) are due. The held services' watch is set up now, as the loop
        starts, not at the first job it looks at: a job claimed before the watch's first answer
        is taken as if nothing were held, and meets the outage."""
        held_services_watch(self.zk).subscribe(event)

    def let_go(self, jids: list[str]) -> None:
        """The batched loop no longer has these jobs in hand (their locks given back, or left to
        the lock reconciler): what was taken with them (``accept``) is given back."""

    def listing_screen(self) -> Callable[[list[str]], list[str]] | None:
        """What the batched loop's listing passes over, given a whole listing (by default
        nothing): what ``unclaimed_screen`` reads in bulk but the jobs waiting for a later try,
        which the batched loop knows by ID (``unclaimed_skip``)."""
        return None

    def listing_parking(self) -> Parking | None:
        """Where the batched loop's listing keeps the jobs it passes over for a reason that
        ends for many at once, to take them up again without listing the folder (by default
        nowhere: they wait for the next listing)."""
        return None

    def unclaimed_skip(self) -> Callable[[str], bool]:
        """What the listings pass over by ID: the jobs waiting for their next try (false, and
        so never called, while there are none)."""
        return self.retry_waits

    def unclaimed_screen(self) -> Callable[[list[str]], list[str]] | None:
        """What the one-job loop's listing passes over, given the whole listing: the jobs
        waiting for a later try, read in bulk once this loop knows of one (``RetryScreen``)."""
        return RetryScreen(self.zk, self.retry_waits)

    def waits_unclaimed(self, jid: str) -> bool:
        """Whether to pass ``jid`` over unclaimed, by its ID alone: it waits for its next try."""
        return self.retry_waits.waits(jid)

    def accept(self, job: Job) -> bool:
        """Whether to take this job now (checked under its lock)."""
        return True

    def would_take(self, job: Job, taking: Counter[str]) -> bool:
        """Whether this loop would take ``job`` now, handed over with its lock by the loop
        before it; ``taking``: the jobs handed to it so far in the same move, counted by what
        limits them, which this adds the job to when it says yes. By default yes."""
        return True

    def claim_limit(
        self, kept: dict[str, str], known: dict[str, Job]
    ) -> Callable[[str], bool] | None:
        """What the batched loop's next take asks of each job it would claim, in run order:
        whether it may (``StateListing.take``'s ``limit``); ``kept``: the jobs this loop holds
        the locks of, ``known`` those of them as handed over. By default: not those this loop
        passes over for now (``retry_waits``: a later try, a batch gone), while there are any."""
        waits = self.retry_waits
        if not waits:
            return None
        return lambda jid: not waits.waits(jid)

    def claim(self) -> Job | None:
        if self._claimer is None:
            self._claimer = JobClaimer(
                self.zk,
                self.state,
                strict=self.strict,
                skip=self.unclaimed_skip(),
                screen=self.unclaimed_screen(),
            )
        return self._claimer.claim(self._accept)

    def payload_service(self, item: Job) -> tuple[str, ...]:
        """The depositor's server the payload URL names, as its outages are named."""
        url = item.configuration.get("payload_url")
        if isinstance(url, str) and url.lower().startswith(("http://", "https://")):
            return (service_at("depositor", url),)
        return ()

    def services_of(self, item: Job) -> tuple[str, ...]:
        """The services outside this step talks to for ``item``, as outages name them
        (``queues.core.retries``): a held one keeps the job waiting, unclaimed, before the step;
        one that went through ends its breaker's run of failures."""
        return ()

    def worked(self, item: Job) -> None:
        for service in self.services_of(item):
            breakers().worked(service)

    def _accept(self, job: Job) -> bool:
        if job.status.raw.get(RETRY_KEY) is not None and self.retry_waits.due_later(job):
            return False  # another process's wait for a retry: passed over from now on
        if self.held_back(job):
            return False
        # The fingerprint (a hash of the configuration) only for a job passed over before.
        if job.jid in self.skipped and self.passed_over(job.jid, self.fingerprint(job)):
            return False
        if job.jid in self.orphans and (
            self.retry_waits.waits(job.jid) or self._still_orphaned(job)
        ):
            return False  # (waits: a batch-mate's read just now found the batch still gone)
        return self.accept(job)

    wants = _accept

    def held_back(self, job: Job) -> str:
        """The services ``job`` needs that are held now (its breaker's, or an operator's),
        comma-separated; "" when none holds it back (``outlived``). A job held back is passed
        over by its ID from then on while the hold stands, up to the moment its retry window
        for a depositor's or callback receiver's server closes (``outlived_from``). Asked
        under the job's lock, and again just before its step (a breaker opened meanwhile)."""
        held = held_services(self.zk)
        if not held:
            return ""
        waiting_on = [service for service in self.services_of(job) if service in held]
        if not waiting_on:
            return ""
        # The server's clock, as the job's times; from the last sample, without a request
        # (asked just before a step too, by a thread that must not wait on ZooKeeper).
        now = server_now_known(self.zk)
        if outlived(self.zk, job.status.raw, waiting_on, now=now):
            return ""
        until = outlived_from(job.status.raw, waiting_on, now=now)
        self.retry_waits.note_held(job.jid, waiting_on, until)
        return ", ".join(waiting_on)

    def unprocessable(self, item: Job) -> str | None:
        return processing_problem(item.configuration)

    def server_of(self, item: Job) -> str:
        """The server outside that the job's step waits on (``steps_elsewhere``): by default
        the depositor's host and port as the payload URL names them (``depositor_server``; not
        resolved, so the loop's thread makes no lookup)."""
        url = item.configuration.get("payload_url")
        try:
            return depositor_server(url) if isinstance(url, str) else ""
        except ValueError:  # not a URL: the step fails the job at once
            return ""

    def failure(self, item: Job, exc: Exception) -> Step:
        """As ``Daemon.failure``; and when a service outside could not answer now
        (``queues.core.retries``), the job is given back to be tried again after a back-off, its
        next try written on its status, until the service's retry policy is spent. Only then
        does it go to Failed, with the reason of every try."""
        outage = retries.outage_of(exc)
        if outage is None:
            return super().failure(item, exc)
        note_outage(self.zk, outage)
        try:
            again, message, until = retry_later(self.zk, item, self.step, outage, describe(exc))
        except (Conflict, StaleVersion) as exc2:
            # The lock or the status changed since the claim: the job is not ours to write.
            return Stay(f"not tried again: {describe(exc2)}")
        if not again:
            return Next(JobState.FAILED, message, error=True)
        self.retry_waits.note(item.jid, until)
        return Stay(message, outcome="retry")

    def slow_key(self, item: Job) -> str:
        """What the job's step asks of its server (``steps_elsewhere``), by which its slowness
        is judged apart from the server's other jobs': by default the payload URL."""
        url = item.configuration.get("payload_url")
        return url if isinstance(url, str) else ""

    def fingerprint(self, item: Job) -> object:
        config = json.dumps(item.configuration, sort_keys=True, default=str).encode()
        return (item.status.version, hashlib.sha256(config).hexdigest())

    def wake_path(self) -> str | None:
        return zpaths.job_state_folder(self.state)

    def item_id(self, item: Job) -> str:
        return item.jid

    def lock_path(self, item: Job) -> str:
        return zpaths.job_node(item.jid, "lock")

    def move(self, item: Job, step: Next) -> bool:
        # The lock goes in the move's own transaction: one round trip fewer per job and step.
        # As the batched loop's: sent through the claim's gate (``handle`` puts it in force),
        # and nothing written once the lock is gone.
        plan = transition_plan(
            item,
            step.target,
            message=step.message,
            permanent=step.permanent,
            priority=step.priority,
            lock="release",
            drops=step.drops,
        )
        transition_apply(self.zk, plan, require_lock=True, gate=current_gate())
        return True

    def unlock(self, item: Job) -> None:
        job_unlock(self.zk, item)

    def not_moved(self, item: Job, exc: Exception) -> None:
        """A job whose batch is gone cannot move (a move writes the batch's index too): it is
        passed over for ORPHAN_WAIT, its step not run again and again for nothing, and the log
        says why. Its batch is read only here, after a move found something gone."""
        if not isinstance(exc, NotFound) or str(exc) == LOCK_LOST:
            return  # a lost session's moves: nothing of the job's batch to learn
        try:
            gone = self.zk.exists(zpaths.batch(item.bid)) is None
        except InvalidID:
            gone = True
        except Exception:  # ZooKeeper away: the next claim finds out
            return
        if gone:
            self._orphaned(item, "is gone, so it cannot move")

    def _orphaned(self, item: Job, why: str) -> None:
        if len(self.orphans) >= RetryWaits.LIMIT:
            self.orphans.clear()  # one forgotten has its step run once more: no worse
        self.orphans[item.jid] = item.bid
        self.retry_waits.note_in(item.jid, ORPHAN_WAIT)
        log.warning(
            "%s %s: its batch %s %s; passed over for %.0f s "
            "(the consistency check lists it as job-without-batch)",
            item.jid,
            self.step,
            str(item.bid)[:40],
            why,
            ORPHAN_WAIT,
        )

    def _still_orphaned(self, job: Job) -> bool:
        """Whether the batch of a job found orphaned before is still gone: then its step is not
        run again (a download, a storage add) only for its move to fail once more, and the
        other jobs known here of that batch wait with it, unclaimed: one read a batch, not one
        a job. ZooKeeper away, the step goes ahead as it would."""
        try:
            gone = self.zk.exists(zpaths.batch(job.bid)) is None
        except InvalidID:
            gone = True
        except Exception:
            return False
        mates = [jid for jid, bid in self.orphans.items() if bid == job.bid and jid != job.jid]
        if not gone:  # back: its jobs go on, those waiting here at their next claim
            for jid in [job.jid, *mates]:
                self.orphans.pop(jid, None)
                self.retry_waits.forget(jid)
            return False
        self._orphaned(job, f"is still gone, so its step is not run again (nor {len(mates)} more)")
        for jid in mates:
            self.retry_waits.note_in(jid, ORPHAN_WAIT)
        return True

    def after(self, item: Job, step: Next) -> None:
        if step.target in _BATCH_ENDS:
            if self._deferred is not None:
                self._deferred.add(item.bid)
            else:
                moves.batch_complete_if_done(bid=item.bid)

    def after_move(self, item: Job, step: Next) -> set[str]:
        """``after`` for the batched loop: the batches to check once the whole batch moved."""
        self._deferred = set()
        try:
            self.after(item, step)
        except Exception as exc:
            log.warning("%s %s: after %s: %s", item.jid, self.step, step.target, describe(exc))
        finally:
            deferred, self._deferred = self._deferred, None
        return deferred

    def ask_completion(self, bids: set[str]) -> CompletionCheck | None:
        """Send the completion check of the batches whose jobs a batched move finished; its
        answers are taken later (``batches_done``), so the loop does not wait for them."""
        if not bids:
            return None
        try:
            return CompletionCheck(self.zk, sorted(bids))
        except Exception as exc:
            self._completion_failed(bids, exc)
            return None

    def batches_done(self, check: CompletionCheck) -> None:
        """The answers of ``ask_completion``: the complete batches go on to Reporting, moved by
        the process's mover (``completions``), not in the loop's thread."""
        try:
            complete = check.complete()
        except Exception as exc:
            self._completion_failed((b for b, _answer in check.asked), exc)
            return
        REPORTING_MOVES.hand(self.zk, self.step, complete)

    def _completion_failed(self, bids: Iterable[str], exc: Exception) -> None:
        log.warning(
            "%s %s: batch completion: %s", ", ".join(sorted(bids)), self.step, describe(exc)
        )

    def reload(self, job: Job) -> Job:
        """The job as it is now (a step that wrote optional nodes and needs them back)."""
        return job_load(self.zk, job.jid)


class BatchDaemon(Daemon[Batch]):
    """A daemon working on the batches of one state, oldest first.

    Which batches are in the state is known only from each open batch's status. One read of
    them all gives the candidates, which the following claims try in turn (each checks its
    batch's state under the lock) before the statuses are read again: a claim per batch that
    read every status would read them as many times as there are batches, at thousands of open
    batches millions of reads for one run."""

    state: ClassVar[str]
    _candidates: deque[str] | None = None
    # The open batches' states as watches keep them, once the loop runs (``idle_signal``); a
    # claim made outside the loop (``run_once`` alone) lists and reads them as before.
    _states: BatchStates | None = None
    # Whether the last listing had batches in this daemon's state (taken or not).
    _listed_some = True

    def accept(self, bid: str) -> bool:
        return True

    def idle_signal(self, wake: threading.Event) -> WakeSignal:
        """The batches' index (``queues.zk.batchstates``) and the queue hold's watch wake the
        idle loop: a batch created or moved, a hold placed or released. Batches have no state
        folders, so a children watch of ``/batches`` alone saw only new batches and the loop
        listed every batch and read every open one's status each poll (docs/benchmarks.md,
        "At rest")."""
        self._states = batch_states(self.zk)
        self._states.subscribe(wake)
        if self.queue_hold:
            self._hold_watch = PresenceWatch(self.zk, zpaths.queue_lock(self.queue_hold), wake)
        return WakeSignal(wake)

    def idle_end(self, wake: threading.Event) -> None:
        if self._states is not None:
            self._states.unsubscribe(wake)
            self._states = None
        if self._hold_watch is not None:
            self._hold_watch.close()
            self._hold_watch = None

    def idle_wait(self) -> float:
        """The poll while batches of this daemon's state wait (locked elsewhere, waiting for a
        retry or a mail server): they are looked at again as before. With none, nothing is
        looked at before a watch says something changed, or the index's own fallback is due."""
        if self._states is None or self._listed_some:
            return self.poll
        return max(self.poll, self._states.due_in())

    def listing(self) -> list[str]:
        """The batches in this daemon's state, oldest first."""
        self._listed_some = True  # until it is known: a look that fails is tried at the poll
        if self._states is None:
            found = batches_in_state(self.zk, self.state)
        else:
            found = self._states.in_state(self.state)
        self._listed_some = bool(found)
        return found

    def claim(self) -> Batch | None:
        fresh = not self._candidates
        while True:
            if not self._candidates:
                self._candidates = deque(self.listing())
            candidates = self._candidates
            while candidates:
                bid = candidates.popleft()
                if not self._accept(bid):
                    continue
                batch = batch_try_acquire(self.zk, bid, self.state)
                if batch is not None:
                    return batch
            if fresh:
                return None
            fresh = True  # the candidates left from an earlier read were taken: read again

    def _accept(self, bid: str) -> bool:
        if bid in self.skipped:
            stat = self.zk.exists(zpaths.batch_node(bid, "status"))
            if stat is not None and self.skipped[bid] == stat.version:
                return False
        return self.accept(bid)

    def item_id(self, item: Batch) -> str:
        return item.bid

    def lock_path(self, item: Batch) -> str:
        return zpaths.batch_node(item.bid, "lock")

    def move(self, item: Batch, step: Next) -> bool:
        batch_transition(self.zk, item, step.target, message=step.message, holder=True)
        return False

    def unlock(self, item: Batch) -> None:
        batch_unlock(self.zk, item)


class AccessDaemon(Daemon[AccessRequest]):
    queue: ClassVar[str]  # "small" | "large"

    def wake_path(self) -> str | None:
        return f"{zpaths.ACCESS}/{self.queue}"

    def claim(self) -> AccessRequest | None:
        # Processing first: those were interrupted (or resumed there by an operator).
        return access_acquire(self.zk, self.queue, AccessState.PROCESSING, AccessState.PENDING)

    def item_id(self, item: AccessRequest) -> str:
        return item.qid

    def lock_path(self, item: AccessRequest) -> str:
        return zpaths.access_node(item.queue, item.qid, "lock")

    def move(self, item: AccessRequest, step: Next) -> bool:
        # As the lock's holder: outside the step, the lock is read to be this session's.
        access_transition(self.zk, item, step.target, message=step.message, holder=True)
        return False

    def unlock(self, item: AccessRequest) -> None:
        access_unlock(self.zk, item)
