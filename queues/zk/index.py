"""A read-side index of the queue for the web process, kept current by ZooKeeper watches.

A page of 50 jobs must not cost a listing of the 60,000 names in ``/jobs/states/completed``,
and the overview must not read 2,000 batch status nodes on every refresh. This index keeps, per
process, what those pages would otherwise read again and again:

- the sorted entries of every watched folder (job state folders, ``/batches``), re-listed only
  after a child watch said the folder changed;
- every batch's state, re-read only after a data watch on its ``status`` node fired;
- facts about a job that never change once it exists (profile, submitter, local ID: its
  ``configuration``), read once per job;
- ``space_needed`` per job and state, re-read when the job moves to another state.

Watches only mark entries stale; the next reader refreshes them. So a busy queue costs the web
process nothing between page views, and a page pays only for what changed since the last one.
Correctness rests on one rule: an entry is marked clean *before* the read that refreshes it
(which also re-arms its watch), so a change after that read always leaves it stale again. On a
dropped connection kazoo fires every watch with an empty event and forgets it (it does not
restore watches on reconnect); the index then marks everything stale.

``space_needed`` is the one approximation: the Estimating step writes it while the job stays in
Estimating, so a value read during that step stays until the job moves on (seconds).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import Callback, KeeperState

from queues.states import JOB

from . import paths
from .codecs import decode_int, decode_json
from .errors import MalformedNode
from .nodes import read_many

MAX_FACTS = 1_000_000
# How long a read waits for kazoo's callback thread before using what it has.
SETTLE_SECONDS = 2.0
MAX_FILTERS_PER_LISTING = 32


@dataclass(frozen=True)
class JobFacts:
    """What a job's ``configuration`` says about it; written once when the job is created."""

    profile: str
    submitter: str
    local_id: str


@dataclass(frozen=True)
class _Listing:
    names: list[str]
    # Views derived from exactly these names (parsed, re-sorted), computed on first use.
    derived: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Folder:
    listing: _Listing | None = None
    stale: bool = True


@dataclass(frozen=True)
class BatchState:
    state: str  # "?" when the status node does not decode
    mtime_ms: int


def _jid_set(names: list[str]) -> frozenset[str]:
    return frozenset(m.group(2) for n in names if (m := paths.INDEX_ENTRY_RE.fullmatch(n)))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


class ReadIndex:
    """The index of one ZooKeeper client (one per web process; tests make their own)."""

    def __init__(self, zk: KazooClient) -> None:
        self.zk = zk
        self._lock = threading.Lock()
        self._folders: dict[str, _Folder] = {}
        self._batches: dict[str, BatchState | None] = {}
        self._stale_batches: set[str] = set()
        # Bumped whenever a batch's known state changes, so summaries are computed once per change.
        self._batch_generation = 0
        self._batch_summary: tuple[int, dict[str, tuple[int, int]]] | None = None
        self._facts: dict[str, JobFacts] = {}
        self._space: dict[str, dict[str, int]] = {}
        zk.add_listener(self._on_session)

    def close(self) -> None:
        self.zk.remove_listener(self._on_session)

    # Watches: only ever mark things stale (they run on kazoo's event thread) -----------------

    def _on_session(self, state: str) -> None:
        self.mark_all_stale()

    def mark_all_stale(self) -> None:
        with self._lock:
            for folder in self._folders.values():
                folder.stale = True
            self._stale_batches.update(self._batches)
            # Facts and space are not watched: they are only ever true per job and state.

    def _on_folder_event(self, event: Any) -> None:
        with self._lock:
            folder = self._folders.get(event.path) if event.path else None
            if folder is not None:
                folder.stale = True
            else:  # an empty event: the connection dropped and every watch is gone
                for each in self._folders.values():
                    each.stale = True
                self._stale_batches.update(self._batches)

    def _on_batch_event(self, event: Any) -> None:
        parts = (event.path or "").split("/")
        with self._lock:
            if len(parts) == 4 and paths.BID_RE.fullmatch(parts[2]):
                self._stale_batches.add(parts[2])
            else:
                self._stale_batches.update(self._batches)
                for folder in self._folders.values():
                    folder.stale = True

    # Folders ----------------------------------------------------------------------------------

    def settle(self) -> None:
        """Wait until every watch event kazoo has received so far has marked its entry stale.

        ZooKeeper sends a watch event on a connection before the reply to the write that caused
        it, but kazoo runs watch callbacks on a thread of their own. Queueing a marker behind
        them and waiting for it makes this process read its own writes: a page rendered after
        an action shows the action's result, not the index from just before.
        """
        done = threading.Event()
        self.zk.handler.dispatch_callback(Callback("watch", done.set, ()))
        done.wait(SETTLE_SECONDS)

    def names(self, path: str) -> list[str]:
        """The sorted child names of ``path`` (empty when it does not exist); do not modify."""
        return self._listing(path).names

    def _listing(self, path: str) -> _Listing:
        self.settle()
        with self._lock:
            folder = self._folders.setdefault(path, _Folder())
            if not folder.stale and folder.listing is not None:
                return folder.listing
            folder.stale = False
        try:
            try:
                names = sorted(self.zk.get_children(path, watch=self._on_folder_event))
            except NoNodeError:
                # Watch for the folder's creation instead; until then it is empty.
                if self.zk.exists(path, watch=self._on_folder_event) is not None:
                    names = sorted(self.zk.get_children(path, watch=self._on_folder_event))
                else:
                    names = []
        except BaseException:
            with self._lock:
                folder.stale = True
            raise
        listing = _Listing(names)
        with self._lock:
            folder.listing = listing
        return listing

    def _derived(self, path: str, key: str, build: Any) -> Any:
        listing = self._listing(path)
        value = listing.derived.get(key)
        if value is None:
            value = build(listing.names)
            listing.derived[key] = value
        return value

    def job_entries(self, state: str, *, order: str = "run") -> list[tuple[int, str]]:
        """The (priority, jid) entries of a state folder, like ``jobs.index_entries``.

        ``order``: "run" (priority, then age: the index names' own order), "oldest" or "newest"
        (by job ID). The list is shared: callers slice it, never modify it.
        """
        return self._entries(self._listing(paths.job_state_folder(state)), order)

    @staticmethod
    def _entries(listing: _Listing, order: str) -> list[tuple[int, str]]:
        entries = listing.derived.get("run")
        if entries is None:
            entries = []
            for name in listing.names:
                match = paths.INDEX_ENTRY_RE.fullmatch(name)
                if match:
                    entries.append((int(match.group(1)), match.group(2)))
            # Zero-padded priorities: the names' own order is run order.
            listing.derived["run"] = entries
        if order not in ("oldest", "newest"):
            return entries
        ordered = listing.derived.get(order)
        if ordered is None:
            ordered = sorted(entries, key=lambda e: e[1], reverse=order == "newest")
            listing.derived[order] = ordered
        return ordered

    def job_states_of(self, jids: Iterable[str]) -> dict[str, str]:
        """The state folder each of ``jids`` is listed in (jobs in none are left out).

        Each folder's set of job IDs is derived once per listing change, so a page of batches
        costs lookups in memory, not a read of every job's status.
        """
        sets = {
            state: self._derived(paths.job_state_folder(state), "jids", _jid_set)
            for state in JOB.states
        }
        found = {}
        for jid in jids:
            for state, members in sets.items():
                if jid in members:
                    found[jid] = state
                    break
        return found

    def job_entries_matching(
        self, state: str, *, profile: str = "", submitter: str = "", order: str = "run"
    ) -> list[tuple[int, str]]:
        """The entries of a state whose job has this profile and a submitter containing
        ``submitter`` (case-insensitive); computed once per folder change and filter."""
        listing = self._listing(paths.job_state_folder(state))
        entries = self._entries(listing, order)
        if not profile and not submitter:
            return entries
        key = ("match", order, profile, submitter.lower())
        found = listing.derived.get(key)
        if found is not None:
            return found
        facts = self.job_facts([jid for _p, jid in entries])
        wanted = submitter.lower()
        found = [
            e
            for e in entries
            if (f := facts.get(e[1])) is not None
            and (not profile or f.profile == profile)
            and (not wanted or wanted in f.submitter.lower())
        ]
        filters = [k for k in listing.derived if isinstance(k, tuple)]
        if len(filters) >= MAX_FILTERS_PER_LISTING:
            del listing.derived[filters[0]]
        listing.derived[key] = found
        return found

    def job_count(self, state: str) -> int:
        return len(self.job_entries(state))

    def oldest_entry(self, state: str) -> str | None:
        """The index name with the lowest job ID (the job longest in the queue), if any."""

        def oldest(names: list[str]) -> str:
            valid = [n for n in names if paths.INDEX_ENTRY_RE.fullmatch(n)]
            return min(valid, key=lambda n: n[3:]) if valid else ""

        return self._derived(paths.job_state_folder(state), "oldest-name", oldest) or None

    def batch_ids(self) -> list[str]:
        """Every batch ID, oldest first."""
        return self._derived(
            paths.BATCHES, "ids", lambda names: [n for n in names if paths.BID_RE.fullmatch(n)]
        )

    # Batches ----------------------------------------------------------------------------------

    def batch_states(self) -> dict[str, BatchState]:
        """Every batch's state and status mtime; half-created batches are left out."""
        bids = self.batch_ids()  # settles
        with self._lock:
            known = set(bids)
            for gone in [b for b in self._batches if b not in known]:
                del self._batches[gone]
                self._stale_batches.discard(gone)
                self._batch_generation += 1
            todo = [b for b in bids if b not in self._batches or b in self._stale_batches]
            self._stale_batches.difference_update(todo)
        if todo:
            pending = [
                (b, self.zk.get_async(paths.batch_node(b, "status"), watch=self._on_batch_event))
                for b in todo
            ]
            fresh: dict[str, BatchState | None] = {}
            failed: BaseException | None = None
            for bid, result in pending:
                try:
                    data, stat = result.get()
                except NoNodeError:
                    fresh[bid] = None  # not a watch: read again next time
                    continue
                except BaseException as exc:
                    failed = failed or exc
                    continue
                try:
                    state = _text(decode_json("status", data).get("status")) or "?"
                except MalformedNode:
                    state = "?"
                fresh[bid] = BatchState(state, stat.mtime)
            with self._lock:
                self._batches.update(fresh)
                self._batch_generation += 1
                self._stale_batches.update(b for b, s in fresh.items() if s is None)
                if failed is not None:
                    self._stale_batches.update(b for b in todo if b not in fresh)
            if failed is not None:
                raise failed
        with self._lock:
            return {b: s for b in bids if (s := self._batches.get(b)) is not None}

    def batch_summary(self) -> dict[str, tuple[int, int]]:
        """Batch state -> (how many, oldest status mtime in ms); recomputed after a change."""
        states = self.batch_states()
        with self._lock:
            generation = self._batch_generation
            if self._batch_summary is not None and self._batch_summary[0] == generation:
                return self._batch_summary[1]
        summary: dict[str, tuple[int, int]] = {}
        for item in states.values():
            count, oldest = summary.get(item.state, (0, item.mtime_ms))
            summary[item.state] = (count + 1, min(oldest, item.mtime_ms))
        with self._lock:
            self._batch_summary = (generation, summary)
        return summary

    # Jobs -------------------------------------------------------------------------------------

    def profile_counts(self, state: str) -> dict[str, int]:
        """Jobs of a state per profile ("" when unknown), computed once per folder change."""
        listing = self._listing(paths.job_state_folder(state))
        counts = listing.derived.get("profile-counts")
        if counts is None:
            jids = [jid for _p, jid in self._entries(listing, "run")]
            facts = self.job_facts(jids)
            counts = {}
            for jid in jids:
                profile = facts[jid].profile if jid in facts else ""
                counts[profile] = counts.get(profile, 0) + 1
            listing.derived["profile-counts"] = counts
        return counts

    def space_total(self, state: str) -> int:
        """Sum of ``space_needed`` over the jobs of a state, computed once per folder change."""
        listing = self._listing(paths.job_state_folder(state))
        total = listing.derived.get("space-total")
        if total is None:
            jids = [jid for _p, jid in self._entries(listing, "run")]
            total = sum(self.space_needed(state, jids).values())
            listing.derived["space-total"] = total
        return total

    def job_facts(self, jids: Sequence[str]) -> dict[str, JobFacts]:
        """Profile, submitter and local ID of each job; unreadable jobs are left out."""
        with self._lock:
            todo = [j for j in jids if j not in self._facts]
        if todo:
            reads = read_many(self.zk, [paths.job_node(j, "configuration") for j in todo])
            fresh: dict[str, JobFacts] = {}
            for jid in todo:
                read = reads[paths.job_node(jid, "configuration")]
                try:
                    if read is None:
                        continue  # gone or half-created: asked again next time
                    config = decode_json("configuration", read[0])
                except MalformedNode:
                    continue  # broken: asked again next time
                fresh[jid] = JobFacts(
                    profile=_text(config.get("profile")),
                    submitter=_text(config.get("submitter")),
                    local_id=_text(config.get("localID")),
                )
            with self._lock:
                # Facts of deleted jobs are never asked for again; a bound keeps them from
                # piling up in a process that runs for months.
                if len(self._facts) + len(fresh) > MAX_FACTS:
                    self._facts.clear()
                self._facts.update(fresh)
        with self._lock:
            return {j: f for j in jids if (f := self._facts.get(j)) is not None}

    def space_needed(self, state: str, jids: Iterable[str]) -> dict[str, int]:
        """``space_needed`` of each job, cached for as long as the job stays in ``state``.

        Pass every job of the state: jobs not passed are forgotten for it.
        """
        jids = list(jids)
        with self._lock:
            known = self._space.get(state, {})
        todo = [j for j in jids if j not in known]
        reads = read_many(self.zk, [paths.job_node(j, "space_needed") for j in todo])
        fresh: dict[str, int] = {}
        for jid in todo:
            read = reads[paths.job_node(jid, "space_needed")]
            try:
                fresh[jid] = 0 if read is None else max(0, decode_int("space_needed", read[0]))
            except MalformedNode:
                fresh[jid] = 0
        current = {j: known[j] if j in known else fresh[j] for j in jids}
        with self._lock:
            self._space[state] = current
        return current


_indexes: dict[int, ReadIndex] = {}
_indexes_lock = threading.Lock()


def for_client(zk: KazooClient) -> ReadIndex:
    """The index of ``zk``, made on first use (one per client, so a reconnect starts afresh)."""
    with _indexes_lock:
        for key, old in list(_indexes.items()):
            if old.zk.client_state == KeeperState.CLOSED:
                old.close()
                del _indexes[key]
        index = _indexes.get(id(zk))
        if index is None or index.zk is not zk:
            index = ReadIndex(zk)
            _indexes[id(zk)] = index
        return index


def reset() -> None:
    """Forget every index (tests, benchmarks, a closed client)."""
    with _indexes_lock:
        for index in _indexes.values():
            index.close()
        _indexes.clear()
