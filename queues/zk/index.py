"""A read-side index of the queue for the web process, kept current by ZooKeeper watches.

A page of 50 jobs must not cost a listing of the 60,000 names in ``/jobs/states/completed``,
and the overview must not read 2,000 batch status nodes on every refresh. This index keeps, per
process, what those pages would otherwise read again and again:

- the entries of every job state folder (parsed once into (priority, jid) pairs) and the names
  of ``/batches``, re-listed only after a child watch said the folder changed;
- every batch's state and whether it has a status report, re-read only after a watch on its
  ``status`` or ``status-report`` node fired;
- facts about a job that never change once it exists (profile, submitter: its
  ``configuration``), read once per job;
- the search keys of every job -- local IDs (``localID``, ``objectID``, ``identifiers``) and
  its ARK -- mapped (by their hash) to the job, so a search is a dictionary lookup however
  large the queue;
- the batch and failing step of every Failed job, for the grouped failed list;
- ``space_needed`` per job and state, re-read when the job moves to another state.

Watches only mark entries stale; the next reader refreshes them. So a busy queue costs the web
process nothing between page views, and a page pays only for what changed since the last one.
Correctness rests on one rule: an entry is marked clean *before* the read that refreshes it
(which also re-arms its watch), so a change after that read always leaves it stale again. On a
dropped connection kazoo fires every watch with an empty event and forgets it (it does not
restore watches on reconnect); the index then marks everything stale.

The search keys follow the same watches: a job new in any state folder has its configuration
and identifiers read once; a job without an ARK has its identifiers read again when it appears
in a state past Processing (the step that mints it). A job that is gone stays a key until it is
looked up, when loading it finds nothing.

Start-up: ``fill()`` (run in a background thread by ``queues/warmup.py``) reads everything in
the order pages need it; meanwhile pages answer from what is ready and ``loading()`` says what
is not (a search then may miss a job whose details are not read yet, and says so).

Memory: per job the index keeps one interned job ID string (shared by every structure that
names the job), its entry in its state's list and set, a shared (profile, submitter) pair and the
hashes of its search keys; no folder's names are kept once parsed. About 500 bytes a job in all
(100,000 jobs: 130 MiB web RSS against 83 MiB with 1,000; ``bench/http_pages.py``).

``space_needed`` is the one approximation: the Estimating step writes it while the job stays in
Estimating, so a value read during that step stays until the job moves on (seconds). The same
holds for a Failed job's step if it was resumed and failed again between two reads of the list.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import Callback, KeeperState

from queues.states import JOB

from . import paths
from .codecs import decode_int, decode_json, decode_str
from .errors import MalformedNode
from .nodes import read_many

MAX_FACTS = 5_000_000
# How long a read waits for kazoo's callback thread before using what it has.
SETTLE_SECONDS = 2.0
MAX_FILTERS_PER_LISTING = 32
# Jobs whose nodes one step of a sync reads at once (one pipelined multiRead); the background
# fill reads smaller steps and pauses between them, so page requests sharing the connection and
# the interpreter are not queued behind it.
READ_CHUNK = 2000
FILL_CHUNK = 250
FILL_PAUSE = 0.004
# States a job can be in after Processing minted its ARK.
ARK_STATES = frozenset({"Storing", "Recording", "Notify", "Completed", "Failed", "Deleted"})


class JobFacts(NamedTuple):
    """What a job's ``configuration`` says about it; written once when the job is created."""

    profile: str
    submitter: str


class FailedFacts(NamedTuple):
    """A Failed job's batch and the step it failed in (fixed while it stays Failed)."""

    bid: str
    step: str


@dataclass
class _Listing:
    names: list[str]  # /batches and other folders; empty for job state folders
    entries: list[tuple[int, str]] | None = None  # job state folders: (priority, jid), run order
    # Views derived from exactly this listing (re-sorted, filtered, counted), on first use.
    derived: dict[Any, Any] = field(default_factory=dict)


@dataclass
class _Folder:
    listing: _Listing | None = None
    stale: bool = True
    refresh: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class BatchState:
    state: str  # "?" when the status node does not decode
    mtime_ms: int
    has_report: bool = False


def _jid_set(entries: list[tuple[int, str]]) -> frozenset[str]:
    return frozenset(jid for _p, jid in entries)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _failing_step(last: Any) -> str:
    """The step a Failed job failed in: the one after its last successful step."""
    if not isinstance(last, str) or not last:
        return "Pending"
    return JOB.successor(last) or last


def search_keys(configuration: dict[str, Any], identifiers: dict[str, Any]) -> list[str]:
    """Every value a search for this job may give: local IDs and ARKs, exactly as written.

    A ``localID`` holding several IDs separated by ``;`` (as Merritt's ingest allows) is also
    found by each of them.
    """
    found: list[str] = []
    for value in (configuration.get("localID"), configuration.get("objectID")):
        if isinstance(value, str) and value.strip():
            found.append(value.strip())
            if ";" in value:
                found += [p.strip() for p in value.split(";") if p.strip()]
    primary = identifiers.get("primary_id")
    if isinstance(primary, str) and primary.strip():
        found.append(primary.strip())
    local = identifiers.get("local_id")
    if isinstance(local, list):
        found += [v.strip() for v in local if isinstance(v, str) and v.strip()]
    return list(dict.fromkeys(found))


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
        self._shared: dict[tuple[str, ...], Any] = {}  # one object per distinct pair
        self._space: dict[str, dict[str, int]] = {}
        self._failed: dict[str, FailedFacts] = {}
        # Whoever computes a figure many pages share (space, profile counts, the failed facts,
        # batch states) holds this; a page asking meanwhile waits for that answer instead of
        # reading the same nodes a second time (at start, the background fill is computing).
        self._compute = threading.RLock()
        # Search: hash of a key -> jid (or a tuple of jids when several jobs share the hash).
        # The hash (an int) costs less than the key itself; whoever looks a key up loads the
        # jobs found and keeps those that really have it (``search_keys``).
        self._keys: dict[int, str | tuple[str, ...]] = {}
        self._no_ark: set[str] = set()  # jobs whose identifiers had no ARK when last read
        # state -> the job IDs of the listing whose jobs have been read for search.
        self._synced: dict[str, frozenset[str]] = {}
        self._sync_lock = threading.Lock()
        self._search_complete = False
        self._filler: threading.Thread | None = None
        self._fill_stage = ""  # what the background fill is reading now ("" when idle)
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
        """The sorted child names of ``path`` (empty when it does not exist); do not modify.

        Job state folders keep parsed entries instead (``job_entries``)."""
        return self._listing(path).names

    def _listing(self, path: str) -> _Listing:
        self.settle()
        with self._lock:
            folder = self._folders.setdefault(path, _Folder())
            if not folder.stale and folder.listing is not None:
                return folder.listing
        # One reader refreshes a folder; others asking meanwhile wait for its answer.
        with folder.refresh:
            with self._lock:
                if not folder.stale and folder.listing is not None:
                    return folder.listing
                folder.stale = False
            try:
                try:
                    names = self.zk.get_children(path, watch=self._on_folder_event)
                except NoNodeError:
                    # Watch for the folder's creation instead; until then it is empty.
                    if self.zk.exists(path, watch=self._on_folder_event) is not None:
                        names = self.zk.get_children(path, watch=self._on_folder_event)
                    else:
                        names = []
            except BaseException:
                with self._lock:
                    folder.stale = True
                raise
            names.sort()
            if path.startswith(paths.JOB_STATES + "/"):
                # Zero-padded priorities: the names' own order is run order. The names
                # themselves are not kept; one interned string per job ID is.
                entries = []
                intern = sys.intern
                for name in names:
                    match = paths.INDEX_ENTRY_RE.fullmatch(name)
                    if match:
                        entries.append((int(match.group(1)), intern(match.group(2))))
                listing = _Listing([], entries)
            else:
                listing = _Listing(names)
            with self._lock:
                folder.listing = listing
            return listing

    def _derived(self, path: str, key: str, build: Any) -> Any:
        listing = self._listing(path)
        value = listing.derived.get(key)
        if value is None:
            value = build(listing.entries if listing.entries is not None else listing.names)
            listing.derived[key] = value
        return value

    def derived(self, state: str, key: Any, build: Callable[[], Any]) -> Any:
        """A value computed from a job state's current listing, cached until it changes
        (for selectors: e.g. the failed list's groups per filter)."""
        listing = self._listing(paths.job_state_folder(state))
        value = listing.derived.get(key)
        if value is None:
            value = build()
            filters = [k for k in listing.derived if isinstance(k, tuple)]
            if isinstance(key, tuple) and len(filters) >= MAX_FILTERS_PER_LISTING:
                del listing.derived[filters[0]]
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
        entries = listing.entries or []
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
        sets = {state: self.job_id_set(state) for state in JOB.states}
        found = {}
        for jid in jids:
            for state, members in sets.items():
                if jid in members:
                    found[jid] = state
                    break
        return found

    def job_id_set(self, state: str) -> frozenset[str]:
        """The job IDs listed in a state folder, once per listing change."""
        return cast(
            "frozenset[str]", self._derived(paths.job_state_folder(state), "jids", _jid_set)
        )

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
            return cast("list[tuple[int, str]]", found)
        wanted = submitter.lower()
        if self.filling:
            # At start: answer from the facts read so far (the page says the rest is loading)
            # rather than reading them all for this page too; not kept.
            with self._lock:
                known = self._facts
                return [
                    e
                    for e in entries
                    if (f := known.get(e[1])) is not None
                    and (not profile or f.profile == profile)
                    and (not wanted or wanted in f.submitter.lower())
                ]
        facts = self.job_facts([jid for _p, jid in entries])
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

        def oldest(entries: list[tuple[int, str]]) -> str:
            if not entries:
                return ""
            priority, jid = min(entries, key=lambda e: e[1])
            return f"{priority:02d}-{jid}"

        return self._derived(paths.job_state_folder(state), "oldest-name", oldest) or None

    def batch_ids(self) -> list[str]:
        """Every batch ID, oldest first."""
        return cast(
            "list[str]",
            self._derived(
                paths.BATCHES, "ids", lambda names: [n for n in names if paths.BID_RE.fullmatch(n)]
            ),
        )

    # Batches ----------------------------------------------------------------------------------

    def batch_states(self) -> dict[str, BatchState]:
        """Every batch's state, status mtime and whether it has a status report; half-created
        batches are left out."""
        bids = self.batch_ids()  # settles
        with self._compute:
            return self._batch_states(bids)

    def _batch_states(self, bids: list[str]) -> dict[str, BatchState]:
        with self._lock:
            known = set(bids)
            for gone in [b for b in self._batches if b not in known]:
                del self._batches[gone]
                self._stale_batches.discard(gone)
                self._batch_generation += 1
            todo = [b for b in bids if b not in self._batches or b in self._stale_batches]
            self._stale_batches.difference_update(todo)
        for start in range(0, len(todo), READ_CHUNK * 5):
            self._read_batches(todo[start : start + READ_CHUNK * 5])
        with self._lock:
            return {b: s for b in bids if (s := self._batches.get(b)) is not None}

    def _read_batches(self, todo: list[str]) -> None:
        watch = self._on_batch_event
        pending = [
            (
                b,
                self.zk.get_async(paths.batch_node(b, "status"), watch=watch),
                self.zk.exists_async(paths.batch_node(b, "status-report"), watch=watch),
            )
            for b in todo
        ]
        fresh: dict[str, BatchState | None] = {}
        failed: BaseException | None = None
        for bid, result, report in pending:
            try:
                has_report = report.get() is not None
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
            fresh[bid] = BatchState(sys.intern(state), stat.mtime, has_report)
        with self._lock:
            self._batches.update(fresh)
            self._batch_generation += 1
            self._stale_batches.update(b for b, s in fresh.items() if s is None)
            if failed is not None:
                self._stale_batches.update(b for b in todo if b not in fresh)
        if failed is not None:
            raise failed

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

    def reported_batch_ids(self) -> list[str]:
        """Batches with a status report, newest first (from the index: no read per batch)."""
        states = self.batch_states()
        with self._lock:
            generation = self._batch_generation
        cached = getattr(self, "_reported", None)
        if cached is not None and cached[0] == generation:
            return cast("list[str]", cached[1])
        found = [b for b in reversed(self.batch_ids()) if (s := states.get(b)) and s.has_report]
        self._reported = (generation, found)
        return found

    # Jobs -------------------------------------------------------------------------------------

    def _share(self, value: tuple[str, ...], make: Callable[..., Any]) -> Any:
        """One object per distinct value (thousands of jobs share a profile and submitter)."""
        found = self._shared.get(value)
        if found is None:
            found = self._shared[value] = make(*(sys.intern(v) for v in value))
        return found

    def profile_counts(self, state: str) -> dict[str, int]:
        """Jobs of a state per profile ("" when unknown), computed once per folder change."""
        listing = self._listing(paths.job_state_folder(state))
        counts = listing.derived.get("profile-counts")
        if counts is not None:
            return cast("dict[str, int]", counts)
        with self._compute:
            counts = listing.derived.get("profile-counts")
            if counts is not None:
                return cast("dict[str, int]", counts)
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
        if total is not None:
            return cast("int", total)
        with self._compute:
            total = listing.derived.get("space-total")
            if total is not None:
                return cast("int", total)
            jids = [jid for _p, jid in self._entries(listing, "run")]
            total = sum(self.space_needed(state, jids).values())
            listing.derived["space-total"] = total
            return total

    def job_facts(self, jids: Sequence[str]) -> dict[str, JobFacts]:
        """Profile and submitter of each job; unreadable jobs are left out."""
        with self._lock:
            todo = [j for j in jids if j not in self._facts]
        for start in range(0, len(todo), READ_CHUNK):
            self._read_jobs(todo[start : start + READ_CHUNK], [])
        with self._lock:
            return {j: f for j in jids if (f := self._facts.get(j)) is not None}

    def _read_jobs(self, config_jids: Sequence[str], ids_jids: Sequence[str]) -> None:
        """Read the configuration and identifiers of ``config_jids`` (facts and search keys)
        and the identifiers alone of ``ids_jids`` (search keys: an ARK minted since)."""
        node = paths.job_node
        wanted = [node(j, "configuration") for j in config_jids]
        wanted += [node(j, "identifiers") for j in (*config_jids, *ids_jids)]
        reads = read_many(self.zk, wanted)

        def json_of(path: str) -> dict[str, Any] | None:
            read = reads.get(path)
            if read is None:
                return None
            try:
                value = decode_json(path, read[0])
            except MalformedNode:
                return None
            return value if isinstance(value, dict) else None

        facts: dict[str, JobFacts] = {}
        keys: list[tuple[str, str]] = []
        with_ark: list[str] = []
        without_ark: list[str] = []
        for jid in config_jids:
            config = json_of(node(jid, "configuration"))
            if config is None:
                continue  # gone, or broken: asked again next time
            facts[jid] = self._share(
                (_text(config.get("profile")), _text(config.get("submitter"))), JobFacts
            )
            ids = json_of(node(jid, "identifiers")) or {}
            keys += [(k, jid) for k in search_keys(config, ids)]
            (with_ark if _text(ids.get("primary_id")) else without_ark).append(jid)
        for jid in ids_jids:
            ids = json_of(node(jid, "identifiers")) or {}
            keys += [(k, jid) for k in search_keys({}, ids)]
            (with_ark if _text(ids.get("primary_id")) else without_ark).append(jid)
        with self._lock:
            # Facts of deleted jobs are never asked for again; a bound keeps them from
            # piling up in a process that runs for months (everything is read again).
            if len(self._facts) + len(facts) > MAX_FACTS:
                self._facts.clear()
                self._keys.clear()
                self._no_ark.clear()
                self._synced.clear()
                self._search_complete = False
            self._facts.update(facts)
            for key, jid in keys:
                self._add_key(hash(key), jid)
            self._no_ark.difference_update(with_ark)
            self._no_ark.update(without_ark)

    def _add_key(self, key: int, jid: str) -> None:
        known = self._keys.get(key)
        if known is None:
            self._keys[key] = jid
        elif isinstance(known, str):
            if known != jid:
                self._keys[key] = (known, jid)
        elif jid not in known:
            self._keys[key] = (*known, jid)

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

    # Failed jobs ------------------------------------------------------------------------------

    def failed_facts(self) -> dict[str, FailedFacts]:
        """Batch and failing step of every Failed job, re-read only for jobs new in Failed.

        Jobs whose nodes cannot be read are left out (the failed page lists them by loading).
        """
        listing = self._listing(paths.job_state_folder("Failed"))
        cached = listing.derived.get("failed-facts")
        if cached is not None:
            return cast("dict[str, FailedFacts]", cached)
        with self._compute:  # one reader computes; others asking meanwhile wait for it
            cached = listing.derived.get("failed-facts")
            if cached is not None:
                return cast("dict[str, FailedFacts]", cached)
            jids = [jid for _p, jid in listing.entries or []]
            with self._lock:
                known = self._failed
            todo = [j for j in jids if j not in known]
            fresh: dict[str, FailedFacts] = {}
            for start in range(0, len(todo), READ_CHUNK):
                part = todo[start : start + READ_CHUNK]
                reads = read_many(
                    self.zk,
                    [paths.job_node(j, n) for j in part for n in ("bid", "status")],
                )
                for jid in part:
                    bid_read = reads[paths.job_node(jid, "bid")]
                    status_read = reads[paths.job_node(jid, "status")]
                    if bid_read is None or status_read is None:
                        continue
                    try:
                        bid = decode_str("bid", bid_read[0]).strip()
                        status = decode_json("status", status_read[0])
                    except MalformedNode:
                        continue
                    if not paths.BID_RE.fullmatch(bid) or not isinstance(status, dict):
                        continue
                    step = _failing_step(status.get("last_successful_status"))
                    fresh[jid] = self._share((bid, step), FailedFacts)
            current = {j: f for j in jids if (f := known.get(j) or fresh.get(j)) is not None}
            with self._lock:
                self._failed = current
            listing.derived["failed-facts"] = current
            return current

    # Search -----------------------------------------------------------------------------------

    def find(self, key: str) -> tuple[list[str], bool]:
        """The jobs that may have ``key`` as local ID or ARK (a superset: check each job's
        ``search_keys``; it is exact but for a hash collision), and whether the answer is
        complete (False while the background fill has not read every job yet)."""
        key = key.strip()
        filling = self.filling
        if not filling:
            with self._sync_lock:
                self.sync_jobs()
        with self._lock:
            found = self._keys.get(hash(key))
            complete = self._search_complete
        if found is None:
            return [], complete
        return ([found] if isinstance(found, str) else list(found)), complete

    def sync_jobs(
        self, *, progress: Callable[[int], None] | None = None, chunk: int = READ_CHUNK
    ) -> None:
        """Read the jobs new in any state folder since the last sync, for facts and search.

        The first sync reads every job (the background fill does it at start); later ones only
        what the watches said changed.
        """
        for state in JOB.states:
            members = self.job_id_set(state)
            with self._lock:
                before = self._synced.get(state)
            if before is members:
                continue
            new = members if before is None else members - before
            with self._lock:
                config = [j for j in new if j not in self._facts]
                ids = (
                    [j for j in new if j in self._no_ark and j in self._facts]
                    if state in ARK_STATES
                    else []
                )
            for start in range(0, max(len(config), len(ids)), chunk):
                self._read_jobs(config[start : start + chunk], ids[start : start + chunk])
                if progress is not None:
                    progress(len(config[start : start + chunk]))
                    time.sleep(FILL_PAUSE)  # let page requests in between the fill's steps
            with self._lock:
                self._synced[state] = members
        with self._lock:
            self._search_complete = True

    # Start-up ---------------------------------------------------------------------------------

    @property
    def filling(self) -> bool:
        filler = self._filler
        return filler is not None and filler.is_alive() and filler is not threading.current_thread()

    def fill(self, first: Callable[[], Any] | None = None) -> None:
        """Read everything pages need, in the order they need it (run in a thread of its own).

        ``first`` reads what the overview shows (the selectors' own call, so exactly that is
        warm); then the batch states, the failed list, and every job's details for search and
        collection filters.
        """
        with self._lock:
            self._filler = threading.current_thread()
        try:
            self._fill_stage = "job counts and batch states"
            if first is not None:
                first()
            self.batch_states()
            self._fill_stage = "failed jobs' batches and steps"
            self.failed_facts()
            total = sum(self.job_count(s) for s in JOB.states)
            done = [len(self._facts)]

            def step(n: int) -> None:
                done[0] += n
                self._fill_stage = (
                    f"job details for search and collection filters: "
                    f"{min(done[0], total):,} of {total:,} jobs"
                )

            step(0)
            with self._sync_lock:
                self.sync_jobs(progress=step, chunk=FILL_CHUNK)
        finally:
            self._fill_stage = ""
            with self._lock:
                self._filler = None

    def start_fill(self, first: Callable[[], Any] | None = None) -> threading.Thread:
        thread = threading.Thread(
            target=self._fill_logged, args=(first,), name="fill-read-index", daemon=True
        )
        with self._lock:
            self._filler = thread
        thread.start()
        return thread

    def _fill_logged(self, first: Callable[[], Any] | None) -> None:
        import logging

        try:
            self.fill(first)
        # ZooKeeper may be down at start: pages say so, and the index fills on first use.
        except Exception as exc:
            logging.getLogger(__name__).warning("could not warm the read index: %s", exc)

    def loading(self) -> str:
        """What the background fill has not read yet, for pages to say; "" when nothing."""
        if not self.filling:
            return ""
        return self._fill_stage or "starting"

    def memory_counts(self) -> dict[str, int]:
        """How many items each structure holds (for benchmarks and tests)."""
        with self._lock:
            return {
                "facts": len(self._facts),
                "search_keys": len(self._keys),
                "without_ark": len(self._no_ark),
                "failed": len(self._failed),
                "batches": len(self._batches),
            }


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
