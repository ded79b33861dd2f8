"""Batched, pipelined job claims and moves for the consumer daemons.

A consumer's cost is per ZooKeeper request far more than per operation. So the daemons' batched
loop (``queues.daemons.pipeline``) claims several jobs with ONE multi (for each job: check its
index entry is still in the state's folder, create its ephemeral lock), reads them with one
multiRead, and moves them with ONE multi carrying every job's transition, exactly the writes of
``job_transition`` (``TransitionPlan``). Requests are sent with kazoo's public async API
(``transaction().commit_async()``, ``exists_async``, ``delete_async``) without waiting, so one
round trip carries the queue-hold read, the claim, the read of the claimed jobs and the previous
batch's move. ZooKeeper applies one session's requests in the order they were sent, so the read
sees the locks the claim before it created.

A batched multi is all or nothing. When it fails on contention (another consumer's lock already
there, an entry moved on, a status changed: NodeExists, NoNode, BadVersion) nothing was written.
A claim's answer names the operation it failed on: that job is passed over, and the jobs before
and after it are claimed again as two multis (sent at once, collected on the next round trip).
A failed move moves each job on its own through ``transition_apply`` (the one-job path, with its
index repair).

Loops of this project claiming in the same state divide its fresh jobs between them
(``ClaimShare``): each is listed under ``/mrt-console/claimers/<state>``, and a job belongs to the
loop at position ``crc32(jid) % count`` of the sorted names. A loop claims its own share in run
order and the others' only when its own is used up and an entry has waited ``steal_after`` seconds
(longer in a large folder: ``StateListing.steal_wait``; its owner is busy, stuck or gone), so
several processes walking one listing do not race for the same entries, and a job whose lock a
process keeps from step to step stays in that process's share at every step. The share only chooses
what to try first: the lock still decides. Merritt's own consumers do not take part and need not.

Why one module (about 840 lines): the claim, the read and the move of one batched cycle share
the pipelined requests and the decoding of a failed multi's answer, which must agree with each
other on the order of operations.
"""

from __future__ import annotations

import bisect
import heapq
import random
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from . import paths
from .codecs import encode_json
from .consumers import claimer_join, claimer_leave, claimers_list
from .errors import Conflict, InvalidTransition, NotFound, is_connection_error
from .jobs import TransitionPlan, transition_apply
from .kazoo_private import Multi, list_children, session_id
from .locks import ledger_of
from .nodes import children, collect_reads, first_failure, listing_age, start_reads
from .records import Job


@dataclass(slots=True)  # made for every job of every batch: not frozen (a third of the cost)
class Pick:
    """An index entry chosen for the next batch; ``kept``: its lock is already ours."""

    name: str  # "PP-jidNNNNNNNNNN"
    jid: str
    kept: bool = False
    stolen: bool = False  # taken over from another loop's share (``StateListing._steal``)


class ClaimShare:
    """This loop's share of one state's fresh jobs among the loops claiming there (see the
    module's docstring). ``refresh`` (in the loop's thread) joins, and joins again after a lost
    session, and reads the members when the watch said they changed; it sends nothing
    otherwise. Until it has joined, or while it is the only member, every job is its own."""

    def __init__(self, zk: KazooClient, state: str, member: str) -> None:
        self.zk = zk
        self.state = state
        self.member = member
        self.wanted = True
        self._changed = threading.Event()
        self._changed.set()
        self._session: int | None = None
        self._index = -1
        self._count = 0

    def _on_change(self, _event: Any) -> None:
        self._changed.set()

    def refresh(self) -> None:
        session = session_id(self.zk)
        if self.wanted and session != self._session:
            self._changed.set()  # a new session: the node and the watch went with the old one
        if not self._changed.is_set():
            return
        self._changed.clear()
        members = claimers_list(self.zk, self.state, watch=self._on_change)
        if self.wanted and self.member not in members:
            claimer_join(self.zk, self.state, self.member)
            members = claimers_list(self.zk, self.state)
        self._session = session
        self._count = len(members)
        self._index = members.index(self.member) if self.member in members else -1

    def leave(self) -> None:
        """Stop taking part (a drain, a stop): the others divide the jobs without this loop."""
        if not self.wanted:
            return
        self.wanted = False
        self._index = -1
        claimer_leave(self.zk, self.state, self.member)
        self._changed.set()

    def join(self) -> None:
        if not self.wanted:
            self.wanted = True
            self._changed.set()

    @property
    def members(self) -> int:
        return self._count

    @property
    def index(self) -> int:
        """This member's place among the sorted members (-1: not among them)."""
        return self._index

    @property
    def divided(self) -> bool:
        """Whether other members share the jobs with this one (else every job is its own)."""
        return self._index >= 0 and self._count > 1

    def mine(self, jid: str) -> bool:
        if self._index < 0 or self._count <= 1:
            return True
        return zlib.crc32(jid.encode()) % self._count == self._index


class Parking(Protocol):
    """Where a listing keeps the jobs that may be taken only a few at a time by a key (their
    depositor server's download slots): under the key, each take putting back as many as
    ``room`` says, in run order, rather than walking them all and refusing most, or dropping
    those passed over until the folder is listed again."""

    def key(self, jid: str) -> str | None:
        """The key ``jid`` waits under; None: none (taken as any job; when passed over, it
        waits for the next listing)."""
        ...

    def room(self, key: str) -> int:
        """How many of the key's jobs may be taken now."""
        ...

    def keys_any(self) -> bool:
        """Whether any job may have a key now (False: a listing need not ask of each)."""
        ...


class StateListing:
    """The entries of one job state folder in run order (priority, then age), for one consumer.

    Like ``JobClaimer``, the listing is kept up to ``max_age`` seconds (longer for a large folder:
    ``age_limit``) and listed again when it runs out. Entries of jobs this consumer already holds
    (locks kept from its previous step) are put in at their place in the order, so they wait behind
    higher-priority jobs as any job does. After a lost race (``crowded``) the entries ahead and
    their locks are read first and the batch is taken from a random run of the free ones (unless
    ``strict``), so consumers walking the same listing do not all go for its head. With a ``share``,
    entries of other loops' shares are passed over until this loop's own are used up and they have
    waited ``steal_wait()`` seconds.
    """

    FOREIGN_MAX = 100_000  # entries of other shares whose wait is timed, at most

    def __init__(
        self,
        zk: KazooClient,
        state: str,
        *,
        max_age: float = 1.0,
        strict: bool = False,
        share: ClaimShare | None = None,
        steal_after: float = 2.0,
        skip: Callable[[str], bool] | None = None,
    ) -> None:
        self.zk = zk
        # Jobs to pass over unclaimed (a collection at its cap: zk/caps.py; jobs waiting for
        # their next try). A skip that is false (nothing to pass over now) costs no call a name.
        self.skip = skip
        # The same for a whole listing at once, where what decides is read for many jobs in one
        # request (jobs bound for a held storage node: zk/waits.py). Called from the loop's
        # thread only.
        self.screen: Callable[[list[str]], list[str]] | None = None
        self.state = state
        self.folder = paths.job_state_folder(state)
        self.max_age = max_age
        self.strict = strict
        self._heap: list[str] = []
        self._listed_at = float("-inf")
        self._crowd = 0
        # Jobs found locked by another consumer (or moved on): passed over until then, so a
        # listing taken again does not send claims that are bound to fail.
        self._busy: dict[str, float] = {}
        self.busy_for = max(2.0, 2 * max_age)
        self._ahead: tuple[list[str], Any] | None = None  # a look-ahead read under way
        self._listing: tuple[float, Any] | None = None  # a listing under way: sent at, answer
        self._exclude: Container[str] = ()
        self._limit: Callable[[str], bool] | None = None
        self.share = share
        self.steal_after = steal_after
        # Other shares' entries passed over: those not yet found ripe to be taken over (in no
        # order), and those found ripe (waited ``steal_wait()``), in run order. A take looks at
        # the first only once one of them may be ripe, and cuts its run out of the second.
        self._deferred: list[str] = []
        self._ripe: list[str] = []
        self._first_seen: dict[str, float] = {}  # entry name -> when first passed over
        self._fresh_at = float("inf")  # none of ``_deferred`` is ripe before then
        # Jobs this consumer is moving out of the state: jid -> when the move was sent. A
        # listing sent before that may still show them (one sent after it cannot: ZooKeeper
        # answers a session's requests in order), and a claim of such an entry would fail.
        self._leaving: dict[str, float] = {}
        self._checked: set[str] = set()  # the last listing's index entry names
        # The division of the members the last listing was sorted out for (members, this
        # loop's place among them; None: not divided): when it changes, that listing is sorted
        # out again at once. Entry names in this loop's share and in the others', for it.
        self._division: tuple[int, int] | None = None
        self._mine: set[str] = set()
        self._theirs: set[str] = set()
        self._priorities: set[int] = set()  # of every entry name met
        self._found: set[str] = set()  # the last listing's entries, without kept jobs'
        # Entries that wait under a key (``parking``): key -> entry names in run order. Made
        # again at every listing.
        self.parking: Parking | None = None
        self._parked: dict[str, list[str]] = {}
        self._allowed: set[str] = set()  # put back by a take's ``_unpark``, its limit asked

    def _list(self, extra: Iterable[str]) -> None:
        self.listed(time.monotonic(), children(self.zk, self.folder), extra)

    @property
    def listed_at(self) -> float:
        """When the listing in use was sent (monotonic; -inf before the first)."""
        return self._listed_at

    def listed(self, sent: float, found: Iterable[str], extra: Iterable[str]) -> None:
        """Use ``found``, the folder's children as listed at ``sent`` (by the caller, with its
        watch), instead of the listing held; ``extra``: entries of kept jobs."""
        self._listing = None
        self._apply_listing(sent, found, extra)

    def _apply_listing(self, sent: float, found: Iterable[str], extra: Iterable[str]) -> None:
        # Every process lists the whole folder, most of it other loops' shares: what is done
        # for each entry is done with set operations, and in Python only for the entries new
        # since the last listing (at four processes, a per-entry loop here was a fifth of a
        # loop thread's time).
        now = time.monotonic()
        if self._busy:
            self._busy = {j: t for j, t in self._busy.items() if t > now}
        names = set(found)
        listed = names
        if self.skip:
            names = {n for n in names if not self.skip(n[3:])}
        if self.screen is not None:
            names = set(self.screen(list(names)))
        self._found = names
        passed = listed - names if len(names) < len(listed) else set()
        kept = set(extra)
        if kept:
            names = names | kept
        # Names checked at the last listing are not checked again (most of a big folder).
        entries = names & self._checked
        new = [n for n in names - entries if paths.INDEX_ENTRY_RE.fullmatch(n)]
        entries.update(new)
        self._checked = entries
        self._priorities.update(int(n[:2]) for n in new)
        if self._leaving:
            self._leaving = {j: t for j, t in self._leaving.items() if t >= sent}
            entries = entries - self._names_of(self._leaving)
        self._deferred = []
        self._ripe = []
        self._fresh_at = float("inf")
        if self._first_seen:
            first = self._first_seen
            for name in first.keys() - names:
                del first[name]
        share = self.share
        division = self._division_now()
        mine, theirs = self._mine, self._theirs
        if division != self._division or len(mine) + len(theirs) > 2 * len(entries) + 1024:
            self._division = division
            mine.clear()
            theirs.clear()
        if share is not None and division is not None:
            # Other shares' entries go straight to the deferred list (what ``_pop`` would do
            # with each of them, one by one, at every listing); entries of kept jobs are ours.
            # Whose share an entry is in is worked out once per division of the members.
            for name in entries - mine - theirs:
                (mine if share.mine(name[3:]) else theirs).add(name)
            foreign = (entries & theirs) - kept
            if self._busy:
                foreign -= self._names_of(self._busy)
            self._defer(foreign, now)
            entries = (entries & mine) | (entries & kept)
        self._parked = {}
        if self.parking is not None:
            entries = entries - self._park_listed(passed, entries - kept, sent)
        self._heap = list(entries)
        heapq.heapify(self._heap)
        self._listed_at = sent

    def _division_now(self) -> tuple[int, int] | None:
        share = self.share
        return (share.members, share.index) if share is not None and share.divided else None

    def _names_of(self, jids: Iterable[str]) -> set[str]:
        """The index entry names these jobs may have in the listings met so far (one for each
        priority met)."""
        return {paths.index_name(p, jid) for p in self._priorities for jid in jids}

    def _park_listed(self, passed: set[str], own: set[str], sent: float) -> set[str]:
        """Keep under their keys the entries of a listing that have one: those it passed over
        (``skip``, ``screen``) of this loop's share and not moving out, and those of its own to
        take (``own``), which ``_unpark`` puts back as their keys have room. A take then does
        not walk, ask about and park again one by one the jobs of a server it has no slot for.
        Returns the entries of ``own`` parked; one with no key stays to be taken, one passed
        over with no key waits for the next listing."""
        assert self.parking is not None
        if not self.parking.keys_any():
            return set()  # no job has a key (no server full yet): none walked
        key_of = self.parking.key
        share = self.share if self.share is not None and self.share.divided else None
        if passed and self._leaving:
            passed = passed - self._names_of(j for j, t in self._leaving.items() if t >= sent)
        parked = self._parked
        taken: set[str] = set()
        for name in passed | own:
            jid = name[3:]
            if name not in own and (
                paths.INDEX_ENTRY_RE.fullmatch(name) is None
                or (share is not None and not share.mine(jid))
            ):
                continue
            key = key_of(jid)
            if key is not None:
                parked.setdefault(key, []).append(name)
                if name in own:
                    taken.add(name)
        for names in parked.values():
            names.sort()  # run order
        return taken

    def _park(self, name: str) -> None:
        """An entry a take's ``limit`` refused: under its key, in run order, if it has one."""
        key = self.parking.key(name[3:]) if self.parking is not None else None
        if key is not None:
            bisect.insort(self._parked.setdefault(key, []), name)

    def _unpark(self, limit: Callable[[str], bool] | None = None) -> None:
        """Put back in the run order as many of each key's entries as ``room`` says may be
        taken, and (given a take's ``limit``) as it allows, asked once for each, the first it
        refuses ending the key's turn: a key's parked entries are looked at when it has room,
        not at every take, and are not refused and parked again one by one."""
        if not self._parked or self.parking is None:
            return
        room = self.parking.room
        for key in list(self._parked):
            free = room(key)
            if free <= 0:
                continue
            names = self._parked[key]
            back = 0
            for name in names[:free]:
                if limit is not None:
                    if not limit(name[3:]):
                        break
                    self._allowed.add(name[3:])  # counted by the limit: not asked again
                heapq.heappush(self._heap, name)
                back += 1
            del names[:back]
            if not names:
                del self._parked[key]

    @property
    def parked(self) -> int:
        """How many entries wait under a key."""
        return sum(len(names) for names in self._parked.values())

    def _refresh(self, kept: dict[str, str], fresh: bool) -> None:
        """List the folder again when asked to (at once) or when the listing is ``max_age``
        old: then the listing is sent and used once answered, without waiting for it unless
        nothing is left to take."""
        if fresh or self._listed_at == float("-inf"):
            self._list(kept.values())  # asked for, or the first listing: wait for it
            return
        now = time.monotonic()
        if self._listing is None and now - self._listed_at >= self.age_limit():
            self._listing = (now, list_children(self.zk, self.folder))
        if self._listing is not None and (self._listing[1].ready() or not self._heap):
            (sent, answer), self._listing = self._listing, None
            try:
                found = answer.get()
            except NoNodeError:
                found = []
            self._apply_listing(sent, found, kept.values())

    def age_limit(self) -> float:
        """How old the listing may grow while entries are left in it (``nodes.listing_age``;
        a loop whose entries ran out lists at once: ``JobPipeline.turn``, the folder's
        watch)."""
        return listing_age(self.max_age, len(self._checked))

    def steal_wait(self) -> float:
        """How long another share's entry waits before it is taken over: ``steal_after``, and
        twice as much again as the listing may be older than ``max_age``. An entry its owner
        moved meanwhile stays in a listing until the next one; taken over before then, its
        claim would fail."""
        return self.steal_after + 2 * (self.age_limit() - self.max_age)

    def others_only(self) -> float | None:
        """When the last listing left nothing to take but other shares' entries, none of them
        ready to be taken over yet: the seconds until the first is. Otherwise None. Parked
        entries whose key has room now count as this loop's to take (they are put back)."""
        self._unpark()
        if self._heap or not (self._deferred or self._ripe):
            return None
        return max(0.0, self._ripe_from() - time.monotonic())

    def _ripe_from(self) -> float:
        """When a take may find other shares' entries to take over: at once when some were
        found ripe (in hand here or not), else when the first of those set aside ripens."""
        return float("-inf") if self._ripe else self._fresh_at

    def add(self, name: str) -> None:
        """Put in an index entry name (``paths.index_name``'s, or one taken from a listing)."""
        heapq.heappush(self._heap, name)

    def leaving(self, jids: Iterable[str]) -> None:
        """These jobs' moves out of the state are being sent (same session as the listings):
        listings sent before now leave them out."""
        now = time.monotonic()
        for jid in jids:
            self._leaving[jid] = now

    def crowded(self) -> None:
        self._crowd = min(16, self._crowd + 8)

    def busy(self, jids: Iterable[str], seconds: float | None = None) -> None:
        """Pass these jobs over for ``busy_for`` s (taken by another consumer), or for
        ``seconds`` (a caller's own reason: a step that raised)."""
        until = time.monotonic() + (self.busy_for if seconds is None else seconds)
        for jid in jids:
            self._busy[jid] = until

    def take(
        self,
        count: int,
        kept: dict[str, str],
        *,
        claim: bool = True,
        fresh: bool = False,
        exclude: Container[str] = (),
        limit: Callable[[str], bool] | None = None,
    ) -> list[Pick]:
        """Up to ``count`` entries in run order; ``kept`` maps jid -> entry name of jobs whose
        lock this consumer holds (always free to it). Without ``claim`` the batch ends with
        its last kept job: new jobs are taken only ahead of a kept one in the run order.

        The folder is listed again when the listing is ``max_age`` old, or when ``fresh`` is
        asked for: the caller does so before it goes idle (after setting its folder watch), so
        no job is missed; a listing that merely ran out is not listed again at once (a loop fed
        with kept jobs would otherwise list its folder for every batch). ``exclude``: jobs this
        consumer has in hand (claimed or moving), which a new listing still shows. ``limit``:
        asked of each job this take would claim, in run order, whether it may be (it counts
        those it allows); one of its own share it refuses is left out until the next listing,
        like a ``skip``, or waits under its key (``parking``), one of another share's stays set
        aside. Parked entries whose key has room are put back before the take.
        """
        if self.share is not None:
            self.share.refresh()
            if (
                not fresh
                and self._listed_at != float("-inf")
                and self._division_now() != self._division
            ):
                # Members joined or left since the listing was sorted out: until the next
                # one (up to ``max_age``) this loop would claim entries now another's (failed
                # claims) and pass over entries now its own. The same listing, sorted again.
                self._apply_listing(self._listed_at, self._found, kept.values())
        self._refresh(kept, fresh)
        self._unpark(limit)
        self._exclude = exclude
        self._limit = limit
        try:
            picks = self._take(count, kept)
        finally:
            self._exclude = ()
            self._limit = None
            self._allowed.clear()
        self._crowd = max(0, self._crowd - 1)
        if not claim:
            while picks and not picks[-1].kept:
                heapq.heappush(self._heap, picks.pop().name)
        return picks

    def _pop(self, kept: dict[str, str]) -> Pick | None:
        while self._heap:
            name = heapq.heappop(self._heap)
            jid = name[3:]  # "PP-" + jid: only index entry names are put in (checked then)
            if jid in kept:
                if kept[jid] != name:
                    continue  # an old entry of a kept job (its priority changed)
                return Pick(name, jid, True)
            if jid in self._exclude:
                continue
            if jid in self._busy:
                if self._busy[jid] > time.monotonic():
                    continue
                del self._busy[jid]
            if self.share is not None and not self.share.mine(jid):
                self._defer([name], time.monotonic())
                continue
            if self._limit is not None and jid not in self._allowed and not self._limit(jid):
                self._park(name)
                continue
            return Pick(name, jid, False)
        return None

    def _defer(self, names: list[str] | set[str], now: float) -> None:
        """Set aside other shares' entries (a listing's, as a set; a few of ``_pop``'s, as a
        list): when each was first passed over, and so the first time one of them may be
        taken over. One pass for a whole listing. They are put in run order when one is to be
        taken over (most listings' are never looked at again)."""
        self._deferred += names
        first = self._first_seen
        room = self.FOREIGN_MAX - len(first)
        if room > 0:
            unseen: Iterable[str]
            if isinstance(names, set):  # a listing's
                unseen = names.difference(first)  # in C
                if len(unseen) > room:
                    unseen = sorted(unseen)[:room]  # the first in run order
            else:
                unseen = [n for n in names if n not in first][:room]
            first.update(dict.fromkeys(unseen, now))
        if isinstance(names, list):
            earliest = min((first[n] for n in names if n in first), default=None)
        else:
            # After a listing only entries still in the folder are there: the earliest of them
            # all (one of them taken meanwhile makes a take look once too early).
            earliest = min(first.values(), default=None)
        if earliest is not None:
            self._fresh_at = min(self._fresh_at, earliest + self.steal_wait())

    def _steal(self, room: int) -> list[Pick]:
        """Up to ``room`` entries of other shares that have waited ``steal_wait()`` seconds
        (called once this loop's own share is used up). Unless ``strict``, a run of them at a
        random place in the later half of those of the first priority: their owner works from
        the first, and other loops steal too, so they do not all race for the same locks (a
        lost race fails the whole claim multi). A higher priority's entries are still taken
        before a lower one's.

        Its cost is that of the run it takes, not of all the entries set aside: a loop that
        takes over a slow owner's share of a big campaign does so some 16 entries a take, and
        every loop of its thread waits while it looks (a scan of 75,000 entries at every take
        was 80 ms a take; now some 30 us). The entries set aside are looked at once they may be
        ripe, and those found ripe join the ripe ones, kept in run order (they stay ripe)."""
        now = time.monotonic()
        if room <= 0 or not (self._deferred or self._ripe) or now < self._ripe_from():
            return []
        if self._deferred and now >= self._fresh_at:
            wait = self.steal_wait()
            ripe_before = now - wait
            next_ripe = float("inf")
            fresh: list[str] = []
            waiting: list[str] = []
            for name in self._deferred:
                seen = self._first_seen.get(name)
                if seen is not None and seen <= ripe_before:
                    fresh.append(name)
                else:
                    # Not ripe yet, or not timed (over FOREIGN_MAX; a later listing times it).
                    waiting.append(name)
                    if seen is not None and seen + wait < next_ripe:
                        next_ripe = seen + wait
            self._deferred = waiting
            self._fresh_at = next_ripe
            if fresh:
                self._ripe = sorted({*self._ripe, *fresh})  # a name set aside twice, once
        ripe = self._ripe
        chosen: list[str] = []
        lo, hi = 0, len(ripe)
        if ripe and not self.strict:
            # The first priority with an entry that is not in hand here.
            first = next((n[:2] for n in ripe if n[3:] not in self._exclude), None)
            if first is not None:
                lo = bisect.bisect_left(ripe, first)
                hi = bisect.bisect_left(ripe, first + ".")  # "." sorts just after "-"
                # A run in the later half: the owner's first entries may be taken since the
                # listing (a claim of one fails); other thieves pick other places.
                low = lo + min((hi - lo) // 2, max(0, hi - lo - room))
                lo = random.randint(low, max(low, hi - room))
        place = lo
        refused = 0  # by ``limit``: left where they are; a few runs' worth looked at, at most
        while place < hi and len(chosen) < room and refused <= 4 * room:
            name = ripe[place]
            if name[3:] not in self._exclude:
                if self._limit is None or self._limit(name[3:]):
                    chosen.append(name)
                else:
                    refused += 1
            place += 1
        if chosen:
            taken = set(chosen)
            ripe[lo:place] = [name for name in ripe[lo:place] if name not in taken]
        return [Pick(name, name[3:], stolen=True) for name in chosen]

    def _take(self, count: int, kept: dict[str, str]) -> list[Pick]:
        crowded = self._crowd > 0 and not self.strict
        window: list[Pick] = []
        seen: set[str] = set()
        want = 4 * count if crowded else count
        while len(window) < want:
            pick = self._pop(kept)
            if pick is None:
                window.extend(p for p in self._steal(want - len(window)) if p.jid not in seen)
                break
            if pick.jid not in seen:
                seen.add(pick.jid)
                window.append(pick)
        if not crowded:
            window.sort(key=lambda p: p.name)
            return window
        # Crowded: the batch is a random run of the entries ahead (those the last look ahead
        # found taken are passed over already), so consumers walking the same listing do not
        # all go for its head.
        kept_picks = [p for p in window if p.kept]
        free = [p for p in window if not p.kept]
        room = max(0, count - len(kept_picks))
        start = 0
        if len(free) > room:
            start = random.randrange(0, (len(free) - room) // max(1, room) + 1) * room
        chosen = free[start : start + room]
        for p in free:
            if p not in chosen:
                heapq.heappush(self._heap, p.name)
        result = kept_picks + chosen
        result.sort(key=lambda p: p.name)
        return result

    def look_ahead(self, count: int, kept: dict[str, str]) -> None:
        """While crowded: send a read of the next entries and their locks now (it travels with
        the caller's claim); ``apply_look_ahead`` passes over those found gone or locked, so a
        listing up to ``max_age`` old does not cost failed claims."""
        if not self._crowd or self._ahead is not None:
            return
        share = self.share
        names = [
            n
            for n in heapq.nsmallest(8 * count, self._heap)
            if (m := paths.INDEX_ENTRY_RE.fullmatch(n))
            and m.group(2) not in kept
            and (share is None or share.mine(m.group(2)))
        ]
        if names:
            reads = [
                x
                for n in names
                for x in (f"{self.folder}/{n}", paths.job_node(n.partition("-")[2], "lock"))
            ]
            self._ahead = (names, start_reads(self.zk, reads))

    @property
    def looking_ahead(self) -> bool:
        """Whether a look-ahead read is under way (requests sent now are answered after it)."""
        return self._ahead is not None

    def apply_look_ahead(self) -> None:
        """Pass over the entries the look-ahead read found gone or locked (call it once a
        request sent after that read has been answered: then it has been too)."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return
        names, pending = ahead
        reads = collect_reads(pending)
        self.busy(
            n.partition("-")[2]
            for n in names
            if reads[f"{self.folder}/{n}"] is None
            or reads[paths.job_node(n.partition("-")[2], "lock")] is not None
        )


class PendingClaim:
    """Locks for several jobs, sent at once; ``collect`` says which were taken. The jobs of
    this loop's own share are claimed in one multi; each job taken over from another share
    (``Pick.stolen``) in a multi of its own: its owner may have locked or moved any of them
    since the listing, and one such job would fail a multi of them all (at the end of a run,
    when loops with nothing left take over, nearly every such multi failed). Jobs whose lock
    another thread of this process holds are not sent: they are ``busy``."""

    def __init__(self, zk: KazooClient, picks: Sequence[Pick], folder: str) -> None:
        self.zk = zk
        self.folder = folder
        self.picks, self.busy = _claimable(zk, picks)
        self.fell_back = False
        self.lost: list[Pick] = []  # found locked by another consumer, or moved on
        self._together = [p for p in self.picks if not p.stolen]
        self._answer: Any = None
        self._alone: list[tuple[Pick, Any]] = []
        try:
            if self._together:
                self._answer = _send_claim(zk, self._together, folder)
            for pick in self.picks:
                if pick.stolen:
                    self._alone.append((pick, _send_claim(zk, [pick], folder)))
        except Exception:
            self.abandon()  # whatever was sent may lock its jobs
            raise

    def abandon(self) -> None:
        """The caller cannot follow this claim through (an error came between its sending and
        its locks being taken into a loop's hands): whatever it took is left in doubt, for the
        lock reconciler. Noted as held, its locks would pin the jobs for the session's life."""
        ledger_of(self.zk).in_doubt(_lock_paths(self.picks))

    def collect(self) -> set[str]:
        """The jids locked: those of the multi of this loop's share (all of them, or none when
        it failed on contention: then nothing of it was written, and ``fallback`` tries the
        others again) and each job taken over that was free (the others are ``lost``). Every
        answer is taken; then a connection error propagates, every lock left in doubt."""
        locked: set[str] = set()
        error: Exception | None = None
        if self._answer is not None:
            try:
                results = _claim_answer(self.zk, self._answer, self._together)
            except Exception as exc:
                error = exc
            else:
                if not _failed(results):
                    locked.update(p.jid for p in self._together)
                else:
                    self.fell_back = True
                    ledger_of(self.zk).given_up(_lock_paths(self._together))
                    if len(self._together) == 1:
                        self.lost.append(self._together[0])
        for pick, answer in self._alone:
            try:
                results = _claim_answer(self.zk, answer, [pick])
            except Exception as exc:
                error = error or exc
                continue
            if _failed(results):
                ledger_of(self.zk).given_up(_lock_paths([pick]))
                self.lost.append(pick)
            else:
                locked.add(pick.jid)
        if error is not None:
            # The caller never learns of the locks taken: they are in doubt too.
            ledger_of(self.zk).in_doubt(_lock_paths(p for p in self.picks if p.jid in locked))
            raise error
        return locked

    def fallback(self) -> PendingRetry | None:
        """After a failed multi: the job whose operation failed is lost (ZooKeeper's answer
        names the first failed operation; the multi stops there); the jobs before it and those
        after it are claimed again as two multis, sent now and collected later. None when the
        multi did not fail, or held that one job only (it is in ``lost``)."""
        together = self._together
        if not self.fell_back or len(together) < 2:
            return None
        failed = first_failure(self._answer.get())
        if failed is None:  # no operation named: each job on its own
            return PendingRetry(self.zk, [[p] for p in together], self.folder, [])
        k = failed // 2  # two operations a job: the entry's check, the lock's create
        groups = [g for g in (together[:k], together[k + 1 :]) if g]
        return PendingRetry(self.zk, groups, self.folder, [together[k]])


class PendingRetry:
    """Claims sent again after a failed claim multi, a multi per group of jobs; the caller
    collects them on its next round trip instead of waiting for them now."""

    def __init__(
        self, zk: KazooClient, groups: Sequence[Sequence[Pick]], folder: str, lost: list[Pick]
    ) -> None:
        self.zk = zk
        self.lost = list(lost)
        self.answers: list[tuple[list[Pick], Any]] = []
        for group in groups:
            picks, busy = _claimable(zk, group)
            self.lost.extend(busy)
            if not picks:
                continue
            try:
                self.answers.append((picks, _send_claim(zk, picks, folder)))
            except Exception:
                ledger_of(zk).in_doubt(_lock_paths(picks))
                self.abandon()
                raise

    def abandon(self) -> None:
        """As ``PendingClaim.abandon``: every lock these claims may have taken is in doubt."""
        ledger_of(self.zk).in_doubt(
            p for picks, _answer in self.answers for p in _lock_paths(picks)
        )

    def ready(self) -> bool:
        return all(answer.ready() for _picks, answer in self.answers)

    def collect(self) -> tuple[list[Pick], list[Pick], list[Pick]]:
        """The picks now locked by this session; those another consumer had (or that moved
        on); and those of a group that failed on another job's account, not tried."""
        locked: list[Pick] = []
        lost = list(self.lost)
        untried: list[Pick] = []
        for i, (picks, answer) in enumerate(self.answers):
            try:
                results = _claim_answer(self.zk, answer, picks)
            except Exception:
                # The groups not collected yet are in doubt too (their answers will not come),
                # and so are those locked already: the caller never learns of them.
                ledger_of(self.zk).in_doubt(
                    path
                    for group in [locked, *(later for later, _answer in self.answers[i + 1 :])]
                    for path in _lock_paths(group)
                )
                raise
            if not _failed(results):
                locked.extend(picks)
                continue
            ledger_of(self.zk).given_up(_lock_paths(picks))
            failed = first_failure(results)
            k = failed // 2 if failed is not None and len(picks) > 1 else 0
            lost.append(picks[k])
            untried.extend(p for i, p in enumerate(picks) if i != k)
        return locked, lost, untried


def _lock_paths(picks: Iterable[Pick]) -> list[str]:
    return [paths.job_node(p.jid, "lock") for p in picks]


def _claimable(zk: KazooClient, picks: Sequence[Pick]) -> tuple[list[Pick], list[Pick]]:
    """``picks`` split into those whose locks are now noted as this thread's (to be sent) and
    those another thread of this process holds (its job in hand there: not to be claimed)."""
    locks = _lock_paths(picks)
    free = ledger_of(zk).claim_free(locks)
    ours = [p for p, lock in zip(picks, locks, strict=True) if lock in free]
    return ours, [p for p, lock in zip(picks, locks, strict=True) if lock not in free]


def _send_claim(zk: KazooClient, picks: Sequence[Pick], folder: str) -> Any:
    """The claim multi of ``picks``, whose locks ``_claimable`` noted as this thread's."""
    txn = Multi(zk)
    for pick in picks:
        _lock_ops(txn, f"{folder}/{pick.name}", pick.jid)
    return txn.commit_async()


def _claim_answer(zk: KazooClient, answer: Any, picks: Sequence[Pick]) -> Any:
    """A claim multi's answer; a connection error leaves its locks in doubt (the server may
    have created them: the reconciler looks) and propagates."""
    try:
        return answer.get()
    except Exception as exc:
        if is_connection_error(exc):
            ledger_of(zk).in_doubt(_lock_paths(picks))
        else:
            ledger_of(zk).given_up(_lock_paths(picks))
        raise


def _lock_ops(txn: Any, entry: str, jid: str) -> None:
    txn.check(entry, -1)
    txn.create(paths.job_node(jid, "lock"), b"", ephemeral=True)


def _failed(results: Any) -> bool:
    return not isinstance(results, list) or any(isinstance(r, Exception) for r in results)


Outcome = Job | Conflict | InvalidTransition | NotFound


# Batch index folders each client made or found (a batch's ``batch-completed`` and
# ``batch-failed`` are made when its first job ends), at most FOLDERS_KNOWN_MAX at once.
_folders_known: weakref.WeakKeyDictionary[KazooClient, set[str]] = weakref.WeakKeyDictionary()
FOLDERS_KNOWN_MAX = 100_000


def _make_folders(zk: KazooClient, entries: list[str]) -> None:
    """Send a create of each batch index folder ``entries`` go into that this process has not
    met yet, without waiting: answered before a multi sent after them (ZooKeeper answers a
    session's requests in order), which would otherwise fail whole on the missing folder and
    move its jobs one by one. A folder there already answers NodeExists; a batch deleted
    meanwhile answers NoNode (its folder is not made, and the move fails as it would have)."""
    batches = f"{paths.BATCHES}/"
    folders = {entry.rpartition("/")[0] for entry in entries if entry.startswith(batches)}
    known = _folders_known.setdefault(zk, set())
    root = zk.chroot or ""  # a client may be moved to another chroot (the tests' is)
    new = {folder for folder in folders if root + folder not in known}
    if not new:
        return
    if len(known) + len(new) > FOLDERS_KNOWN_MAX:
        known.clear()
    for folder in sorted(new):
        zk.create_async(folder, b"")
    known.update(root + folder for folder in new)


class PendingMove:
    """Several jobs' transitions in one multi, sent at once (``send`` may refuse to send it)."""

    def __init__(self, zk: KazooClient, plans: Sequence[TransitionPlan]) -> None:
        self.zk = zk
        self.plans = list(plans)
        self.fell_back = False
        txn = Multi(zk)
        # The jobs of a batch most often get the same status (same step, same second): it is
        # encoded once for a run of equal ones, keys in the same order.
        raw: dict[str, Any] | None = None
        status = b""
        changes = [plan.index_changes() for plan in self.plans]
        _make_folders(zk, [path for _deletes, creates in changes for path in creates])
        for plan, (deletes, creates) in zip(self.plans, changes, strict=True):
            if plan.raw != raw or list(plan.raw) != list(raw or ()):
                raw, status = plan.raw, encode_json(plan.raw)
            plan.add_to(txn, deletes, creates, lock=plan.lock, status=status)
        self._request, self._answer = txn.send()

    def ready(self) -> bool:
        """Whether the server has answered (``collect`` will not wait for the multi)."""
        return bool(self._answer.ready())

    def collect(self, gate: Callable[[Callable[[], Any]], Any]) -> list[Outcome]:
        """Each plan's moved job, or the error that kept it where it was.

        When the multi failed nothing was written; each job is then moved on its own through
        ``transition_apply`` (the one-job path), each of its writes sent through ``gate``
        (which refuses once the session that holds the locks is gone) and waited for outside
        it. A connection error leaves every lock of the move in doubt (the caller forgets the
        jobs; the reconciler deletes what the server still holds) and propagates.
        """
        ledger = ledger_of(self.zk)
        try:
            self._answer.get()
        except Exception as exc:
            if is_connection_error(exc):
                ledger.in_doubt(plan.lock_path for plan in self.plans if plan.lock is not None)
            raise
        if not self._request.failed:
            ledger.given_up(plan.lock_path for plan in self.plans if plan.lock == "release")
            # The status writes' answers, in the plans' order (a plan that changes the priority
            # writes that node too, after its status): each moved job as the server stamped it.
            stats = iter(self._request.stats)
            moved: list[Outcome] = []
            for plan in self.plans:
                moved.append(plan.moved(next(stats, None)))
                if plan.new_priority != plan.job.priority:
                    next(stats, None)
            return moved
        self.fell_back = True
        outcomes: list[Outcome] = []
        for i, plan in enumerate(self.plans):
            try:
                outcomes.append(transition_apply(self.zk, plan, require_lock=True, gate=gate))
            except (Conflict, InvalidTransition, NotFound) as exc:
                outcomes.append(exc)
            except Exception as exc:
                if is_connection_error(exc):
                    ledger.in_doubt(p.lock_path for p in self.plans[i:] if p.lock is not None)
                raise
        return outcomes


def send_releases(zk: KazooClient, jids: Iterable[str]) -> list[tuple[str, Any]]:
    """Send a delete of each of the locks of ``jids`` (this session's own: the caller knows it
    holds them), all at once and without waiting (``collect_releases`` waits)."""
    sent = [(path, zk.delete_async(path)) for path in (paths.job_node(j, "lock") for j in jids)]
    # Noted once the deletes are queued: a reconciliation that began before saw these locks
    # as held, and leaves them alone now (another client may take one once it is deleted).
    ledger_of(zk).given_up(path for path, _answer in sent)
    return sent


def collect_releases(zk: KazooClient, sent: list[tuple[str, Any]]) -> None:
    """Wait for the deletes ``send_releases`` sent; a lock already gone is fine. One that
    came back with a connection error is left to the lock reconciler (it deletes it once the
    connection is back, or finds it gone with the session)."""
    doubt = []
    for path, answer in sent:
        try:
            answer.get()
        except NoNodeError:
            continue
        except Exception as exc:
            if not is_connection_error(exc):
                raise
            doubt.append(path)
    ledger_of(zk).in_doubt(doubt)


def release_locks(zk: KazooClient, jids: Iterable[str]) -> None:
    """Delete the locks of ``jids`` in one round trip (``send_releases``, ``collect_releases``)."""
    collect_releases(zk, send_releases(zk, jids))
