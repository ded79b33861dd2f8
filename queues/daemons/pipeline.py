"""The batched job loop: many jobs per request, requests pipelined, locks kept between steps.

``JobDaemon.run`` uses this loop when its daemon takes more than one job per claim (``batch``)
or shares a :class:`LockKeeper` with the other job daemons of its process. One cycle:

1. take the next jobs in run order from the state's listing (``StateListing``): entries of
   jobs whose lock this process kept from their previous step, and others;
2. send in one go, without waiting: ONE lock multi for the jobs not yet ours, ONE multiRead
   of the queue hold and every picked job (ZooKeeper answers a session's requests in order, so
   the read sees the new locks, and a hold placed before the claim);
3. collect the previous cycle's move (it travelled with those requests); then the hold (held:
   every lock just taken or kept is given back, nothing runs) and the claim (failed on
   contention: the job it failed on is passed over, the others claimed again);
4. run the step on each job, in run order, as the one-job loop does (skips, failures, waits);
   a step that waits on servers outside (``JobDaemon.steps_elsewhere``) runs in threads of
   the loop's own instead, the batch's jobs of each server as one task, and a later cycle
   takes each task's jobs on from here once it has ended;
5. send ONE multi carrying every job's transition, refused before it leaves if the session that
   took the locks is gone (``SessionGate.send_if_current``). Each transition deletes its lock,
   or, when this process runs the next step too and that loop has room, checks the lock is
   still there and keeps it: the job is handed to that loop, which still takes it in run order,
   re-reads it and the queue hold, and runs it under the same lock. When the multi fails (an
   operator moved a job meanwhile) each job is moved on its own.

A lost session (``SessionGate.generation`` changes, or the client's session id) drops every
kept job: the locks went with the session and nothing is committed for them.

The loops of a process's short steps run in one thread (``run_together``), each taking its
turn; a turn that would wait for an answer (``cycle(block=False)``) lets the next loop go on.

Fresh jobs are divided between the loops claiming in a state (``ClaimShare``, one member name
per process when its loops keep locks, so a job claimed by a process at its first step is in
that process's share at every later one). A draining or stopping loop leaves the division.

A long step's loop (``JobDaemon.workers``: downloading, processing, storing, recording) runs
its jobs' steps in threads of its own, a job each (or a few, when its steps take microseconds:
``_long_tasks``), and has in hand no more jobs than those threads begin within LONG_WAIT (see
there). It takes jobs handed over with their locks only as many as those threads would begin
within LONG_WAIT too (``_publish_room``); the others go on unlocked, for any consumer with a
thread free. Neither it nor the loop before it is held back for the other's room.

Why one module (about 1,750 lines), for now: ``JobPipeline`` is one cycle's state machine
(about 1,200 lines) whose steps share its kept jobs, its moves in flight and its step lanes.
The helpers before it (``LockKeeper``, ``Paces``, ``SlowMarks``, the work records, about 300
lines) could be a module of their own; not done yet (the tests set the constants they read
on this module).
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from django.db import close_old_connections

from queues.core.outside_text import url_shown
from queues.core.states import JOB
from queues.zk import paths as zpaths
from queues.zk.consumers import consumer_name
from queues.zk.errors import (
    InvalidTransition,
    LockLost,
    MalformedNode,
    NotFound,
    is_connection_error,
)
from queues.zk.jobs import (
    TransitionPlan,
    job_refresh,
    jobs_finish_load,
    load_paths,
    refresh_paths,
    transition_plan,
    write_mark,
    written_since,
)
from queues.zk.kazoo_private import session_id
from queues.zk.locks import ledger_of
from queues.zk.nodes import collect_reads, start_reads
from queues.zk.pipeline import (
    ClaimShare,
    PendingClaim,
    PendingMove,
    PendingRetry,
    Pick,
    StateListing,
    collect_releases,
    send_releases,
)
from queues.zk.records import Job
from queues.zk.watch import ChangeSignal, PresenceWatch

from .serial import SerialByKey
from .shared import Claim, ItemResult, Next, SessionGate

if TYPE_CHECKING:
    from queues.zk.batches import CompletionCheck

log = logging.getLogger("queues.daemons")

KEEP_ROOM = 4  # a loop accepts kept jobs up to this many batches' worth
IN_TRANSIT_FOR = 30.0  # s a job moving with its kept lock is left out of this process's claims
MAX_MOVES = 3  # moves under way at once per loop (older ones are waited for)
DB_CHECK_EVERY = 1.0  # s between looks at the thread's database connection
IDLE_MIN = 0.05  # s a loop left with other loops' entries only waits at least
# Batches' worth of jobs a loop whose steps run in threads of their own
# (``JobDaemon.steps_elsewhere``) may have there; at that many it claims no more until some
# have ended.
STEPS_AT_ONCE = 2
STEP_THREADS = 4  # threads a loop's lanes run in (one server's jobs in one at a time)
# Slowness is judged per step, per URL and per server (``_note_slow_steps``):
# - a step of a server's lane under way longer than that server's steps take (ASIDE_PACE times
#   the median of its last PACE_STEPS steps, at least ASIDE_MIN s, at most SERVER_SLOW) is set
#   aside: it goes on in a thread of its own and the lane goes on without it, unless the loop
#   has ASIDE_AT_ONCE steps set aside already or ASIDE_IN_A_ROW of that server's steps were set
#   aside one after another with none of its steps ending in its lane between;
# - a step under way for SERVER_SLOW s makes its URL slow (``JobDaemon.slow_key``): that URL's
#   jobs are passed over for SERVER_SLOW_PAUSE s;
# - a step under way for SERVER_SLOW s in its lane (not set aside: the server's other steps did
#   not answer either) makes its server slow: the server's tasks not begun are given back, its
#   jobs are passed over for SERVER_SLOW_PAUSE s, and its task under way no longer counts
#   against the loop's room, so a server that does not answer holds up its own task's jobs only.
SERVER_SLOW = 10.0
SERVER_SLOW_PAUSE = 30.0
ASIDE_MIN = 0.25
ASIDE_PACE = 8.0
PACE_STEPS = 15
ASIDE_AT_ONCE = 8  # threads a loop has beside its lanes' for the steps set aside
ASIDE_IN_A_ROW = 2
WATCH_EVERY = 0.05  # s between the step watch's looks while steps are under way
# s a job whose step raised (a bug, not an outage: those wait in the step) is passed over
STEP_ERROR_PAUSE = 60.0
AHEAD = 2  # batches whose requests are under way while the loop works on an earlier one
# A step as long as its object (processing, storing, recording: ``JobDaemon.workers``) runs in
# the loop's threads, a job each, ``workers`` at once. The loop has in hand (claimed, stepping)
# no more jobs than its threads can begin within about LONG_WAIT s, judged by how long the
# step's last PACE_STEPS steps took: a few when steps take minutes, a batch or two when they
# take milliseconds. A thread whose step has been under way longer than LONG_WAIT counts as
# taken, and the jobs claimed and not begun go back to the folder when no thread that is not
# taken is left for them: they never wait behind a long step while another consumer is free.
LONG_WAIT = 1.0
# A long step's loop puts the steps of several jobs in one task for its threads when its steps
# usually take less than SHORT_STEP s (a task's hand-over to a thread and back costs more), as
# many as usually take TASK_SPAN s (``JobPipeline._long_tasks``).
SHORT_STEP = 0.001
TASK_SPAN = LONG_WAIT / 4
STOP_CHECK = 0.25  # s between looks at the stop event while idle (as ChangeSignal.wait)

# The order in which the requests of batches and moves were sent, across the loops of a process.
# They share one session, whose requests ZooKeeper answers in the order they were sent: the
# first sent is the first answered, and waiting for it never keeps an earlier answer waiting.
_sent = itertools.count()


LOCK_LOST = "lock lost with the session"


class PipelinedDaemon(Protocol):
    """What the batched loop asks of the daemon it runs: ``base.JobDaemon`` is one. Named here
    so that this module never imports ``base`` (which imports this one to build the loop)."""

    zk: Any
    gate: SessionGate
    poll: float
    batch_size: int
    strict: bool
    workers: int  # > 0: a long step's loop, its steps in that many threads (see LONG_WAIT)
    observer: Any
    last: ItemResult | None
    loop_started: threading.Event

    @property
    def name(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def queue_hold(self) -> str | None: ...

    @property
    def steps_elsewhere(self) -> bool: ...

    def wants(self, job: Job) -> bool: ...

    def held_back(self, job: Job) -> str: ...

    def would_take(self, job: Job, taking: Counter[str]) -> bool: ...

    def claim_limit(
        self, kept: dict[str, str], known: dict[str, Job]
    ) -> Callable[[str], bool] | None: ...

    def server_of(self, item: Job) -> str: ...

    def slow_key(self, item: Job) -> str: ...

    def run_step(
        self, item: Job, started: float, claim: Claim
    ) -> tuple[Job, Next | None, ItemResult | None]: ...

    def result(self, ident: str, outcome: str, started: float, detail: str = "") -> ItemResult: ...

    def moved_result(self, ident: str, step: Next, started: float) -> ItemResult: ...

    def log_result(self, result: ItemResult) -> None: ...

    def log_moved(self, results: list[ItemResult]) -> None: ...

    def after_move(self, item: Job, step: Next) -> set[str]: ...

    def not_moved(self, item: Job, exc: Exception) -> None: ...

    def let_go(self, jids: list[str]) -> None: ...

    def ask_completion(self, bids: set[str]) -> CompletionCheck | None: ...

    def batches_done(self, check: CompletionCheck) -> None: ...


class Holding(NamedTuple):
    """A lock this process holds: the session it was taken in (a tuple: every cycle compares
    the session of each lock held with the current one)."""

    generation: int
    session: int | None


def claimer_member() -> str:
    """A name under which a loop (or a process's loops) takes part in dividing claims: host,
    pid and a random part, so two processes never share one (containers with the same pid)."""
    return f"{consumer_name(socket.gethostname(), os.getpid())}-{uuid.uuid4().hex[:8]}"


class LockKeeper:
    """The job loops of one process, by state: where a job goes with its lock kept."""

    def __init__(self) -> None:
        self.member = claimer_member()
        self._loops: dict[str, JobPipeline] = {}
        self._lock = threading.Lock()
        # Jobs moving to another loop of this process with their lock kept, until it takes
        # them in: that loop's listing shows them first, and a claim of them (their lock is
        # there, this process's own) would fail and take its whole batch's claim down with it.
        self._transit: dict[str, float] = {}  # jid -> until when
        self._transit_ends = float("inf")  # the earliest of those

    def sending(self, jids: list[str]) -> None:
        """These jobs' moves are about to be sent with their locks kept."""
        until = time.monotonic() + IN_TRANSIT_FOR
        with self._lock:
            for jid in jids:
                self._transit[jid] = until
            self._transit_ends = min(self._transit_ends, until)

    def arrived(self, jids: list[str]) -> None:
        """These jobs were taken in, given back or not moved: claimable again."""
        with self._lock:
            for jid in jids:
                self._transit.pop(jid, None)

    def in_transit(self) -> set[str]:
        """Jobs on their way between this process's loops (forgotten after IN_TRANSIT_FOR s,
        should a hand-over have been lost to an error)."""
        now = time.monotonic()
        with self._lock:
            if self._transit_ends < now:
                self._transit = {j: t for j, t in self._transit.items() if t >= now}
                self._transit_ends = min(self._transit.values(), default=float("inf"))
            return set(self._transit)

    def register(self, loop: JobPipeline) -> None:
        with self._lock:
            self._loops.setdefault(loop.daemon.state, loop)

    def unregister(self, loop: JobPipeline) -> None:
        with self._lock:
            if self._loops.get(loop.daemon.state) is loop:
                del self._loops[loop.daemon.state]

    def loop_for(self, state: str | None) -> JobPipeline | None:
        if state is None:
            return None
        with self._lock:
            return self._loops.get(state)

    def upstream_of(self, state: str) -> list[JobPipeline]:
        """The loops whose step leads into ``state`` (woken when it has room again)."""
        with self._lock:
            return [loop for loop in self._loops.values() if loop.successor == state]

    def taker(self, state: str) -> tuple[JobPipeline | None, int]:
        """The loop that would take jobs moved into ``state`` with their locks, and how many
        (None, 0: none)."""
        with self._lock:
            loop = self._loops.get(state)
        room = loop.room_for_hand() if loop is not None else 0
        return (loop, room) if room > 0 else (None, 0)


@dataclass
class Work:
    """One job of a cycle on its way through the step."""

    pick: Pick
    job: Job
    started: float
    mark: int = 0  # write_mark() when the job was read
    token: Any = None
    step: Next | None = None
    plan: TransitionPlan | None = None
    taker: JobPipeline | None = None


@dataclass
class Outgoing:
    """A batch whose requests are under way: claim multi, reads (the queue hold's among them)."""

    picks: list[Pick]
    hold: str | None  # the queue hold's path, read with the jobs
    claim: PendingClaim | None
    reads: Any
    holding: Holding
    known: dict[str, Job]  # kept jobs read again in part only (``job_refresh``)
    after_look_ahead: bool = False  # sent after the listing's look-ahead read
    order: int = field(default_factory=lambda: next(_sent))


Stepped = tuple[Job, "Next | None", "ItemResult | None"]  # what ``run_step`` gives


@dataclass(eq=False)
class Stepping:
    """A batch's jobs of one server, whose steps run in the loop's step threads, one after
    another: each job's ``run_step``, or the exception it raised, in the order of ``works``.

    The step thread and the loop share it under ``lock``: the step thread begins ``works[n]``
    with ``n = len(done)`` and appends its outcome to ``done``; the loop may cut the task while
    a step is under way (``JobPipeline._set_aside``), leaving that step alone in ``works``."""

    server: str
    works: list[Work]
    holding: Holding
    future: Future[list[Stepped | Exception]] = field(init=False)
    began: float | None = None  # when the step under way began (set by the step thread)
    done: list[Stepped | Exception] = field(default_factory=list)
    # What the loop made of the step under way already: 0 nothing, 1 looked whether to set it
    # aside, 2 judged its URL (and maybe server) slow. The step thread sets 0 as a step begins.
    looked: int = 0
    aside: bool = False  # its one step set aside: its server's lane goes on without it
    lock: threading.Lock = field(default_factory=threading.Lock)


class SlowMarks:
    """Servers and URLs found slow, each until a time (the loop marks them, step threads read
    them)."""

    LIMIT = 4096  # marks kept at most; expired ones go first

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}

    def mark(self, key: str, seconds: float) -> None:
        moment = time.monotonic()
        with self._lock:
            if len(self._until) >= self.LIMIT:
                for gone in [k for k, until in self._until.items() if until <= moment]:
                    del self._until[gone]
            self._until[key] = moment + seconds

    def __len__(self) -> int:
        return len(self._until)

    def slow(self, key: str) -> bool:
        # Read without the lock (a dict's get is one step under the interpreter lock): the
        # loop asks for every job of every batch, and most of the time nothing is marked.
        until = self._until
        return bool(until) and until.get(key, 0.0) > time.monotonic()


class Paces:
    """How long each server's steps took lately, and how many of its steps were set aside in a
    row (step threads write, the loop and the step watch read)."""

    LIMIT = 1024  # servers remembered at most, the longest unheard of forgotten first

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._took: collections.OrderedDict[str, collections.deque[float]] = (
            collections.OrderedDict()
        )
        self._in_a_row: dict[str, int] = {}

    def ended(self, server: str, seconds: float, *, aside: bool) -> None:
        """A step of ``server`` ended after ``seconds``; ``aside``: it had been set aside."""
        with self._lock:
            took = self._took.get(server)
            if took is None:
                if len(self._took) >= self.LIMIT:
                    old, _ = self._took.popitem(last=False)
                    self._in_a_row.pop(old, None)
                took = self._took[server] = collections.deque(maxlen=PACE_STEPS)
            else:
                self._took.move_to_end(server)
            took.append(seconds)
            if not aside:
                self._in_a_row.pop(server, None)

    def usual(self, server: str) -> float | None:
        """The median of how long the last steps of ``server`` took (None: none ended yet)."""
        with self._lock:
            took = sorted(self._took.get(server, ()))
        return took[len(took) // 2] if took else None

    def aside_after(self, server: str) -> float:
        """How long a step of ``server`` may be under way before it is set aside."""
        usual = self.usual(server) or 0.0
        return min(SERVER_SLOW, max(ASIDE_MIN, ASIDE_PACE * usual))

    def may_set_aside(self, server: str) -> bool:
        with self._lock:
            return self._in_a_row.get(server, 0) < ASIDE_IN_A_ROW

    def set_aside(self, server: str) -> None:
        with self._lock:
            self._in_a_row[server] = self._in_a_row.get(server, 0) + 1


@dataclass
class Taking:
    """A batch's hand-overs to the loop of one state: that loop (None: it takes no more), how
    many more it takes, and those given it so far counted by what limits them
    (``would_take``)."""

    loop: JobPipeline | None
    room: int
    counts: Counter[str] = field(default_factory=Counter)


class NotStepped(Exception):
    """In a step's place: the job's step did not begin, because the loop was giving its jobs
    up (a stop, a drain, a suspended connection) or its server is slow (then ``pause``: how
    long the job is passed over)."""

    def __init__(self, reason: str, pause: float = 0.0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.pause = pause


@dataclass
class InFlight:
    move: PendingMove
    works: list[Work]
    holding: Holding
    order: int = field(default_factory=lambda: next(_sent))


class Wake(threading.Event):
    """A loop's wake-up. When the loop shares its thread with others (``run_together``), setting
    it wakes that thread too."""

    def __init__(self) -> None:
        super().__init__()
        self.thread: threading.Event | None = None

    def set(self) -> None:
        super().set()
        thread = self.thread
        if thread is not None:
            thread.set()


class _WhenAsked:
    """A set of jobs made at the first look into it: a batch of kept jobs only never needs the
    jobs a loop has in hand (``JobPipeline._in_hand``, some hundreds to gather)."""

    __slots__ = ("_jids", "_make")

    def __init__(self, make: Callable[[], set[str]]) -> None:
        self._make = make
        self._jids: set[str] | None = None

    def __contains__(self, jid: object) -> bool:
        if self._jids is None:
            self._jids = self._make()
        return jid in self._jids


class JobPipeline:
    """The batched loop of one JobDaemon (see the module's docstring)."""

    def __init__(self, daemon: PipelinedDaemon, *, keeper: LockKeeper | None = None) -> None:
        self.daemon = daemon
        self.zk = daemon.zk
        self.keeper = keeper
        self.batch = max(1, daemon.batch_size)
        self.workers = max(0, daemon.workers)  # a long step's loop (LONG_WAIT) when > 0
        member = keeper.member if keeper is not None else claimer_member()
        self.share = ClaimShare(self.zk, daemon.state, member)
        self.listing = StateListing(self.zk, daemon.state, strict=daemon.strict, share=self.share)
        # Where a successful step leads: when this process's loop for that state is full, this
        # loop claims no new jobs (it would only have to give their locks back after the move)
        # and works on the ones it holds; the full loop wakes it when it has room again.
        self.successor = JOB.successor(daemon.state)
        self.kept: dict[str, str] = {}  # jid -> its entry name; this loop's thread only
        # Kept jobs as the move that handed them over left them, when this process wrote
        # nothing else of them since they were read: only what others may change is read again.
        self.known: dict[str, Job] = {}
        self.holding: dict[str, Holding] = {}
        # When not None, every entry of ``holding`` equals it: ``_drop_stale`` then has nothing
        # to look at while the session stays (entries come in through ``_hold`` only).
        self._checked: Holding | None = None
        self._handed: list[tuple[Job, Holding, bool]] = []  # from other loops' threads
        self._handed_lock = threading.Lock()
        # A long step's loop: how many more jobs it takes with their locks (``_publish_room``).
        self._begins_at_once = 0
        self.wake = Wake()
        self._watch: ChangeSignal | None = None
        self._hold_watch: PresenceWatch | None = None  # the queue hold, watched (``begin``)
        self.inflight: collections.deque[InFlight] = collections.deque()  # moves under way
        # A step that waits on servers outside (a depositor's, a callback's receiver) runs in
        # threads of their own, one server's jobs one after another, so a slow or silent server
        # holds up only its own jobs, not the other servers' nor the other loops of this loop's
        # thread; the moves are sent from here once a task's steps have ended.
        self.steps: SerialByKey | None = None
        self.stepping: list[Stepping] = []
        self._giving_up = False  # steps not begun yet are not begun (``_finish_stepping``)
        self.marks = SlowMarks()  # slow servers and URLs (``_note_slow_steps``)
        self.paces = Paces()  # how long each server's steps take
        # The steps under way in the step threads, for the step watch (``_watch_steps``), which
        # wakes the loop when one of them is due a look.
        self._watched: set[Stepping] = set()
        self._watched_lock = threading.Lock()
        self._watching = threading.Event()  # set while steps are in the step threads
        self._watch_stop = threading.Event()
        self._watch_thread: threading.Thread | None = None
        self.pending: collections.deque[Outgoing] = collections.deque()  # sent, not worked on
        # Claims sent again after a failed claim multi, oldest first.
        self.retries: collections.deque[tuple[PendingRetry, Holding]] = collections.deque()
        # Completion checks of batches whose jobs a move finished, sent and not answered yet,
        # with their place in the order of requests sent.
        self.completions: collections.deque[tuple[int, CompletionCheck]] = collections.deque()
        self.stopping = False
        self.throttled = False  # the last cycle waited for room in the next step's loop
        self._closed = False  # no more hand-overs (under _handed_lock)
        self._db_checked = float("-inf")
        # Set by a cycle that would have had to wait for an answer and did not (``block``
        # False): the order of the request it waits for (see ``run_together``).
        self.waits_for: int | None = None

    # Hand-over from another loop of the process --------------------------------------------

    def _taking(self) -> bool:
        """Whether this loop takes hand-overs at all (not stopping, draining or cut off)."""
        if self.stopping or not self.daemon.gate.connected:
            return False
        observer = self.daemon.observer
        return observer is None or not observer.draining

    def _waiting(self) -> int:
        """Jobs handed to this loop and not worked on yet."""
        with self._handed_lock:
            return len(self.kept) + len(self._handed)

    def has_room(self) -> bool:
        return self.room_for_hand() > 0

    def room_for_hand(self) -> int:
        """How many jobs this loop takes with their locks now: a long step's loop, as many as
        its threads begin soon (``_publish_room``); another, any number while it has fewer
        than KEEP_ROOM batches' worth waiting."""
        if not self._taking():
            return 0
        if self.workers:
            return max(0, self._begins_at_once)
        return self.batch * KEEP_ROOM if self._waiting() < KEEP_ROOM * self.batch else 0

    def backlogged(self, coming: int) -> bool:
        """Whether ``coming`` more jobs would fill this loop's room while it is taking them:
        then the loop before it waits instead of moving jobs on without their locks, which
        someone would have to claim (and read in full) again. A loop that takes nothing (it
        stops, drains, lost its connection) holds nobody up."""
        return self._taking() and self._waiting() + coming > KEEP_ROOM * self.batch

    def hand(self, jobs: list[tuple[Job, bool]], holding: Holding) -> int:
        """Take ``jobs`` with their locks (one wake-up for all): how many, the first ones of
        ``jobs`` (the caller gives the others back); none when this loop has stopped, and no
        more than a long step's loop begins at once (``_publish_room``). With each job,
        ``current``: the job is as ZooKeeper has it, but for what others may have changed
        since (``job_refresh``); otherwise it is read again in full."""
        with self._handed_lock:
            if self._closed:
                return 0
            taken = len(jobs)
            if self.workers:
                taken = max(0, min(taken, self._begins_at_once))
                self._begins_at_once -= taken
            self._handed.extend((job, holding, current) for job, current in jobs[:taken])
        if taken:
            self.wake.set()
        return taken

    def _publish_room(self, now: Holding) -> None:
        """A long step's loop: give back the kept jobs its threads would not begin soon (its
        allowance shrank: its steps got longer, or took every thread), and say how many more
        jobs they would begin, for the loops handing jobs over to it (``hand``, from their own
        threads)."""
        if not self.workers:
            return
        free = max(0, min(KEEP_ROOM * self.batch, self._long_begins() - self._long_in_hand()))
        if len(self.kept) > free:
            latest = sorted(self.kept, key=self.kept.__getitem__)[free:]
            self._give_back(latest, now)
        free -= len(self.kept)
        with self._handed_lock:
            self._begins_at_once = free - len(self._handed)

    def _absorb(self) -> None:
        if not self._handed:
            # Looked at without the lock (most cycles find nothing): a hand-over appended
            # meanwhile sets the wake-up, which brings this loop round again.
            return
        with self._handed_lock:
            handed, self._handed = self._handed, []
        if self.keeper is not None:
            self.keeper.arrived([job.jid for job, _holding, _current in handed])
        for job, holding, current in handed:
            name = zpaths.index_name(job.priority, job.jid)
            self.kept[job.jid] = name
            self._hold(job.jid, holding)
            if current:
                self.known[job.jid] = job
            self.listing.add(name)

    def _collect_retries(self, *, wait: bool = True) -> None:
        """The claims sent again after a failed claim multi: what they locked is this loop's
        now, taken like a kept job in its place in the run order; what they did not try goes
        back to the listing."""
        while self.retries and (wait or self.retries[0][0].ready()):
            retry, holding = self.retries.popleft()
            locked, lost, untried = retry.collect()
            self.listing.busy(p.jid for p in lost)
            for pick in untried:
                self.listing.add(pick.name)
            for pick in locked:
                self.kept[pick.jid] = pick.name
                self._hold(pick.jid, holding)
                self.listing.add(pick.name)

    def _current(self) -> Holding:
        return Holding(self.daemon.gate.generation, session_id(self.zk))

    def _hold(self, jid: str, holding: Holding) -> None:
        """Note ``jid``'s lock as held since ``holding``."""
        self.holding[jid] = holding
        if holding != self._checked:
            self._checked = None

    def _drop_stale(self, now: Holding) -> None:
        """Forget kept jobs whose session is gone: ZooKeeper removed their locks already.
        Every cycle asks; the holdings are looked through only when one may differ from
        ``now`` (a new session, or a lock noted under another since the last look)."""
        if now == self._checked:
            return
        for jid in [j for j, h in self.holding.items() if h != now]:
            self.holding.pop(jid, None)
            self.kept.pop(jid, None)
            self.known.pop(jid, None)
        self._checked = now

    def _give_back(self, jids: list[str], now: Holding) -> None:
        """Delete the locks of ``jids`` (when still this session's) and forget them."""
        self.daemon.let_go(jids)
        mine = [j for j in jids if self.holding.pop(j, None) == now]
        for jid in jids:
            self.kept.pop(jid, None)
            self.known.pop(jid, None)
        if mine:
            # Sent under the gate, waited for outside it: the client's connection thread takes
            # the gate's lock when the session is lost, before it fails the requests still
            # waiting for an answer (these deletes among them).
            try:
                fence = self.daemon.gate.fence(self.zk, now.generation, now.session)
                sent = fence(lambda: send_releases(self.zk, mine))
            except LockLost:
                return
            except Exception:
                ledger_of(self.zk).in_doubt(zpaths.job_node(j, "lock") for j in mine)
                raise
            try:
                collect_releases(self.zk, sent)
            except Exception as exc:
                log.warning("%s: giving back %d locks failed: %s", self.daemon.name, len(mine), exc)

    # The loop -----------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Run the loop in this thread until ``stop`` is set."""
        self.begin()
        try:
            while not stop.is_set():
                wait = self.turn()
                if wait:
                    self._idle(stop, wait)
        finally:
            self.end()

    def begin(self) -> None:
        daemon = self.daemon
        log.info(
            "%s: started (batched, %d a claim, poll %.1fs)", daemon.name, self.batch, daemon.poll
        )
        daemon.loop_started.set()
        if self.workers and self.steps is None:
            # A lane a job: the steps' own length, not a server's slowness, decides.
            self.steps = SerialByKey(self.workers, f"{daemon.name}-step")
        elif daemon.steps_elsewhere and self.steps is None:
            self.steps = SerialByKey(STEP_THREADS, f"{daemon.name}-step", aside=ASIDE_AT_ONCE)
            self._watch_stop.clear()
            self._watch_thread = threading.Thread(
                target=self._watch_steps, name=f"{daemon.name}-step-watch", daemon=True
            )
            self._watch_thread.start()
        if self.keeper is not None:
            self.keeper.register(self)
        self._watch = ChangeSignal(self.zk, zpaths.job_state_folder(daemon.state), self.wake)
        if daemon.queue_hold:
            self._hold_watch = PresenceWatch(
                self.zk, zpaths.queue_lock(daemon.queue_hold), self.wake
            )

    def turn(self, *, block: bool = True) -> float | None:
        """One turn of the loop: 0 when it is worth another at once, otherwise how long it may
        wait for a wake-up (a hand-over, room downstream, the folder's watch) before the next.
        With ``block`` False, a turn that would wait for an answer returns None instead
        (``waits_for`` says for which)."""
        daemon = self.daemon
        if self._cycle_logged(block=block):
            return 0.0
        if self.waits_for is not None:
            return None
        if self._queue_held():
            # Nothing may be taken: no listing, no watch of the folder; the hold's own watch
            # wakes the loop when it goes (the poll is the fallback).
            return daemon.poll
        if self.throttled or not self._room():
            # Waiting for room downstream, or for its steps to end, either of which wakes this
            # loop: the folder's news cannot be worked on before then, so it is neither watched
            # nor listed.
            return self._idle_for()
        ripe_in = self.listing.others_only()
        if ripe_in is not None and not self.kept:
            # All that is left in the folder is other loops' share, none of it to be taken
            # over yet. Their moves change the folder all the time: a watch would list it
            # whole again at every one. The loop waits for the first entry it may take over,
            # a hand-over or the poll instead (the poll is when it would have listed the
            # folder again anyway).
            return min(daemon.poll, max(ripe_in, IDLE_MIN))
        # Idle: the folder's watch, a hand-over or the poll wakes the loop. Work that arrived
        # between the empty cycle and the watch is found by one more cycle, on the listing the
        # watch was set with (or a new one when it was set already, unless the listing in
        # hand was sent after the watch was: it has every entry the watch has not told of, and
        # an idle loop woken by its poll listed its folder twice a poll: docs/benchmarks.md,
        # "At rest").
        assert self._watch is not None, "begin() first"
        names = self._watch.arm()
        if names is not None:
            self.listing.listed(self._watch.armed_at, names, self.kept.values())
        fresh = names is None and self.listing.listed_at < self._watch.armed_at
        if self._cycle_logged(fresh=fresh, block=block):
            return 0.0
        if self.waits_for is not None:
            return None
        return self._idle_for()

    def _idle_for(self) -> float:
        """How long an idle turn may wait for a wake-up: the poll; but a long step's loop with
        jobs claimed and not begun looks again within LONG_WAIT, when a step under way may have
        taken the last free thread (``_long_give_back``)."""
        poll = self.daemon.poll
        return min(poll, LONG_WAIT) if self.workers and self._long_unbegun() else poll

    def end(self) -> None:
        """The loop has stopped: what it holds goes back, and it takes no more hand-overs."""
        self.stopping = True
        if self._hold_watch is not None:
            self._hold_watch.close()
        if self.keeper is not None:
            self.keeper.unregister(self)
        self._close()
        if self.steps is not None:
            self.steps.shutdown()  # every step has ended (``_close`` waited for them)
            self.steps = None
        if self._watch_thread is not None:
            self._watch_stop.set()
            self._watching.set()
            self._watch_thread.join()
            self._watch_thread = None
        log.info("%s: stopped", self.daemon.name)

    def _idle(self, stop: threading.Event, seconds: float) -> None:
        """Wait up to ``seconds`` for a wake-up (a hand-over, room downstream, the folder's
        watch), looking at ``stop`` every STOP_CHECK s: a stopping process (the weekly redeploy)
        does not wait out the poll of each idle loop."""
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or self.wake.wait(min(left, STOP_CHECK)):
                break
        self.wake.clear()

    def _close(self) -> None:
        with self._handed_lock:
            self._closed = True
        self._absorb()
        try:
            self._collect_retries()
        except Exception as exc:
            log.warning("%s: last claims: %s", self.daemon.name, exc)
        self._drop_stale(self._current())
        try:
            self._abandon()
        except Exception as exc:
            log.warning("%s: stopping: %s", self.daemon.name, exc)
        self._drop_in_hand()
        self._finish_completions()
        try:
            self.share.leave()
        except Exception as exc:
            log.debug("%s: leaving the claimers: %s", self.daemon.name, exc)

    def _cycle_logged(self, *, fresh: bool = False, block: bool = True) -> bool:
        failed = True
        try:
            result = self.cycle(fresh=fresh, block=block)
            failed = False
            return result
        except Exception as exc:
            if is_connection_error(exc):
                log.warning("%s: ZooKeeper unavailable: %s", self.daemon.name, exc)
            else:
                log.exception("%s: unexpected error outside a step", self.daemon.name)
            try:
                self._abandon()  # what this loop holds goes back; it starts again afresh
            except Exception:
                log.debug("%s: giving back after an error failed", self.daemon.name, exc_info=True)
            self._drop_in_hand()
            return False
        finally:
            # Long-lived threads must not keep a broken or stale database connection; a cycle
            # takes a fraction of a millisecond, so it is looked at once a second (and after an
            # error) rather than at every cycle.
            moment = time.monotonic()
            if failed or moment - self._db_checked >= DB_CHECK_EVERY:
                self._db_checked = moment
                close_old_connections()

    def cycle(self, *, fresh: bool = False, block: bool = True) -> bool:
        """One step of the loop; True when it is worth looking again at once. ``fresh``: list
        the state's folder anew (the loop does before it goes idle). ``block`` False: rather
        than wait for an answer, return False with ``waits_for`` set.

        ``AHEAD`` + 1 batches are under way at a time: the requests of the next batches (claim,
        reads) are sent before the one sent earliest is worked on, so their answers
        arrive while the step runs on the one before.
        """
        daemon = self.daemon
        self.waits_for = None
        self._finish_move(wait=False)
        self._note_slow_steps()
        self._finish_stepping(wait=False)
        self._finish_completions(wait=False)
        self._absorb()
        self._collect_retries(wait=False)
        now = self._current()
        self._drop_stale(now)
        observer = daemon.observer
        if not daemon.gate.connected:
            self._abandon()
            return False
        if observer is not None and observer.draining:
            self._abandon()
            self.share.leave()  # the other loops divide the jobs without this one
            return False
        self.share.join()
        self._publish_room(now)
        room = self._room() if len(self.pending) <= AHEAD else 0
        outgoing = self._send_batch(fresh, now, room) if room else None
        if outgoing is not None:
            self.pending.append(outgoing)
            self._publish_room(now)
        if len(self.pending) > AHEAD or (outgoing is None and self.pending):
            unanswered = None if block else self._unanswered(self.pending[0])
            if unanswered is not None:
                if outgoing is not None:
                    return True
                self.waits_for = unanswered
                return False
            self._finish_batch(self.pending.popleft())
            return True
        if outgoing is not None:
            return True
        # Nothing sent, nothing to finish: wait for what is still under way.
        if not block:
            self._finish_move(wait=False)
            self._finish_completions(wait=False)
            if self.inflight or self.completions:
                self.waits_for = self.inflight[0].order if self.inflight else self.completions[0][0]
                return False
        self._finish_move()
        self._finish_completions()
        if self.retries:
            self._collect_retries()  # what they locked is worked on by the next cycle
            return True
        return False

    def _unanswered(self, batch: Outgoing) -> int | None:
        """What finishing ``batch`` would wait for: its reads, or the oldest move when as many
        are under way as may be (its move would wait for that one). None when nothing."""
        if not batch.reads.ready():
            return batch.order
        if len(self.inflight) >= MAX_MOVES and not self.inflight[0].move.ready():
            return self.inflight[0].order
        return None

    def _queue_held(self) -> bool:
        """Whether the queue hold's watch sees the hold (never asked before ``begin``)."""
        return self._hold_watch is not None and self._hold_watch.present() is True

    def _room(self) -> int:
        """How many jobs the next batch may take (0: none now)."""
        if not self.workers:
            return self.batch if self._stepping_jobs() < STEPS_AT_ONCE * self.batch else 0
        return max(0, min(self.batch, self._long_allowance() - self._long_in_hand()))

    def _long_in_hand(self) -> int:
        """A long step's loop: the jobs claimed and not moved on yet (but those moving)."""
        return sum(len(b.picks) for b in self.pending) + sum(len(s.works) for s in self.stepping)

    def _long_allowance(self) -> int:
        """A long step's loop: the jobs it may have in hand (see LONG_WAIT)."""
        return min(STEPS_AT_ONCE * self.batch, self._long_begins())

    def _long_begins(self) -> int:
        """A long step's loop: how many jobs its threads would begin within LONG_WAIT, by
        how long its last steps took (a job a free thread before any was timed)."""
        free = self.workers - self._long_overdue()
        if free <= 0:
            return 0
        usual = self.paces.usual("")
        if usual is None:
            return free
        each = int(LONG_WAIT / usual) if usual > 0 else KEEP_ROOM * self.batch
        return free * max(1, min(each, KEEP_ROOM * self.batch))

    def _long_overdue(self) -> int:
        """A long step's loop: the steps under way for longer than LONG_WAIT."""
        moment = time.monotonic()
        overdue = 0
        for stepping in self.stepping:
            with stepping.lock:
                began = stepping.began
            if began is not None and moment - began > LONG_WAIT:
                overdue += 1
        return overdue

    def _long_unbegun(self) -> bool:
        """A long step's loop: whether a job it stepped is waiting for a thread, or behind
        another job's step in its task."""
        for stepping in self.stepping:
            with stepping.lock:
                if len(stepping.done) + (stepping.began is not None) < len(stepping.works):
                    return True
        return False

    def _long_give_back(self) -> None:
        """A long step's loop: the jobs behind a step under way longer than LONG_WAIT in its
        task (``_long_tasks``) become tasks of their own, a job each. When such steps have
        taken every thread, the jobs claimed and not begun go back (their tasks are cancelled,
        and ``_finish_stepping`` gives their locks back): they would wait for a long step's
        end."""
        moment = time.monotonic()
        for stepping in list(self.stepping):
            with stepping.lock:
                began, at = stepping.began, len(stepping.done)
                if began is None or moment - began <= LONG_WAIT or at + 1 >= len(stepping.works):
                    continue
                # Its thread ends the task once that step has: it looks at ``works`` then.
                rest = stepping.works[at + 1 :]
                stepping.works = stepping.works[: at + 1]
            for work in rest:
                self._submit(Stepping(work.job.jid, [work], stepping.holding))
        if self.workers - self._long_overdue() > 0:
            return
        for stepping in self.stepping:
            with stepping.lock:
                begun = stepping.began is not None or bool(stepping.done)
            if not begun:
                stepping.future.cancel()

    def _send_batch(self, fresh: bool, now: Holding, count: int) -> Outgoing | None:
        """Pick the next batch (``count`` jobs at most) and send its requests, in one go and
        without waiting."""
        daemon = self.daemon
        if self._queue_held():
            # Held: nothing is claimed (a claim would only be given back once its read showed
            # the hold: issue 51 counted 257,000 requests a minute that way), and the jobs kept
            # for this step go back, as a hold read with a batch gives them back.
            if self.kept:
                self._give_back(list(self.kept), now)
            return None
        # The next step's loop, which may hold this one back. Not when either is a long step's
        # loop: what that has no room for goes on unlocked (``_planned``), for any consumer,
        # rather than waiting locked, behind a step that may take minutes or for one's thread.
        downstream = self.keeper.loop_for(self.successor) if self.keeper is not None else None
        if downstream is not None and (self.workers or downstream.workers):
            downstream = None
        # Set before the next loop's room is looked at: that loop wakes a throttled loop once
        # it has made room, and one whose room is made after this look finds the flag set.
        self.throttled = downstream is not None
        self.throttled = downstream is not None and downstream.backlogged(
            self._under_way() + self.batch
        )
        if self.throttled:
            # The next step's loop is full: the jobs held here wait (locked) until it has room
            # and wakes this loop, rather than going on unlocked. Nothing new is claimed.
            return None
        claiming = downstream is None or downstream.has_room()
        picks = self.listing.take(
            count,
            self.kept,
            claim=claiming,
            fresh=fresh,
            exclude=_WhenAsked(self._in_hand),
            limit=daemon.claim_limit(self.kept, self.known),
        )
        if not picks:
            return None
        for pick in picks:
            self.kept.pop(pick.jid, None)  # this batch's now (its lock stays in holding)
        new = [p for p in picks if not p.kept]
        claim = PendingClaim(self.zk, new, self.listing.folder) if new else None
        after = self.listing.looking_ahead
        known = {p.jid: self.known.pop(p.jid) for p in picks if p.kept and p.jid in self.known}
        full = [p.jid for p in picks if p.jid not in known]
        # The queue hold is read in the same multiRead as the jobs: one request fewer a batch.
        hold = zpaths.queue_lock(daemon.queue_hold) if daemon.queue_hold else None
        try:
            reads = start_reads(
                self.zk,
                ([hold] if hold else []) + load_paths(full) + refresh_paths(list(known)),
            )
            self.listing.look_ahead(self.batch, self.kept)
        except Exception:
            if claim is not None:
                claim.abandon()  # not in ``pending``, where ``_drop_in_hand`` would find it
            raise
        return Outgoing(picks, hold, claim, reads, now, known, after)

    def _finish_batch(self, batch: Outgoing) -> None:
        """The answers of a batch sent earlier: the claim, the hold; then the step on each job
        and one move for all of them."""
        daemon = self.daemon
        now = batch.holding
        # The reads were sent last: once they are answered everything before them is, and the
        # answers below are taken without waiting (one wake-up for the batch, not two).
        batch.reads.wait()
        locked = batch.claim.collect() if batch.claim is not None else set()
        # In hand at once, before anything else can fail: the batch has left ``pending``, and
        # a lock nobody has in hand stays noted as held, pinning its job for the session's life.
        # (The look-ahead read, sent before the claim, may have failed with ConnectionLoss while
        # the claim, queued after kazoo failed the requests under way, went out on the new
        # connection and took its locks.)
        for jid in locked:
            self._hold(jid, now)
        if batch.after_look_ahead:
            self.listing.apply_look_ahead()  # answered before this batch's requests
        if batch.claim is not None and (batch.claim.busy or batch.claim.lost):
            # In hand in another loop here; taken by another consumer (or moved on).
            self.listing.busy(p.jid for p in batch.claim.busy + batch.claim.lost)
        if batch.claim is not None and batch.claim.fell_back:
            # Contention: the other jobs are claimed again, sent now and collected by the next
            # cycle (what they lock is worked on then), so the jobs in hand do not wait.
            self.listing.crowded()
            retry = batch.claim.fallback()
            if retry is not None:
                self.listing.busy(p.jid for p in retry.lost)
                self.retries.append((retry, now))
        mine = [p for p in batch.picks if p.kept or p.jid in locked]
        if now != self._current():
            # The session was lost since the batch was sent: its locks are gone.
            for pick in mine:
                self.holding.pop(pick.jid, None)
            return
        loaded = collect_reads(batch.reads)
        if batch.hold is not None and loaded[batch.hold] is not None:
            # A hold placed at any time stops the work: kept jobs are given back too.
            self._give_back([p.jid for p in mine], now)
            return
        works = []
        for pick in mine:
            work = self._begin(pick, loaded, batch.known.get(pick.jid))
            if work is not None:
                works.append(work)
        if daemon.observer is not None and works:
            tokens = daemon.observer.begin_many(daemon, [work.job for work in works])
            for work, token in zip(works, tokens, strict=True):
                work.token = token
        if self.steps is not None:
            self._step_elsewhere(works, now)
        else:
            self._move_stepped(works, self._steps(works, now), now)
        if self.keeper is not None and any(p.kept for p in batch.picks):
            for upstream in self.keeper.upstream_of(daemon.state):
                if upstream.throttled:
                    upstream.wake.set()  # room again for the jobs it moves here

    def _stepping_jobs(self) -> int:
        """Jobs in the step threads, but those of a step set aside or of a slow server's task
        (``_note_slow_steps``)."""
        return sum(
            len(s.works) for s in self.stepping if not s.aside and not self.marks.slow(s.server)
        )

    def _step_elsewhere(self, works: list[Work], now: Holding) -> None:
        """Hand the steps of a batch's jobs to the step threads, one task a server (the jobs of
        a slow server or URL are given back and passed over); a later cycle sends their
        moves."""
        assert self.steps is not None
        servers: dict[str, list[Work]] = {}
        passed: list[tuple[Work, Stepped | Exception]] = []
        for work in works:
            server = work.job.jid if self.workers else self.daemon.server_of(work.job)
            why = self._passed_over(server, work)
            if why is not None:
                passed.append((work, why))
            else:
                servers.setdefault(server, []).append(work)
        if passed:
            self._move_stepped([w for w, _ in passed], [why for _, why in passed], now)
        if self.workers:
            for group in self._long_tasks([w for ws in servers.values() for w in ws]):
                self._submit(Stepping(group[0].job.jid, group, now))
            return
        for server, group in servers.items():
            self._submit(Stepping(server, group, now))

    def _long_tasks(self, works: list[Work]) -> list[list[Work]]:
        """A long step's loop: its jobs' steps as tasks for its threads. A task a job, but for
        steps that usually take less than SHORT_STEP: those of up to TASK_SPAN s of steps are
        one task (a task's hand-over to a thread and back costs more than such a step; a step
        that turns out long is cut out of its task by ``_long_give_back``)."""
        usual = self.paces.usual("")
        if usual is None or usual >= SHORT_STEP or len(works) < 2:
            return [[work] for work in works]
        size = max(1, int(TASK_SPAN / usual)) if usual > 0 else len(works)
        return [works[at : at + size] for at in range(0, len(works), size)]

    def _submit(self, stepping: Stepping, *, first: bool = False) -> None:
        """Run ``stepping``'s steps in its server's lane (``first``: before its tasks not begun)."""
        assert self.steps is not None
        stepping.future = self.steps.submit(
            stepping.server, partial(self._steps_elsewhere, stepping), first=first
        )
        self.stepping.append(stepping)
        with self._watched_lock:
            self._watched.add(stepping)
        self._watching.set()
        stepping.future.add_done_callback(self._stepped)

    def _passed_over(self, server: str, work: Work) -> NotStepped | None:
        """Why ``work``'s step is not begun now: a service it needs is held (a breaker opened
        since the job was claimed: the jobs of its batch still to step do not each meet the
        outage), or its server or its URL is slow (``pause``: how long the job is passed
        over)."""
        held = self.daemon.held_back(work.job)
        if held:
            return NotStepped(f"{held} held")
        if not self.marks:  # none marked (most of the time): its URL is not worked out
            return None
        if self.marks.slow(server):
            return NotStepped(f"{server or 'its server'} is slow", SERVER_SLOW_PAUSE)
        url = self.daemon.slow_key(work.job)
        if url and self.marks.slow(url):
            return NotStepped(f"{url_shown(url)} is slow", SERVER_SLOW_PAUSE)
        return None

    def _not_stepped(self, server: str, work: Work) -> NotStepped:
        return self._passed_over(server, work) or NotStepped("not started")

    def _note_slow_steps(self) -> None:
        """Look at the steps under way in the step threads (see SERVER_SLOW): set aside those
        that take longer than their server's steps usually do, and mark slow the URL of a step
        under way for SERVER_SLOW s, and its server too when the step is still in its lane. A
        slow server's tasks not begun are cancelled (their jobs given back by
        ``_finish_stepping``), and its task under way goes on with its jobs one by one. A long
        step's loop judges its steps by their length alone (``_long_give_back``)."""
        if self.workers:
            self._long_give_back()
            return
        moment = time.monotonic()
        for stepping in list(self.stepping):
            with stepping.lock:
                began, looked = stepping.began, stepping.looked
                if began is None or looked >= 2:
                    continue
                work = stepping.works[len(stepping.done)]
            server = stepping.server
            url = self.daemon.slow_key(work.job)
            if looked == 0 and moment - began >= self.paces.aside_after(server):
                # Where the URL is the server's only one (a callback's receiver), its other
                # jobs would wait on the same answer: the step is not set aside.
                self._set_aside(stepping, began, allowed=url != server)
            if moment - began < SERVER_SLOW:
                continue
            with stepping.lock:
                if stepping.began != began:
                    continue  # that step ended meanwhile
                stepping.looked = 2
                aside = stepping.aside
            if url and not self.marks.slow(url):
                log.warning(
                    "%s: %s has not answered a step for %.0f s: its jobs are passed over for "
                    "%.0f s",
                    self.daemon.name,
                    url_shown(url),  # a depositor's URL may carry a password
                    moment - began,
                    SERVER_SLOW_PAUSE,
                )
                self.marks.mark(url, SERVER_SLOW_PAUSE)
            if aside or self.marks.slow(server):
                continue
            log.warning(
                "%s: %s has not answered a step for %.0f s: its other jobs are passed over",
                self.daemon.name,
                server or "a server",
                moment - began,
            )
            self.marks.mark(server, SERVER_SLOW_PAUSE)
            for queued in self.stepping:
                if queued.server == server:
                    queued.future.cancel()  # those not begun

    def _set_aside(self, stepping: Stepping, began: float, *, allowed: bool) -> None:
        """Let the lane of ``stepping``'s server go on without its step under way (begun at
        ``began``), when the loop and the server allow (see SERVER_SLOW): the jobs whose steps
        ended before it move on now, those after it form a task of their own at the head of the
        lane, and the step goes on alone in its thread."""
        assert self.steps is not None
        server = stepping.server
        allowed = (
            allowed and self.steps.aside() < ASIDE_AT_ONCE and self.paces.may_set_aside(server)
        )
        with stepping.lock:
            if stepping.began != began or stepping.looked > 0:
                return  # that step ended meanwhile
            stepping.looked = 1
            if not allowed:
                return
            at = len(stepping.done)
            ended, outcomes = stepping.works[:at], list(stepping.done)
            rest = stepping.works[at + 1 :]
            alone = stepping.works[at]
            stepping.works = [alone]
            stepping.done.clear()
        if rest:
            self._submit(Stepping(server, rest, stepping.holding), first=True)
        with stepping.lock:
            stepping.aside = True
        if not self.steps.set_aside(server, stepping.future):
            # The step ended meanwhile: its lane goes on with the rest, as it would have.
            with stepping.lock:
                stepping.aside = False
            if ended:
                self._move_stepped(ended, outcomes, stepping.holding)
            return
        self.paces.set_aside(server)
        log.info(
            "%s: %s's step on %s under way for %.1f s is set aside; the server's other jobs go on",
            self.daemon.name,
            alone.job.jid,
            server or "a server",
            time.monotonic() - began,
        )
        if ended:
            self._move_stepped(ended, outcomes, stepping.holding)

    def _watch_steps(self) -> None:
        """The step watch's thread: while steps are in the step threads, wake the loop when one
        is due a look (``_note_slow_steps``), so that a loop waiting for its poll sets a slow
        step aside in time. It only reads; the loop does the rest."""
        signalled: tuple[int, float, int] | None = None
        while not self._watch_stop.is_set():
            self._watching.wait()
            with self._watched_lock:
                watched = list(self._watched)
                if not watched:
                    self._watching.clear()
                    continue
            moment = time.monotonic()
            for stepping in watched:
                with stepping.lock:
                    began, looked = stepping.began, stepping.looked
                if began is None or looked >= 2:
                    continue
                due = SERVER_SLOW if looked else self.paces.aside_after(stepping.server)
                if moment - began >= due and signalled != (id(stepping), began, looked):
                    signalled = (id(stepping), began, looked)
                    self.wake.set()
                    break
            self._watch_stop.wait(WATCH_EVERY)

    def _under_way(self) -> int:
        """Jobs of the batches sent and of the moves not collected yet."""
        return (
            sum(len(b.picks) for b in self.pending)
            + sum(len(s.works) for s in self.stepping)
            + sum(len(f.works) for f in self.inflight)
        )

    def _in_hand(self) -> set[str]:
        """Jobs of the batches sent and of the moves under way (still in the folder), and
        those on their way here from another loop of this process with their locks."""
        jids = self.keeper.in_transit() if self.keeper is not None else set()
        jids.update(w.job.jid for flight in self.inflight for w in flight.works)
        jids.update(w.job.jid for stepping in self.stepping for w in stepping.works)
        for batch in self.pending:
            jids.update(p.jid for p in batch.picks)
        for retry, _holding in self.retries:
            jids.update(p.jid for picks, _answer in retry.answers for p in picks)
        return jids

    def _drop_in_hand(self) -> None:
        """Forget every job this loop still has in hand (after an error, or when it stops):
        their locks, which the server may still hold for this session, are left to the lock
        reconciler, which deletes them. Without it they would pin the jobs for as long as the
        session lives."""
        jids = set(self.holding)
        jids.update(w.job.jid for flight in self.inflight for w in flight.works)
        self._end_steps()  # not left in doubt while their steps still run under the locks
        for stepping in self.stepping:
            jids.update(w.job.jid for w in stepping.works)
        for batch in self.pending:
            # Not the picks another thread holds (``busy``): their locks are that thread's.
            jids.update(p.jid for p in batch.picks if p.kept)
            if batch.claim is not None:
                jids.update(p.jid for p in batch.claim.picks)
        for retry, _holding in self.retries:
            jids.update(p.jid for picks, _answer in retry.answers for p in picks)
        self.inflight.clear()
        self._unwatch(self.stepping)
        self.stepping.clear()
        self.pending.clear()
        self.retries.clear()
        self.holding.clear()
        self.kept.clear()
        self.known.clear()
        if self.keeper is not None:
            self.keeper.arrived(list(jids))
        self.daemon.let_go(sorted(jids))
        ledger_of(self.zk).in_doubt(zpaths.job_node(jid, "lock") for jid in sorted(jids))

    def _abandon(self) -> None:
        """Stop claiming (a drain, a suspended connection, a stop): the batches sent but not
        started are given back with every kept lock; the moves under way are collected."""
        now = self._current()
        while self.pending:
            batch = self.pending.popleft()
            try:
                locked = batch.claim.collect() if batch.claim is not None else set()
            except Exception as exc:
                log.warning("%s: last claim: %s", self.daemon.name, exc)
                locked = set()
            for jid in locked:
                self._hold(jid, batch.holding)
            self._give_back([p.jid for p in batch.picks if p.kept or p.jid in locked], now)
        self._finish_stepping()  # their side effects are done: they are moved on if they can be
        self._finish_move()
        self.listing.apply_look_ahead()
        self._give_back(list(self.kept), now)

    def _begin(self, pick: Pick, loaded: dict[str, Any], known: Job | None) -> Work | None:
        """Check a locked job before its step; None when it ended here (lock given back).
        ``known``: the job as handed over, of which only part was read again."""
        daemon = self.daemon
        now = self.holding.get(pick.jid) or self._current()
        started = time.monotonic()
        mark = write_mark()
        try:
            if known is not None:
                job = job_refresh(known, loaded)
            else:
                job = jobs_finish_load(pick.jid, loaded)
        except (NotFound, MalformedNode):
            self._give_back([pick.jid], now)
            return None
        if job.state != daemon.state or not daemon.wants(job):
            # Moved on (an operator, another client) or not this loop's to take now.
            self._give_back([pick.jid], now)
            return None
        self.kept.pop(pick.jid, None)
        return Work(pick, job, started, mark)

    def _planned(
        self,
        work: Work,
        stepped: Stepped,
        takers: dict[str, Taking],
    ) -> bool:
        """Work out the move the step asked for (``stepped``: what ``run_step`` gave); False
        when the job ended here (lock given back). ``takers``: the loops that take jobs moved
        to a state with their locks, and how many more, as found for this batch. A job that
        loop would not take now (``would_take``: its depositor server at its download cap)
        goes with its lock released: kept, it would be given back at once."""
        daemon = self.daemon
        now = self.holding.get(work.pick.jid) or self._current()
        job, step, result = stepped
        work.job = job
        if result is not None:
            self._give_back([work.pick.jid], now)
            self._end(work, result)
            return False
        assert step is not None
        work.step = step
        taking = takers.get(step.target)
        if taking is None:
            loop, room = self.keeper.taker(step.target) if self.keeper is not None else (None, 0)
            taking = takers[step.target] = Taking(loop, room)
        taker = taking.loop
        if taker is not None and taker.daemon.would_take(job, taking.counts):
            taking.room -= 1
            if taking.room <= 0:
                taking.loop = None
        else:
            taker = None
        try:
            work.plan = transition_plan(
                job,
                step.target,
                message=step.message,
                permanent=step.permanent,
                priority=step.priority,
                lock="keep" if taker is not None else "release",
                drops=step.drops,
            )
        except InvalidTransition as exc:
            self._give_back([work.pick.jid], now)
            self._end(work, daemon.result(job.jid, "dropped", work.started, f"not moved: {exc}"))
            return False
        work.taker = taker
        return True

    def _steps(self, works: list[Work], holding: Holding) -> list[Stepped | Exception]:
        """A batch's steps, one after another: what each ``run_step`` gave, or the exception
        it raised, in its place. ``holding``: the session the jobs' locks were taken in, which
        fences the steps' writes."""
        claim = (holding.generation, holding.session)
        stepped: list[Stepped | Exception] = []
        for work in works:
            try:
                stepped.append(self.daemon.run_step(work.job, work.started, claim))
            except Exception as exc:
                stepped.append(exc)
        return stepped

    def _steps_elsewhere(self, stepping: Stepping) -> list[Stepped | Exception]:
        """A task's steps in a step thread, one after another (see ``Stepping``), keeping no
        database connection after them. A loop giving its jobs up begins no more of them, and
        the jobs of a server or URL found slow meanwhile are passed over."""
        holding = stepping.holding
        claim = (holding.generation, holding.session)
        try:
            while True:
                with stepping.lock:
                    at = len(stepping.done)
                    if at >= len(stepping.works):
                        return list(stepping.done)
                    work = stepping.works[at]
                    skip = (
                        self._not_stepped(stepping.server, work)
                        if self._giving_up
                        else self._passed_over(stepping.server, work)
                    )
                    if skip is not None:
                        stepping.done.append(skip)
                        continue
                    began = stepping.began = time.monotonic()
                    stepping.looked = 0
                outcome: Stepped | Exception
                try:
                    outcome = self.daemon.run_step(work.job, work.started, claim)
                except Exception as exc:
                    outcome = exc
                with stepping.lock:
                    stepping.done.append(outcome)
                    stepping.began = None
                    aside = stepping.aside
                pace = "" if self.workers else stepping.server  # a long step's: one pace
                self.paces.ended(pace, time.monotonic() - began, aside=aside)
        finally:
            close_old_connections()

    def _stepped(self, _future: Future[Any]) -> None:
        self.wake.set()

    def _finish_stepping(self, *, wait: bool = True) -> None:
        """Send the moves of the jobs whose steps ran in the step threads: those whose steps
        have ended, or (``wait``) all of them, the steps not begun yet given up (their jobs go
        back) and those under way waited for."""
        if wait:
            self._end_steps()
        ended = [s for s in self.stepping if s.future.done()]
        # The tasks ended since the last look move in one multi a session (a long step's
        # loop has a task a job).
        moving: dict[Holding, tuple[list[Work], list[Stepped | Exception]]] = {}
        for stepping in ended:
            self.stepping.remove(stepping)
            if stepping.future.cancelled():
                stepped: list[Stepped | Exception] = [
                    self._not_stepped(stepping.server, w) for w in stepping.works
                ]
            else:
                stepped = stepping.future.result()
            works, outcomes = moving.setdefault(stepping.holding, ([], []))
            works.extend(stepping.works)
            outcomes.extend(stepped)
        self._unwatch(ended)
        for holding, (works, outcomes) in moving.items():
            self._move_stepped(works, outcomes, holding)

    def _unwatch(self, steppings: list[Stepping]) -> None:
        with self._watched_lock:
            self._watched.difference_update(steppings)

    def _end_steps(self) -> None:
        """Wait for the steps under way in the step threads; those not begun yet are not
        begun (``NotStepped``)."""
        if not self.stepping:
            return
        self._giving_up = True
        try:
            for stepping in self.stepping:
                stepping.future.cancel()  # a task not begun yet
            wait_futures([s.future for s in self.stepping])
        finally:
            self._giving_up = False

    def _move_stepped(
        self, works: list[Work], stepped: list[Stepped | Exception], now: Holding
    ) -> None:
        """One move for the jobs of a batch whose steps asked for one (``_steps``' answers).
        A job whose step raised is given back on its own and, unless ZooKeeper's connection
        was the cause, passed over for STEP_ERROR_PAUSE: claimed again at once it would raise
        again as fast as it can be claimed, and its batch-mates go on."""
        # By target state, for this batch: the loop taking jobs there with their locks, and
        # how many more it takes.
        takers: dict[str, Taking] = {}
        moving = []
        waiting: list[ItemResult] = []  # not begun: one line for those alike (``log_moved``)
        for work, outcome in zip(works, stepped, strict=True):
            if not isinstance(outcome, Exception):
                if self._planned(work, outcome, takers):
                    moving.append(work)
                continue
            jid = work.job.jid
            name = self.daemon.name
            if isinstance(outcome, NotStepped):
                self._give_back([jid], now)
                if outcome.pause:
                    self.listing.busy([jid], outcome.pause)
                result = self.daemon.result(jid, "waiting", work.started, outcome.reason)
                self._end(work, result, logged=False)
                waiting.append(result)
                continue
            log.error("%s: unexpected error in the step of %s", name, jid, exc_info=outcome)
            self._give_back([jid], now)
            if not is_connection_error(outcome):
                self.listing.busy([jid], STEP_ERROR_PAUSE)
            why = f"not moved: the step raised {outcome!r}"
            self._end(work, self.daemon.result(jid, "dropped", work.started, why))
        if waiting:
            self.daemon.log_moved(waiting)
        self._send_move(moving, now)

    def _send_move(self, works: list[Work], now: Holding) -> None:
        if not works:
            return
        plans = [w.plan for w in works if w.plan is not None]
        self.listing.leaving(w.job.jid for w in works)
        handing = [w.job.jid for w in works if w.taker is not None]
        if handing and self.keeper is not None:
            self.keeper.sending(handing)
        try:
            move = self.daemon.gate.send_if_current(
                now.generation, lambda: self._send_checked(plans, now)
            )
        except LockLost:
            if handing and self.keeper is not None:
                self.keeper.arrived(handing)
            for work in works:
                self.holding.pop(work.job.jid, None)
                self._end(
                    work,
                    self.daemon.result(work.job.jid, "dropped", work.started, LOCK_LOST),
                )
            return
        self.inflight.append(InFlight(move, works, now))
        while len(self.inflight) > MAX_MOVES:
            self._finish_one()

    def _send_checked(self, plans: list[TransitionPlan], now: Holding) -> PendingMove:
        if session_id(self.zk) != now.session:
            raise LockLost()
        return PendingMove(self.zk, plans)

    def _finish_move(self, *, wait: bool = True) -> None:
        """Collect the moves under way: all of them, or (``wait`` False) those answered."""
        while self.inflight and (wait or self.inflight[0].move.ready()):
            self._finish_one()

    def _finish_one(self) -> None:
        flight = self.inflight.popleft()
        daemon = self.daemon
        now = flight.holding

        # Sends only: the answer is waited for outside the gate's lock.
        gate = daemon.gate.fence(self.zk, now.generation, now.session)

        try:
            outcomes = flight.move.collect(gate)
        except LockLost:
            outcomes = [NotFound(LOCK_LOST)] * len(flight.works)
        except Exception as exc:
            if not is_connection_error(exc):
                raise
            # Whether it landed is unknown: the next claim finds the jobs wherever they are.
            # Their locks, kept or not, may still be on the server with this session: no thread
            # works under them now, so they are left in doubt for the lock reconciler (noted as
            # held, they would stay until the session ended).
            if self.keeper is not None:
                self.keeper.arrived([w.job.jid for w in flight.works])
            ledger_of(self.zk).in_doubt(zpaths.job_node(w.job.jid, "lock") for w in flight.works)
            for work in flight.works:
                self.holding.pop(work.job.jid, None)
                self.kept.pop(work.job.jid, None)
                self.known.pop(work.job.jid, None)
                self._end(
                    work, daemon.result(work.job.jid, "dropped", work.started, f"ZooKeeper: {exc}")
                )
            return
        if self.keeper is not None:
            # Those handed over stay in transit until their loop takes them in.
            self.keeper.arrived(
                [
                    w.job.jid
                    for w, outcome in zip(flight.works, outcomes, strict=True)
                    if w.taker is not None and not isinstance(outcome, Job)
                ]
            )
        bids: set[str] = set()
        handing: dict[JobPipeline, list[tuple[Job, bool]]] = {}
        # A moved job's result is made for the observer and the log only when they take it;
        # otherwise only the last one, for ``daemon.last``.
        each = daemon.observer is not None or log.isEnabledFor(logging.INFO)
        last: Work | None = None
        moved: list[ItemResult] = []
        ended: list[tuple[Any, ItemResult]] = []  # the observer's, told at once
        for work, outcome in zip(flight.works, outcomes, strict=True):
            jid = work.job.jid
            step = work.step
            assert step is not None and work.plan is not None
            if not isinstance(outcome, Job):
                self._give_back([jid], now)
                daemon.not_moved(work.job, outcome)
                self._end(
                    work, daemon.result(jid, "dropped", work.started, f"not moved: {outcome}")
                )
                continue
            if work.plan.lock != "keep":
                self.holding.pop(jid, None)  # deleted with the move
            elif work.taker is not None:
                # Still in ``holding`` until its taker has it: should anything below fail,
                # ``_drop_in_hand`` leaves the lock in doubt rather than held by nobody.
                current = not written_since(jid, work.mark)
                handing.setdefault(work.taker, []).append((outcome, current))
            else:
                self._give_back([jid], now)
                if self.keeper is not None:
                    self.keeper.arrived([jid])
            bids.update(daemon.after_move(work.job, step))
            if each:
                result = daemon.moved_result(jid, step, work.started)
                moved.append(result)
                if work.token is not None:
                    ended.append((work.token, result))
            else:
                last = work
        if last is not None and last.step is not None:
            daemon.last = daemon.moved_result(last.job.jid, last.step, last.started)
        if moved:
            daemon.last = moved[-1]
            daemon.log_moved(moved)
        if ended and daemon.observer is not None:
            daemon.observer.end_many(ended)
        for taker, jobs in handing.items():
            jids = [job.jid for job, _current in jobs]
            taken = taker.hand(jobs, now)
            for jid in jids[:taken]:
                self.holding.pop(jid, None)
            if taken < len(jids):
                # It stopped meanwhile, or (a long step's loop) its threads were taken: the
                # other locks are given back.
                self._give_back(jids[taken:], now)
                if self.keeper is not None:
                    self.keeper.arrived(jids[taken:])
        check = daemon.ask_completion(bids)
        if check is not None:
            self.completions.append((next(_sent), check))

    def _finish_completions(self, *, wait: bool = True) -> None:
        """Take the answers of the completion checks: all of them, or (``wait`` False) those
        answered."""
        while self.completions and (wait or self.completions[0][1].ready()):
            self.daemon.batches_done(self.completions.popleft()[1])

    def _end(self, work: Work, result: ItemResult, *, logged: bool = True) -> None:
        daemon = self.daemon
        daemon.last = result
        if logged:
            daemon.log_result(result)
        if daemon.observer is not None and work.token is not None:
            daemon.observer.end(work.token, result)


def run_together(loops: list[JobPipeline], stop: threading.Event) -> None:
    """Run ``loops`` in this one thread until ``stop`` is set.

    One thread for several loops of short steps costs far less interpreter time than a thread
    each: those threads would take turns at the interpreter lock, waking one another for every
    batch (docs/benchmarks.md). Each loop takes its turn when it has work or its wake-up came.
    A turn does not wait for its batches' reads, moves or completion checks while another loop
    can go on; when none can, the thread waits for the one sent first, which the session
    answers first. What else a turn waits for (a listing, locks given back, a step run in the
    thread itself) holds up every loop of the thread. An error escaping one loop's turn stops
    none of them.
    """
    woken = threading.Event()
    for loop in loops:
        loop.wake.thread = woken
    begun: list[JobPipeline] = []
    due = [0.0] * len(loops)  # when each loop's next turn is due at the latest
    try:
        for loop in loops:
            loop.begin()
            begun.append(loop)
        while not stop.is_set():
            woken.clear()
            worked = False  # some turn did work: another pass at once
            waiting: list[tuple[int, int]] = []  # (the awaited request's order, the loop's place)
            for place, loop in enumerate(loops):
                if not loop.wake.is_set() and due[place] > time.monotonic():
                    continue
                loop.wake.clear()
                wait = _turn(loop, block=False)
                if wait is None:
                    assert loop.waits_for is not None
                    waiting.append((loop.waits_for, place))
                    wait = 0.0
                else:
                    worked = worked or wait == 0
                due[place] = time.monotonic() + wait
            if worked:
                continue
            if waiting:
                _order, place = min(waiting)
                wait = _turn(loops[place], block=True)
                due[place] = time.monotonic() + (wait or 0.0)
                continue
            rest = min(due) - time.monotonic()
            if rest > 0:
                woken.wait(min(rest, STOP_CHECK))
    finally:
        for loop in begun:
            loop.stopping = True  # no more hand-overs between them while they stop
        for loop in begun:
            loop.end()


def _turn(loop: JobPipeline, *, block: bool) -> float | None:
    """``loop.turn``; an error escaping it (outside a cycle, which handles its own) is logged
    and the loop waits for its poll, while the other loops of the thread go on."""
    try:
        return loop.turn(block=block)
    except Exception:
        log.exception("%s: unexpected error in its turn", loop.daemon.name)
        return loop.daemon.poll
