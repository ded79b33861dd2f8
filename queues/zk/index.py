"""A read-side index of the queue for the web process, kept current by ZooKeeper watches.

A page of 50 jobs must not cost a listing of the 60,000 names in ``/jobs/states/completed``,
and the overview must not read 2,000 batch status nodes on every refresh. This index keeps, per
process, what those pages would otherwise read again and again:

- the entries of every job state folder (parsed once into (priority, jid) pairs) and the names
  of ``/batches``, re-listed only after a child watch said the folder changed;
- every batch's state and whether it has a status report, re-read only after a watch on its
  ``status`` fired (a report is written only by the reporting steps, which then move the batch
  on: a watch on each report as well was 20,000 more watches, about 6 MiB, at a million jobs);
- facts about a job that never change once it exists (profile, submitter: its
  ``configuration``), read once per job;
- the search keys of every job -- local IDs (``localID``, ``objectID``, ``identifiers``) and
  its ARK -- mapped (by their hash) to the job, so a search is a dictionary lookup however
  large the queue;
- the batch and failing step of every Failed job, for the grouped failed list;
- the batch index folders (``states/batch-*``) of the batches the batch list showed last, under
  child watches, and each shown row's jobs counted per folder and state, so a page of batches
  shown again lists nothing and looks no job up;
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

Start-up: ``fill()`` (run in a background thread by ``queues/web/warmup.py``) reads everything in
the order pages need it; meanwhile pages answer from what is ready and ``loading()`` says what
is not (a search then may miss a job whose details are not read yet, and says so). A page's
read (``answer_within``) waits for what the fill is reading only until its deadline, then
raises ``StillReading`` (a 503 naming the fill's stage), and never reads a job state folder
itself while the fill lists them; the fill reads in small parts and, between two, gives way
while a page is being answered (``yield_to_pages``): one ZooKeeper session answers in order,
and the fill's work holds the interpreter.

Memory (the packing is ``queues/zk/packed.py``): a job is a number, not a string. A job ID
of the contract's form (``jid`` and ten digits) is kept as its number, from which the ID is written
back exactly; any other ID gets a number of its own past the ten-digit range, and its string is kept
once in a side table (``JobCodes``). Every per-job structure is a flat ``array`` of 64-bit integers
with the job's number packed beside what is kept of it: a state folder's entries (priority and
number, in run order, and the same by age, ``Entries``), every job's facts (its (profile, submitter)
pair as an index into a table of the distinct pairs, and whether it has no ARK yet) and every search
key (29 bits of the key's hash and the job's number). Lookups are binary searches; additions go to
a small dictionary (at most ``TAIL_MAX`` entries) merged into the sorted array run by run when
it grows (``PackedTable``, ``KeyTable``; sorting array and additions together made a Python
int for every element, the fill's peak). The tables hold about 60 bytes a job
(``tests/scale/test_index_compact.py``); the web process grows by about 120 bytes a job with
what reading them leaves behind (daphne's RSS in ``bench/http_pages.py``: 201 MiB at 1,000,000
jobs once filled, 83 MiB at 1,000; at most 230 MiB during the fill, which gives freed memory
back to the system as it goes), against about 500 with per-job strings, tuples, dictionaries
and sets.

A state folder is listed with one request whose answer is parsed straight from the bytes
(``kazoo_private.list_children_raw``), not into a million strings first, so a folder of
600,000 jobs is read in a fraction of a second. While the background fill runs, the ``*_now``
readers answer the overview without waiting for it: counts from each folder's stat until its
listing is read, batch states read so far.

``space_needed`` is the one approximation: the Estimating step writes it while the job stays in
Estimating, so a value read during that step stays until the job moves on (seconds). The same
holds for a Failed job's step if it was resumed and failed again between two reads of the list.

The job list of every state (``job_entries_all``) keeps each filter's merge of the states'
entries while their listings are current: 8 bytes per entry merged, at most ``ALL_KEYS_KEPT``
entries for all filters together (16 MB), so the list of one submitter in every state, asked
again, merges nothing. A priority (a run of the run order) and a batch (its few jobs looked up
by bisection) are answered from the entries without a pass over them (``packed.Entries``); the
time each entry entered its state (the stuck and "in state at least" filters) is kept by
``queues/operator/stuck.py``.

Why ``ReadIndex`` is one class of about 1,100 lines: its caches (listings, batch states, facts,
keys, member folders) share one lock, one session handler and the one staleness rule above,
and one watch event marks entries of several of them stale; split by cache, every part would
have to get that rule and its lock order right on its own. What does not share them, the
packing, is ``packed``.
"""

from __future__ import annotations

import itertools
import re
import sys
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import KeeperState

from queues.core.states import BATCH_INDEX_FOLDERS, JOB, JobState, job_batch_folder
from queues.core.states import BatchState as BatchStatus
from queues.core.words import LONG_MAX

from . import kazoo_private, paths
from .codecs import decode_int, decode_json, decode_str
from .errors import MalformedNode, StillReading
from .nodes import read_many
from .packed import (
    EMPTY,
    FACT_BITS,
    JID_FORM,
    MAX_PAIRS,
    NO_ARK,
    NUM_BITS,
    NUM_MASK,
    Entries,
    JobCodes,
    KeyTable,
    NumberMap,
    PackedTable,
    age_keys,
    carried,
    give_back_memory,
    has_number,
    jid_of,
    merged_sorted,
    numbers_sorted,
    parse_entries,
    positions_of,
    run_blocks,
    trim_heap,
)

MAX_FACTS = 5_000_000
# Until when a request may wait for what the background fill is reading (``answer_within``).
_ANSWER_BY: ContextVar[float | None] = ContextVar("answer_by", default=None)
# The threads that fill an index (``start_fill``'s, and ``queues.web.warmup``'s at a web start).
FILL_THREADS = frozenset({"fill-read-index", "warm-read-index"})
# How long a read waits for kazoo's callback thread before using what it has.
SETTLE_SECONDS = 2.0
MAX_FILTERS_PER_LISTING = 32
# A collection or submitter filter takes the set of the jobs with a matching (collection,
# submitter) pair when they are at most this many (about 15 MB while it is made), and tests
# each entry against the facts table otherwise.
MATCHED_SET_MAX = 250_000
# Entries kept merged for the job list of every state (``job_entries_all``), all filters
# together: 8 bytes each (16 MB; the unfiltered merge at 1,000,000 jobs is 1,000,000).
ALL_KEYS_KEPT = 2_000_000
# Batch index folders kept listed (four a batch: the batches of a few pages of the batch list)
# and batch rows whose job counts are kept.
MEMBER_FOLDERS_KEPT = 4000
FAILED_BATCH = BatchStatus.FAILED
BATCH_COUNTS_KEPT = 1000
# Jobs whose nodes one step of a sync reads at once (one pipelined multiRead); the background
# fill reads smaller steps and pauses between them, so page requests sharing the connection and
# the interpreter are not queued behind it.
READ_CHUNK = 2000
FILL_CHUNK = 500
FILL_PAUSE = 0.004
# Between two of its steps the fill waits while pages are being answered, at most this long
# each time (so a stream of pages slows the fill, never stops it).
FILL_YIELD_MOST = 0.25
# Jobs read between two returns of freed memory to the system while the fill reads every job.
TRIM_EVERY = 20_000
FILL_SWITCH_INTERVAL = 0.0005  # seconds (sys.setswitchinterval) while the fill runs
# States a job can be in after Processing minted its ARK.
ARK_STATES = frozenset(
    {
        JobState.STORING,
        JobState.RECORDING,
        JobState.NOTIFY,
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.DELETED,
    }
)


class JobFacts(NamedTuple):
    """What a job's ``configuration`` says about it; written once when the job is created."""

    profile: str
    submitter: str


class JobText(NamedTuple):
    """What never changes of a job once it is made (its ``configuration``), and its ARK once
    minted: handed to the index's text sink (``ReadIndex.text_sink``) as the index reads them.
    ``whole`` False: an ARK minted since the job's texts were read (the other fields empty).
    ``made``: when the job's ``configuration`` was created (ms since the epoch), which tells
    this job from another that had its number in a ZooKeeper made afresh."""

    number: int
    title: str
    filename: str
    submitter: str
    local_ids: tuple[str, ...]
    ark: str
    made: int = 0
    whole: bool = True


class FailedFacts(NamedTuple):
    """A Failed job's batch and the step it failed in (fixed while it stays Failed)."""

    bid: str
    step: str


class FailedNumbers(Mapping[int, FailedFacts]):
    """Job number -> ``FailedFacts`` of the Failed jobs, packed: each job's index into the
    distinct (batch, step) pairs, in a ``NumberMap`` (16 bytes a job; a dictionary of ints was
    about 100). Never changed once handed out."""

    __slots__ = ("_codes", "_kinds")

    def __init__(self, codes: NumberMap, kinds: list[FailedFacts]) -> None:
        codes.compact()  # a no-op: what the index hands out is compact (``NumberMap.copy``)
        self._codes = codes
        self._kinds = kinds  # only ever appended to

    def numbers(self) -> array[int]:
        """Every Failed job's number, sorted (not to be changed)."""
        return self._codes.keys

    def in_order(self) -> Iterator[FailedFacts]:
        """The facts of ``numbers()``, in their order."""
        return map(self._kinds.__getitem__, self._codes.values)

    def __getitem__(self, number: int) -> FailedFacts:
        code = self._codes.get(number)
        if code is None:
            raise KeyError(number)
        return self._kinds[code]

    def __contains__(self, number: object) -> bool:
        return number in self._codes

    def __iter__(self) -> Iterator[int]:
        return iter(self._codes)

    def __len__(self) -> int:
        return len(self._codes)


_SERIALS = itertools.count(1)


@dataclass
class _Listing:
    names: list[str]  # /batches and other folders; empty for job state folders
    entries: Entries | None = None  # job state folders, in run order
    # Views derived from exactly this listing (re-sorted, filtered, counted), on first use.
    derived: dict[Any, Any] = field(default_factory=dict)
    # Which read of its folder this is (a figure computed from several listings is kept with
    # their serials, and is current while they are).
    serial: int = field(default_factory=lambda: next(_SERIALS))


@dataclass
class _Folder:
    listing: _Listing | None = None
    stale: bool = True
    refresh: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class BatchCounts:
    """A batch row's jobs: how many each batch index folder lists, and how many of those (but
    the deleted ones) each job state folder lists ("?" for jobs listed in none)."""

    folders: dict[str, int]
    states: dict[str, int]


class _SpaceKnown(NamedTuple):
    """A state's jobs' ``space_needed``: their numbers, sorted, and each one's value."""

    numbers: array[int]
    values: array[int]


@dataclass(frozen=True)
class BatchState:
    state: str  # "?" when the status node does not decode
    mtime_ms: int
    has_report: bool = False


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _failing_step(last: Any) -> str:
    """The step a Failed job failed in: the one after its last successful step."""
    if not isinstance(last, str) or not last:
        return str(JobState.PENDING)
    return str(JOB.successor(last) or last)


def job_text(
    number: int, configuration: dict[str, Any], identifiers: dict[str, Any], made: int
) -> JobText:
    """The searched texts of a job from its ``configuration`` (created at ``made``, ms since
    the epoch) and ``identifiers``."""
    ark = _text(identifiers.get("primary_id")).strip()
    local_ids = tuple(k for k in search_keys(configuration, identifiers) if k != ark)
    return JobText(
        number,
        _text(configuration.get("title")),
        _text(configuration.get("filename")),
        _text(configuration.get("submitter")),
        local_ids,
        ark,
        made,
    )


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


def store_node_of(path: str, read: Any) -> int:
    """The storage node a job's ``store`` node binds it to (``add/<node>/<ark>``: Merritt's
    storage consumer splits its mode so); 0 when it is absent or names none."""
    if read is None:
        return 0
    try:
        store = decode_json(path, read[0])
    except MalformedNode:
        return 0
    mode = store.get("mode") if isinstance(store, dict) else None
    parts = mode.split("/") if isinstance(mode, str) else []
    if len(parts) != 3 or not re.fullmatch(r"[1-9][0-9]{0,8}", parts[1]):
        return 0
    return int(parts[1])


# Pages being answered now (``answer_within`` blocks not waiting for the fill): the fill
# waits between its steps while there are any (``yield_to_pages``).
_pages = threading.Condition()
_pages_answering = [0]


def _page_counts(change: int) -> None:
    with _pages:
        _pages_answering[0] += change
        if not _pages_answering[0]:
            _pages.notify_all()


@contextmanager
def answer_within(seconds: float) -> Iterator[None]:
    """Within this block (a page's request), a read that would still be waiting for what the
    background fill is reading ``seconds`` after the block began raises ``StillReading``,
    naming what the fill reads, instead of waiting on: right after a start at a million jobs
    a page answers at once that it is still loading, rather than after the fill's listings.
    Meanwhile the fill gives way to the page between its steps (``yield_to_pages``)."""
    token = _ANSWER_BY.set(time.monotonic() + seconds)
    _page_counts(1)
    try:
        yield
    finally:
        _page_counts(-1)
        _ANSWER_BY.reset(token)


@contextmanager
def _waiting_for_fill() -> Iterator[None]:
    """A page waiting for what the fill reads does not hold the fill up meanwhile."""
    if _ANSWER_BY.get() is None:
        yield
        return
    _page_counts(-1)
    try:
        yield
    finally:
        _page_counts(1)


def yield_to_pages() -> None:
    """The fill, between two of its steps: wait while pages are being answered (at most
    FILL_YIELD_MOST). ZooKeeper answers one session's requests in order and the fill's work
    holds the interpreter: a page asked meanwhile would wait behind both."""
    with _pages:
        _pages.wait_for(lambda: not _pages_answering[0], FILL_YIELD_MOST)


def past_answer_time() -> bool:
    """Whether the request's ``answer_within`` deadline has passed (False outside one): a
    reader that keeps what it has read so far (the batch filters' submissions) stops there
    and says what is still loading."""
    deadline = _ANSWER_BY.get()
    return deadline is not None and time.monotonic() > deadline


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
        # batch_states' last answer: (the batch list it is for, the generation, the states).
        self._batch_states_kept: tuple[list[str], int, dict[str, BatchState]] | None = None
        self._reported: tuple[int, list[str]] | None = None
        # The batch index folders (``states/batch-*``) of the batches pages showed last, each
        # kept under a child watch like the state folders, newest use last (at most
        # MEMBER_FOLDERS_KEPT), and the job counts of their rows (``batch_job_counts``).
        self._member_folders: OrderedDict[str, _Folder] = OrderedDict()
        self._batch_counts: OrderedDict[str, tuple[tuple[int, ...], BatchCounts]] = OrderedDict()
        self._member_lock = threading.Lock()
        # job_entries_all's merged keys per (states, filter, by age): the serials of the
        # listings they were merged from, the keys.
        self._all_kept: OrderedDict[tuple[Any, ...], tuple[tuple[int, ...], array[int]]] = (
            OrderedDict()
        )
        # The Failed batches whose jobs have all ended well since (``fixed_batches``): each
        # Failed batch's verdict from its own folders, listed under watches of their own; the
        # batches a watch fired for since; the Failed batches of the batch states last seen.
        self._fixed: dict[str, bool] = {}
        self._fixed_yes: set[str] = set()
        self._fixed_dirty: set[str] = set()
        self._fixed_kept: tuple[dict[str, BatchState], set[str], list[str]] | None = None
        self._fixed_lock = threading.Lock()
        self.codes = JobCodes()
        # Job number -> its (profile, submitter) pair's index << 1 | no ARK yet.
        self._facts = PackedTable(FACT_BITS)
        self._pairs: list[JobFacts] = []
        self._pair_index: dict[tuple[str, str], int] = {}
        self._space: dict[str, _SpaceKnown] = {}
        self._store_nodes: dict[str, dict[int, int]] = {}  # state -> job -> node (0: none)
        self._failed = NumberMap()  # Failed job number -> index in _failed_kinds
        self._failed_kinds: list[FailedFacts] = []
        self._failed_kind: dict[FailedFacts, int] = {}
        # Whoever computes a figure many pages share (space, profile counts, the failed facts,
        # batch states) holds this; a page asking meanwhile waits for that answer instead of
        # reading the same nodes a second time (at start, the background fill is computing).
        self._compute = threading.RLock()
        # Search: hash of a key -> job numbers. Whoever looks a key up loads the jobs found and
        # keeps those that really have it (``search_keys``).
        self._keys = KeyTable()
        # state -> the entries of the listing whose jobs have been read for search.
        self._synced: dict[str, array[int]] = {}
        self._sync_lock = threading.Lock()
        # Notified whenever a folder's listing is stored, and when the fill's first step (the
        # listings of the job state folders, ``_listing_stage``) ends.
        self._listed = threading.Condition(self._lock)
        self._listing_stage = False
        self._search_complete = False
        self._filler: threading.Thread | None = None
        self._fill_stage = ""  # what the background fill is reading now ("" when idle)
        self._filled = False  # a fill has run to its end
        # Called (on whichever thread read them) with the texts of jobs read for facts and
        # search (``JobText``), and with the status messages of jobs read new in Failed
        # (number, message): the console's database text index is fed from here
        # (``queues/console/jobtext.py``). It must not block: it runs on the reader's thread.
        self.text_sink: Callable[[list[JobText]], None] | None = None
        # Called with each Failed job's status as it is read new in Failed (job number, the
        # decoded status, its stat): the search's error texts, the failed causes' signatures.
        self.status_sinks: list[Callable[[list[tuple[int, dict[str, Any], Any]]], None]] = []
        # Set by every watch event of a job state folder: a feeder waits on it instead of
        # polling (``queues/console/jobtext.py``).
        self.jobs_changed = threading.Event()
        zk.add_listener(self._on_session)

    def close(self) -> None:
        self.zk.remove_listener(self._on_session)

    def _chunks(self, todo: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
        """``todo`` in parts of ``size`` for one pipelined read each; in the background fill,
        of FILL_CHUNK, giving way to pages between two: ZooKeeper answers a session in order,
        so a page's small read sent meanwhile waits behind the fill's reads in flight (20,000
        batch reads in one go kept the overview waiting 4 s at a million jobs)."""
        filling = self._filler is threading.current_thread()
        step = FILL_CHUNK if filling else size
        for start in range(0, len(todo), step):
            if filling and start:
                yield_to_pages()
                time.sleep(FILL_PAUSE)
            yield todo[start : start + step]

    @contextmanager
    def _turn(self, lock: Any) -> Iterator[None]:
        """Hold ``lock`` (one reader of a folder or figure; others asking meanwhile wait for
        its answer). Within ``answer_within`` while the background fill runs, wait no longer
        than the request's deadline: ``StillReading`` names what the fill is reading."""
        deadline = _ANSWER_BY.get()
        if deadline is None or not self.filling:
            with lock:
                yield
            return
        with _waiting_for_fill():
            got = lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
        if not got:
            raise StillReading(self.loading())
        try:
            yield
        finally:
            lock.release()

    # Watches: only ever mark things stale (they run on kazoo's event thread) -----------------

    def _on_session(self, state: str) -> None:
        self.mark_all_stale()

    def mark_all_stale(self) -> None:
        with self._lock:
            for folder in (*self._folders.values(), *self._member_folders.values()):
                folder.stale = True
            self._stale_batches.update(self._batches)
            self._fixed_dirty.update(self._fixed)
            # Facts and space are not watched: they are only ever true per job and state.

    def _on_folder_event(self, event: Any) -> None:
        self.jobs_changed.set()
        with self._lock:
            if not kazoo_private.is_dropped_watch(event):
                path = event.path or ""
                folder = self._folders.get(path) or self._member_folders.get(path)
                if folder is not None:
                    folder.stale = True
                # else: a batch's folder let go of since its listing (its watch fires once)
                return
            # The connection dropped and every watch is gone.
            for each in (*self._folders.values(), *self._member_folders.values()):
                each.stale = True
            self._stale_batches.update(self._batches)

    def _on_fixed_event(self, event: Any) -> None:
        parts = (event.path or "").split("/")
        with self._lock:
            if not kazoo_private.is_dropped_watch(event) and len(parts) > 2:
                self._fixed_dirty.add(parts[2])
            else:
                self._fixed_dirty.update(self._fixed)

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
        wait = SETTLE_SECONDS
        deadline = _ANSWER_BY.get()
        if deadline is not None and self.filling:  # the fill's reads keep that thread busy
            wait = min(wait, max(0.0, deadline - time.monotonic()))
        kazoo_private.after_watch_callbacks(self.zk, wait)

    def names(self, path: str) -> list[str]:
        """The sorted child names of ``path`` (empty when it does not exist); do not modify.

        Job state folders keep parsed entries instead (``job_entries``)."""
        return self._listing(path).names

    def _list_raw(self, path: str) -> bytes:
        answer = kazoo_private.list_children_raw(self.zk, path, self._on_folder_event)
        return cast("bytes", answer.get())

    def _listing(self, path: str) -> _Listing:
        self.settle()
        with self._lock:
            folder = self._folders.setdefault(path, _Folder())
            if not folder.stale and folder.listing is not None:
                return folder.listing
        if path.startswith(paths.JOB_STATES + "/"):
            filled = self._listed_by_fill(folder)
            if filled is not None:
                return filled
        # One reader refreshes a folder; others asking meanwhile wait for its answer.
        with self._turn(folder.refresh):
            with self._lock:
                if not folder.stale and folder.listing is not None:
                    return folder.listing
                folder.stale = False
            job_folder = path.startswith(paths.JOB_STATES + "/")
            raw = b""
            names: list[str] = []
            try:
                try:
                    if job_folder:
                        raw = self._list_raw(path)
                    else:
                        names = self.zk.get_children(path, watch=self._on_folder_event)
                except NoNodeError:
                    # Watch for the folder's creation instead; until then it is empty.
                    if self.zk.exists(path, watch=self._on_folder_event) is not None:
                        if job_folder:
                            raw = self._list_raw(path)
                        else:
                            names = self.zk.get_children(path, watch=self._on_folder_event)
            except BaseException:
                with self._lock:
                    folder.stale = True
                raise
            if job_folder:
                listing = _Listing([], Entries(parse_entries(raw)))
            else:
                names.sort()
                listing = _Listing(names)
            with self._lock:
                folder.listing = listing
                self._listed.notify_all()
            return listing

    def _listed_by_fill(self, folder: _Folder) -> _Listing | None:
        """Within ``answer_within`` while the fill lists the job state folders (its first
        step), a job state folder's listing as the fill reads it: a request that read a folder
        of 600,000 jobs itself would spend its whole time on it beside the fill. Waits until
        the request's deadline (then ``StillReading``); None outside that step."""
        deadline = _ANSWER_BY.get()
        if deadline is None or not self._listing_stage or not self.filling:
            return None

        def ready() -> bool:
            return (not folder.stale and folder.listing is not None) or not self._listing_stage

        with _waiting_for_fill(), self._listed:
            if not self._listed.wait_for(ready, max(0.0, deadline - time.monotonic())):
                raise StillReading(self.loading())
            return folder.listing if not folder.stale else None

    def _ready_listing(self, path: str) -> _Listing | None:
        """The folder's listing if it is read and current, without reading or waiting."""
        with self._lock:
            folder = self._folders.get(path)
            if folder is None or folder.stale or folder.listing is None:
                return None
            return folder.listing

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

    def job_entries(self, state: str, *, order: str = "run") -> Entries:
        """The (priority, jid) entries of a state folder, like ``jobs.index_entries``.

        ``order``: "run" (priority, then age: the index names' own order), "oldest" or "newest"
        (by job ID). The entries are shared: callers slice them, never modify them.
        """
        return self._entries(self._listing(paths.job_state_folder(state)), order)

    @staticmethod
    def _by_age(listing: _Listing) -> Entries:
        found = listing.derived.get("oldest")
        if found is None:
            keys = (listing.entries or EMPTY).keys
            found = Entries(age_keys(keys), by_age=True)
            listing.derived["oldest"] = found
        return cast("Entries", found)

    @classmethod
    def _entries(cls, listing: _Listing, order: str) -> Entries:
        entries = listing.entries or EMPTY
        if order not in ("oldest", "newest"):
            return entries
        oldest = cls._by_age(listing)
        if order == "oldest":
            return oldest
        return Entries(oldest.keys, by_age=True, reverse=True)

    def job_states_of(self, jids: Iterable[str]) -> dict[str, str]:
        """The state folder each of ``jids`` is listed in (jobs in none are left out).

        A folder's entries are sorted by priority, then job number: a job is looked for by
        bisection in each priority's run, so a page of batches costs binary searches in
        memory, not a read of every job's status.
        """
        folders = []
        for state in JOB.states:
            listing = self._listing(paths.job_state_folder(state))
            keys = (listing.entries or EMPTY).keys
            folders.append((state, keys, self._priority_blocks(listing)))
        folders.sort(key=lambda item: -len(item[1]))  # the largest folder is the likeliest
        found = {}
        for jid in jids:
            match = JID_FORM.fullmatch(jid)
            if not match:
                continue  # index entries only ever name contract IDs
            number = int(match.group(1))
            for state, keys, blocks in folders:
                if has_number(keys, blocks, number):
                    found[jid] = state
                    break
        return found

    @staticmethod
    def _priority_blocks(listing: _Listing) -> list[tuple[int, int]]:
        found = listing.derived.get("blocks")
        if found is None:
            found = listing.derived["blocks"] = run_blocks((listing.entries or EMPTY).keys)
        return cast("list[tuple[int, int]]", found)

    # Batch rows -------------------------------------------------------------------------------

    def batch_job_counts(self, bids: Sequence[str]) -> dict[str, BatchCounts]:
        """The job counts of batch rows, from the batches' index folders and the state folders.

        A batch's index folders are listed once and kept under a child watch (as the state
        folders are), the newest-used MEMBER_FOLDERS_KEPT of them; a row's counts are kept
        while the listings they were counted from are current. So a page of batches shown again
        costs no request and no look-up of each job; after a change, the page pays for the
        batches whose folders changed, not for the queue. A missing folder lists no job.
        """
        if not bids:
            return {}
        members = self._member_listings(
            [paths.batch_index(b, f) for b in bids for f in BATCH_INDEX_FOLDERS]
        )
        states = [(s, self._listing(paths.job_state_folder(s))) for s in JOB.states]
        state_serials = tuple(listing.serial for _s, listing in states)
        found: dict[str, BatchCounts] = {}
        for bid in bids:
            listings = [members[paths.batch_index(bid, f)] for f in BATCH_INDEX_FOLDERS]
            serials = (*state_serials, *(x.serial if x else 0 for x in listings))
            with self._lock:
                kept = self._batch_counts.get(bid)
                if kept is not None and kept[0] == serials:
                    self._batch_counts.move_to_end(bid)
                    found[bid] = kept[1]
                    continue
            names = {
                f: listing.names if listing else []
                for f, listing in zip(BATCH_INDEX_FOLDERS, listings, strict=True)
            }
            counted: dict[str, int] = {}
            for folder, jids in names.items():
                if folder == "batch-deleted":
                    continue
                # The folder says where a job most likely is: look there first.
                likely = [
                    (s, listing)
                    for s, listing in states
                    if job_batch_folder(s) == folder and s != JobState.DELETED
                ]
                order = likely + [item for item in states if item not in likely]
                for state in self._states_of(jids, order):
                    counted[state] = counted.get(state, 0) + 1
            counts = BatchCounts(
                {f: len(v) for f, v in names.items()},
                {s: counted[s] for s in (*JOB.states, "?") if counted.get(s)},
            )
            with self._lock:
                self._batch_counts[bid] = (serials, counts)
                while len(self._batch_counts) > BATCH_COUNTS_KEPT:
                    self._batch_counts.popitem(last=False)
            found[bid] = counts
        return found

    def batch_folder_counts(self, bids: Sequence[str]) -> dict[str, dict[str, int]]:
        """How many jobs each batch index folder of ``bids`` lists (``BatchCounts.folders``,
        from the same kept listings), without the state folders' listings."""
        members = self._member_listings(
            [paths.batch_index(b, f) for b in bids for f in BATCH_INDEX_FOLDERS]
        )
        return {
            b: {
                f: len(listing.names) if (listing := members[paths.batch_index(b, f)]) else 0
                for f in BATCH_INDEX_FOLDERS
            }
            for b in bids
        }

    def _states_of(self, jids: Iterable[str], order: list[tuple[str, _Listing]]) -> Iterator[str]:
        """The state folder each job is listed in ("?" for none), looked for in ``order``."""
        folders = [
            (state, (listing.entries or EMPTY).keys, self._priority_blocks(listing))
            for state, listing in order
        ]
        for jid in jids:
            match = JID_FORM.fullmatch(jid)
            number = int(match.group(1)) if match else -1
            yield next(
                (
                    s
                    for s, keys, blocks in folders
                    if number >= 0 and has_number(keys, blocks, number)
                ),
                "?",
            )

    def _member_listings(self, folder_paths: Sequence[str]) -> dict[str, _Listing | None]:
        """Listings of batch index folders (None for a folder that does not exist), kept under
        a child watch; those not current are read with one pipelined request each."""
        self.settle()
        # One reader at a time: a folder being read is not yet known.
        with self._turn(self._member_lock):
            return self._member_listings_read(folder_paths)

    def _member_listings_read(self, folder_paths: Sequence[str]) -> dict[str, _Listing | None]:
        found: dict[str, _Listing | None] = {}
        todo: list[tuple[str, _Folder]] = []
        with self._lock:
            for path in folder_paths:
                folder = self._member_folders.get(path)
                if folder is None:
                    folder = self._member_folders[path] = _Folder()
                self._member_folders.move_to_end(path)
                if not folder.stale:
                    found[path] = folder.listing
                else:
                    folder.stale = False  # before the read that re-arms its watch
                    todo.append((path, folder))
            while len(self._member_folders) > max(MEMBER_FOLDERS_KEPT, len(folder_paths)):
                self._member_folders.popitem(last=False)
        watch = self._on_folder_event
        asked = [(p, f, self.zk.get_children_async(p, watch=watch)) for p, f in todo]
        missing = []
        failed: BaseException | None = None
        for path, folder, answer in asked:
            try:
                names = sorted(answer.get())
            except NoNodeError:
                missing.append((path, folder, self.zk.exists_async(path, watch=watch)))
                continue
            except BaseException as exc:
                failed = failed or exc
                folder.stale = True
                continue
            with self._lock:
                folder.listing = found[path] = _Listing(names)
        for path, folder, answer in missing:
            try:
                created = answer.get() is not None
            except BaseException as exc:
                failed = failed or exc
                folder.stale = True
                continue
            with self._lock:
                folder.stale = created  # created between the two requests: read next time
                folder.listing = found[path] = None
        if failed is not None:
            raise failed
        return found

    def job_id_set(self, state: str) -> frozenset[str]:
        """The job IDs listed in a state folder (made on each call: for tests and tools)."""
        return frozenset(self.job_entries(state).jids())

    def job_entries_matching(
        self, state: str, *, profile: str = "", submitter: str = "", order: str = "run"
    ) -> Entries:
        """The entries of a state whose job has this profile and a submitter containing
        ``submitter`` (case-insensitive); computed once per folder change and filter."""
        listing = self._listing(paths.job_state_folder(state))
        entries = self._entries(listing, order)
        if not profile and not submitter:
            return entries
        key = ("match", order, profile, submitter.lower())
        found = listing.derived.get(key)
        if found is not None:
            return cast("Entries", found)
        wanted = submitter.lower()
        if not self.filling:
            self._ensure_facts(entries.numbers())
        pairs = self._pairs
        ok = {
            i << 1 | flag
            for i, f in enumerate(list(pairs))
            if (not profile or f.profile == profile)
            and (not wanted or wanted in f.submitter.lower())
            for flag in (0, 1)
        }
        # At start: answered from the facts read so far (the page says the rest is loading)
        # rather than reading them all for this page too; not kept.
        # Read without the lock (a long loop at a large queue must not hold up the watches):
        # the tables are only ever added to or replaced whole, so a read sees a whole table.
        numbers = self._facts.numbers_with(ok, MATCHED_SET_MAX)
        if numbers is not None:
            found = entries.with_numbers(numbers)
        else:  # a filter most jobs match: one look-up per entry, without a set of them all
            get = self._facts.get
            found = entries.where(lambda _p, n: get(n) in ok)
        if self.filling:
            return found
        filters = [k for k in listing.derived if isinstance(k, tuple)]
        if len(filters) >= MAX_FILTERS_PER_LISTING:
            del listing.derived[filters[0]]
        listing.derived[key] = found
        return found

    def job_entries_all(
        self,
        states: Sequence[str],
        *,
        profile: str = "",
        submitter: str = "",
        order: str = "run",
    ) -> Entries:
        """The entries of several states together, in one order (the job list of every state);
        kept while the states' listings are the ones it was made from (at most
        MAX_FILTERS_PER_LISTING filters), so a page asked again merges nothing."""
        # Before the parts: a listing read anew meanwhile leaves the serials old (made again).
        serials = tuple(self._listing(paths.job_state_folder(s)).serial for s in states)
        if order in ("oldest", "newest"):
            # Each state's own by-age entries (kept with its listing), merged in C.
            parts = [
                self.job_entries_matching(s, profile=profile, submitter=submitter, order="oldest")
                for s in states
            ]
        else:
            parts = [
                self.job_entries_matching(s, profile=profile, submitter=submitter) for s in states
            ]
        key = (tuple(states), profile, submitter.lower(), order in ("oldest", "newest"))
        with self._lock:
            kept = self._all_kept.get(key)
            if kept is not None and kept[0] == serials:
                self._all_kept.move_to_end(key)
                found = kept[1]
            else:
                found = None
        if found is None:
            found = merged_sorted([part.keys for part in parts])
            if not self.filling:  # answered from the facts read so far: not kept
                with self._lock:
                    self._all_kept[key] = (serials, found)
                    kept_keys = sum(len(k) for _s, k in self._all_kept.values())
                    while len(self._all_kept) > 1 and (
                        len(self._all_kept) > MAX_FILTERS_PER_LISTING or kept_keys > ALL_KEYS_KEPT
                    ):
                        kept_keys -= len(self._all_kept.popitem(last=False)[1][1])
        if order in ("oldest", "newest"):
            return Entries(found, by_age=True, reverse=order == "newest")
        return Entries(found)

    def job_count(self, state: str) -> int:
        return len(self.job_entries(state))

    def job_counts_now(self) -> dict[str, int | None]:
        """Jobs per state without waiting for a listing being read: the listing's count when it
        is current, else the child count in the folder's stat (one request for every folder,
        pipelined); None when a folder cannot be asked."""
        counts: dict[str, int | None] = {}
        asked = {}
        for state in JOB.states:
            path = paths.job_state_folder(state)
            listing = self._ready_listing(path)
            if listing is not None:
                counts[state] = len(listing.entries or EMPTY)
            else:
                asked[state] = self.zk.exists_async(path)
        for state, answer in asked.items():
            try:
                stat = answer.get()
            except Exception:
                counts[state] = None
                continue
            counts[state] = stat.numChildren if stat is not None else 0
        return {s: counts[s] for s in JOB.states}

    def oldest_entry(self, state: str) -> str | None:
        """The index name with the lowest job ID (the job longest in the queue), if any."""
        return self._oldest(self._listing(paths.job_state_folder(state)))

    def oldest_entry_now(self, state: str) -> str | None:
        """``oldest_entry`` if the folder's listing is current, else None (without waiting)."""
        listing = self._ready_listing(paths.job_state_folder(state))
        return self._oldest(listing) if listing is not None else None

    @classmethod
    def _oldest(cls, listing: _Listing) -> str | None:
        found = listing.derived.get("oldest-name")
        if found is None:
            keys = (listing.entries or EMPTY).keys
            # Each priority's run starts with its lowest job number.
            firsts = [keys[start] for _p, start in cls._priority_blocks(listing)]
            if not firsts:
                found = ""
            else:
                low = min(firsts, key=lambda k: k & NUM_MASK)
                found = f"{low >> NUM_BITS:02d}-{jid_of(low & NUM_MASK)}"
            listing.derived["oldest-name"] = found
        return cast("str", found) or None

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
        batches are left out. The answer is shared (do not modify it): while the batch list
        and every batch's state are as they were, the same one is given again, without a look
        at each of 20,000 batches per page (16 ms of every overview at 1,000,000 jobs)."""
        bids = self.batch_ids()  # settles
        with self._lock:
            kept = self._batch_states_kept
            if (
                kept is not None
                and kept[0] is bids
                and kept[1] == self._batch_generation
                and not self._stale_batches
            ):
                return kept[2]
        with self._turn(self._compute):
            return self._batch_states(bids)

    def fixed_batches(self) -> list[str]:
        """The Failed batches whose jobs have all ended well since (none in ``batch-failed``
        or ``batch-processing``, one or more in ``batch-completed``), oldest first.

        A Failed batch's three folders are listed when it is first seen Failed and again only
        after a watch of theirs fired (watches of their own, not among the batch rows' kept
        folders, so neither pushes the other out). The answer is kept while the batch states
        are the same and no such watch fired: a page asking again looks at no batch, and a
        change costs the batches it touched (plus one pass over the batch states when a batch
        changed state, as ``batch_states`` makes)."""
        states = self.batch_states()  # settles
        with self._lock:
            kept = self._fixed_kept
            if kept is not None and kept[0] is states and not self._fixed_dirty:
                return kept[2]
        # One reader at a time: a batch being listed is not yet known.
        with self._turn(self._fixed_lock):
            with self._lock:
                kept = self._fixed_kept
                if kept is not None and kept[0] is states:
                    failed = kept[1]
                    todo = [b for b in self._fixed_dirty if b in failed]
                else:  # a batch came, went or changed state: one pass over the batch states
                    failed = {b for b, s in states.items() if s.state == FAILED_BATCH}
                    for gone in [b for b in self._fixed if b not in failed]:
                        del self._fixed[gone]  # its watches fire once more at most: ignored
                        self._fixed_yes.discard(gone)
                    todo = [b for b in failed if b not in self._fixed or b in self._fixed_dirty]
                self._fixed_dirty.clear()  # before the reads that re-arm the watches
            try:
                verdicts = self._fixed_verdicts(todo)
            except BaseException:
                with self._lock:
                    self._fixed_dirty.update(todo)  # read again next time
                raise
            with self._lock:
                for bid, fixed in verdicts.items():
                    self._fixed[bid] = fixed
                    if fixed:
                        self._fixed_yes.add(bid)
                    else:
                        self._fixed_yes.discard(bid)
                answer = sorted(self._fixed_yes)
                self._fixed_kept = (states, failed, answer)
                return answer

    def _fixed_verdicts(self, bids: list[str]) -> dict[str, bool]:
        """Whether each batch's jobs have all ended well, from its folders listed now (one
        pipelined request each, with a watch; a missing folder lists no job and is watched
        for its creation)."""
        watch = self._on_fixed_event
        wanted = ("batch-failed", "batch-processing", "batch-completed")
        asked = [
            (b, f, self.zk.get_children_async(paths.batch_index(b, f), watch=watch))
            for b in bids
            for f in wanted
        ]
        sizes: dict[str, dict[str, int]] = {b: {} for b in bids}
        missing = []
        for bid, folder, answer in asked:
            try:
                sizes[bid][folder] = len(answer.get())
            except NoNodeError:
                sizes[bid][folder] = 0
                missing.append(self.zk.exists_async(paths.batch_index(bid, folder), watch=watch))
        for answer in missing:
            answer.get()
        return {
            b: n["batch-failed"] == 0 and n["batch-processing"] == 0 and n["batch-completed"] > 0
            for b, n in sizes.items()
        }

    def batch_states_now(self) -> dict[str, BatchState]:
        """The batch states read so far, without waiting (while the fill reads them)."""
        with self._lock:
            return {b: s for b, s in self._batches.items() if s is not None}

    def _batch_states(self, bids: list[str]) -> dict[str, BatchState]:
        with self._lock:
            known = set(bids)
            for gone in [b for b in self._batches if b not in known]:
                del self._batches[gone]
                self._stale_batches.discard(gone)
                self._batch_generation += 1
            todo = [b for b in bids if b not in self._batches or b in self._stale_batches]
            self._stale_batches.difference_update(todo)
        for part in self._chunks(todo, READ_CHUNK * 5):
            self._read_batches(part)
        with self._lock:
            found = {b: s for b in bids if (s := self._batches.get(b)) is not None}
            # Kept only when every batch is read and current (a watch since, or a batch whose
            # status could not be read, leaves a stale batch: computed again next time).
            if not self._stale_batches:
                self._batch_states_kept = (bids, self._batch_generation, found)
            return found

    def _read_batches(self, todo: Sequence[str]) -> None:
        watch = self._on_batch_event
        pending = [
            (
                b,
                self.zk.get_async(paths.batch_node(b, "status"), watch=watch),
                self.zk.exists_async(paths.batch_node(b, "status-report")),  # see the doc
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

    @staticmethod
    def _summary(states: Iterable[BatchState]) -> dict[str, tuple[int, int]]:
        summary: dict[str, tuple[int, int]] = {}
        for item in states:
            count, oldest = summary.get(item.state, (0, item.mtime_ms))
            summary[item.state] = (count + 1, min(oldest, item.mtime_ms))
        return summary

    def batch_summary(self) -> dict[str, tuple[int, int]]:
        """Batch state -> (how many, oldest status mtime in ms); recomputed after a change."""
        states = self.batch_states()
        with self._lock:
            generation = self._batch_generation
            if self._batch_summary is not None and self._batch_summary[0] == generation:
                return self._batch_summary[1]
        summary = self._summary(states.values())
        with self._lock:
            self._batch_summary = (generation, summary)
        return summary

    def batch_summary_now(self) -> dict[str, tuple[int, int]]:
        """``batch_summary`` of the batches read so far, without waiting."""
        return self._summary(self.batch_states_now().values())

    def reported_batch_ids(self, *, wait: bool = True) -> list[str]:
        """Batches with a status report, newest first (from the index: no read per batch).
        ``wait`` False: while the fill reads the batch states, of those read so far."""
        if not wait and self.filling:
            known = self.batch_states_now()
            return [b for b in reversed(self.batch_ids()) if (s := known.get(b)) and s.has_report]
        states = self.batch_states()
        with self._lock:
            generation = self._batch_generation
        cached = self._reported
        if cached is not None and cached[0] == generation:
            return cached[1]
        found = [b for b in reversed(self.batch_ids()) if (s := states.get(b)) and s.has_report]
        self._reported = (generation, found)
        return found

    # Jobs -------------------------------------------------------------------------------------

    def _pair(self, profile: str, submitter: str) -> int:
        """The index of a (profile, submitter) pair in the table of distinct pairs."""
        key = (profile, submitter)
        found = self._pair_index.get(key)
        if found is None:
            if len(self._pairs) >= MAX_PAIRS:
                raise OverflowError("too many distinct (profile, submitter) pairs")
            found = len(self._pairs)
            self._pairs.append(JobFacts(sys.intern(profile), sys.intern(submitter)))
            self._pair_index[key] = found
        return found

    def profile_counts(self, state: str) -> dict[str, int]:
        """Jobs of a state per profile ("" when unknown), computed once per folder change."""
        listing = self._listing(paths.job_state_folder(state))
        counts = listing.derived.get("profile-counts")
        if counts is not None:
            return cast("dict[str, int]", counts)
        with self._turn(self._compute):
            counts = listing.derived.get("profile-counts")
            if counts is not None:
                return cast("dict[str, int]", counts)
            entries = self._entries(listing, "run")
            self._ensure_facts(entries.numbers())
            counts = self._profile_counts(entries)
            listing.derived["profile-counts"] = counts
            return counts

    def profile_counts_so_far(self, state: str) -> dict[str, int]:
        """``profile_counts``, but while the background fill runs, of the jobs read so far
        (``profile_counts_now``; the pages say what is still loading) instead of reading every
        job's facts of the state first, which at a million jobs holds an answer for seconds."""
        if self.filling:
            return self.profile_counts_now(state) or {}
        return self.profile_counts(state)

    def profile_counts_now(self, state: str) -> dict[str, int] | None:
        """``profile_counts`` without waiting: None until the folder is read; from the facts
        read so far while the fill runs (not kept)."""
        listing = self._ready_listing(paths.job_state_folder(state))
        if listing is None:
            return None
        counts = listing.derived.get("profile-counts")
        if counts is not None:
            return cast("dict[str, int]", counts)
        return self._profile_counts(self._entries(listing, "run"))

    def _profile_counts(self, entries: Entries) -> dict[str, int]:
        by_pair: dict[int | None, int] = {}
        get = self._facts.get  # without the lock, as in ``job_entries_matching``
        for number in entries.numbers():
            value = get(number)
            pair = None if value is None else value >> 1
            by_pair[pair] = by_pair.get(pair, 0) + 1
        counts: dict[str, int] = {}
        for pair, n in by_pair.items():
            profile = "" if pair is None else self._pairs[pair].profile
            counts[profile] = counts.get(profile, 0) + n
        return counts

    def space_total(self, state: str) -> int:
        """Sum of ``space_needed`` over the jobs of a state, computed once per folder change."""
        listing = self._listing(paths.job_state_folder(state))
        total = listing.derived.get("space-total")
        if total is not None:
            return cast("int", total)
        with self._turn(self._compute):
            total = listing.derived.get("space-total")
            if total is not None:
                return cast("int", total)
            numbers = numbers_sorted(self._entries(listing, "run").keys)
            total = sum(self._space_values(state, numbers))
            listing.derived["space-total"] = total
            return total

    def space_total_now(self, state: str) -> int | None:
        """``space_total`` if it is known for the folder's current listing, else None."""
        listing = self._ready_listing(paths.job_state_folder(state))
        if listing is None:
            return None
        return cast("int | None", listing.derived.get("space-total"))

    def _ensure_facts(self, numbers: Iterable[int]) -> None:
        """Read the facts of the jobs (contract IDs' numbers) whose facts are not known."""
        get = self._facts.get
        with self._lock:
            todo = [jid_of(n) for n in numbers if get(n) is None]
        for start in range(0, len(todo), READ_CHUNK):
            self._read_jobs(todo[start : start + READ_CHUNK], [])

    def job_facts(self, jids: Sequence[str]) -> dict[str, JobFacts]:
        """Profile and submitter of each job; unreadable jobs are left out."""
        number = self.codes.number
        get = self._facts.get
        with self._lock:
            todo = [j for j in jids if get(number(j)) is None]
        for start in range(0, len(todo), READ_CHUNK):
            self._read_jobs(todo[start : start + READ_CHUNK], [])
        pairs = self._pairs
        found = {}
        with self._lock:
            for jid in jids:
                value = get(number(jid))
                if value is not None:
                    found[jid] = pairs[value >> 1]
        return found

    def job_facts_by_number(
        self, numbers: Sequence[int], *, read: bool = True
    ) -> dict[int, JobFacts]:
        """``job_facts`` of contract job numbers; ``read`` False: only those known already."""
        if read:
            self._ensure_facts(numbers)
        get = self._facts.get
        pairs = self._pairs
        found = {}
        with self._lock:
            for number in numbers:
                value = get(number)
                if value is not None:
                    found[number] = pairs[value >> 1]
        return found

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

        facts: list[tuple[str, str, str, bool]] = []  # jid, profile, submitter, has an ARK
        keys: list[tuple[str, str]] = []
        arks: list[tuple[str, bool]] = []
        sink = self.text_sink
        texts: list[JobText] = []
        for jid in config_jids:
            config = json_of(node(jid, "configuration"))
            if config is None:
                continue  # gone, or broken: asked again next time
            ids = json_of(node(jid, "identifiers")) or {}
            keys += [(k, jid) for k in search_keys(config, ids)]
            if sink is not None and (match := JID_FORM.fullmatch(jid)):
                made = reads[node(jid, "configuration")][1].ctime  # type: ignore[index]
                texts.append(job_text(int(match.group(1)), config, ids, made))
            facts.append(
                (
                    jid,
                    _text(config.get("profile")),
                    _text(config.get("submitter")),
                    bool(_text(ids.get("primary_id"))),
                )
            )
        for jid in ids_jids:
            ids = json_of(node(jid, "identifiers")) or {}
            keys += [(k, jid) for k in search_keys({}, ids)]
            arks.append((jid, bool(_text(ids.get("primary_id")))))
            ark = _text(ids.get("primary_id")).strip()
            if sink is not None and ark and (match := JID_FORM.fullmatch(jid)):
                texts.append(JobText(int(match.group(1)), "", "", "", (), ark, whole=False))
        if sink is not None and texts:
            sink(texts)
        number = self.codes.number
        with self._lock:
            # Facts of deleted jobs are never asked for again; a bound keeps them from
            # piling up in a process that runs for months (everything is read again).
            if len(self._facts) + len(facts) > MAX_FACTS:
                self._facts.clear()
                self._keys.clear()
                self._synced.clear()
                self._search_complete = False
            table = self._facts
            for jid, profile, submitter, has_ark in facts:
                table.set(number(jid), self._pair(profile, submitter) << 1 | (not has_ark))
            for jid, has_ark in arks:
                n = number(jid)
                value = table.get(n)
                if value is not None:
                    table.set(n, value & ~NO_ARK | (not has_ark))
            for key, jid in keys:
                self._keys.add(key, number(jid))

    def space_needed(self, state: str, jids: Iterable[str]) -> dict[str, int]:
        """``space_needed`` of each job, cached for as long as the job stays in ``state``.

        Pass every job of the state: jobs not passed are forgotten for it.
        """
        number, jid = self.codes.number, self.codes.jid
        numbers = array("q", sorted(map(number, jids)))
        return dict(zip(map(jid, numbers), self._space_values(state, numbers), strict=True))

    def _space_values(self, state: str, numbers: array[int]) -> array[int]:
        """``space_needed`` of the jobs ``numbers`` (sorted), in that order; those not known
        for the state are read. What is kept per state is two arrays, 16 bytes a job (a
        dictionary of ints was about 95: 17 MiB for the 180,000 working jobs of a queue of a
        million)."""
        with self._lock:
            kept = self._space.get(state)
        if kept is not None and kept.numbers == numbers:  # compared in C: nothing changed
            return kept.values
        old_numbers, old_values = kept or (array("q"), array("q"))
        values = carried(old_numbers, old_values, numbers, -1)
        todo = positions_of(values, -1)
        jid = self.codes.jid
        for start in range(0, len(todo), READ_CHUNK):  # each chunk's answers freed before the next
            part = todo[start : start + READ_CHUNK]
            node_paths = [paths.job_node(jid(numbers[i]), "space_needed") for i in part]
            reads = read_many(self.zk, node_paths)
            for i, path in zip(part, node_paths, strict=True):
                read = reads[path]
                try:
                    values[i] = 0 if read is None else decode_int(path, read[0], 0, LONG_MAX)
                except MalformedNode:
                    values[i] = 0
        with self._lock:
            self._space[state] = _SpaceKnown(numbers, values)
        return values

    def store_node_counts(self, state: str) -> dict[int, int]:
        """Jobs of a state per storage node they are bound for (the node of their ``store``
        node's mode; 0 for none yet), computed once per folder change; each job's node is read
        once for as long as it stays in the state (a job's store node is written before
        Storing and not changed after)."""
        listing = self._listing(paths.job_state_folder(state))
        counts = listing.derived.get("store-nodes")
        if counts is not None:
            return cast("dict[int, int]", counts)
        with self._turn(self._compute):
            counts = listing.derived.get("store-nodes")
            if counts is not None:
                return cast("dict[int, int]", counts)
            numbers = list(self._entries(listing, "run").numbers())
            with self._lock:
                known = self._store_nodes.get(state, {})
            todo = [n for n in numbers if n not in known]
            fresh: dict[int, int] = {}
            for start in range(0, len(todo), READ_CHUNK):
                part = todo[start : start + READ_CHUNK]
                wanted = {n: paths.job_node(jid_of(n), "store") for n in part}
                reads = read_many(self.zk, list(wanted.values()))
                for n, path in wanted.items():
                    fresh[n] = store_node_of(path, reads[path])
            current = {n: known[n] if n in known else fresh[n] for n in numbers}
            with self._lock:
                self._store_nodes[state] = current
            counts = {}
            for node in current.values():
                counts[node] = counts.get(node, 0) + 1
            listing.derived["store-nodes"] = counts
            return counts

    # Failed jobs ------------------------------------------------------------------------------

    def failed_numbers(self, *, wait: bool = True) -> FailedNumbers:
        """Batch and failing step of every Failed job (by job number), re-read only for jobs
        new in Failed. Jobs whose nodes cannot be read are left out (the failed page lists them
        by loading). ``wait`` False: while the fill is reading them, those read so far."""
        listing = self._listing(paths.job_state_folder(JobState.FAILED))
        cached = listing.derived.get("failed-facts")
        if cached is not None:
            return cast("FailedNumbers", cached)
        if not wait and self.filling:
            with self._lock:
                return FailedNumbers(self._failed, self._failed_kinds)
        with self._turn(self._compute):  # one reader computes; others asking meanwhile wait for it
            cached = listing.derived.get("failed-facts")
            if cached is not None:
                return cast("FailedNumbers", cached)
            entries = listing.entries or EMPTY
            with self._lock:
                known = self._failed.copy()  # published maps are never changed
            todo = [n for n in entries.numbers() if n not in known]
            for numbers in self._chunks(todo, READ_CHUNK):
                part = [jid_of(n) for n in numbers]
                reads = read_many(
                    self.zk,
                    [paths.job_node(j, n) for j in part for n in ("bid", "status")],
                )
                statuses: list[tuple[int, dict[str, Any], Any]] = []
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
                    known[int(jid[3:])] = self._failed_kind_of(bid, step)
                    statuses.append((int(jid[3:]), status, status_read[1]))
                for sink in list(self.status_sinks) if statuses else ():
                    sink(statuses)
                with self._lock:
                    self._failed = known.copy()  # pages asking meanwhile see what is read
            current = NumberMap(
                (n, c) for n in entries.numbers() if (c := known.get(n)) is not None
            )
            with self._lock:
                self._failed = current
                answer = FailedNumbers(current, self._failed_kinds)
            listing.derived["failed-facts"] = answer
            return answer

    def _failed_kind_of(self, bid: str, step: str) -> int:
        with self._lock:
            found = self._failed_kind.get(FailedFacts(bid, step))
            if found is None:
                facts = FailedFacts(sys.intern(bid), sys.intern(step))
                found = self._failed_kind[facts] = len(self._failed_kinds)
                self._failed_kinds.append(facts)
            return found

    def failed_facts(self) -> dict[str, FailedFacts]:
        """``failed_numbers`` keyed by job ID."""
        return {jid_of(n): f for n, f in self.failed_numbers().items()}

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
            found = self._keys.find(key)
            complete = self._search_complete
        return [self.codes.jid(n) for n in found], complete

    def any_submitter_holds(self, text: str) -> bool:
        """Whether any live job's submitter contains ``text`` (case-insensitive, as
        ``job_entries_matching`` compares), from the table of distinct (collection, submitter)
        pairs once the jobs new since the last look are read into it (as ``find`` does; while
        the index fills, what is read so far)."""
        if not self.filling:
            with self._sync_lock:
                self.sync_jobs()
        wanted = text.lower()
        return any(wanted in pair.submitter.lower() for pair in list(self._pairs))

    def sync(self) -> None:
        """Read what is new since the last look: every job new in a state folder (facts, search
        keys, the text sink) and every job new in Failed (its batch, step and message)."""
        with self._sync_lock:
            self.sync_jobs()
        self.failed_numbers()

    def sync_jobs(
        self, *, progress: Callable[[int], None] | None = None, chunk: int = READ_CHUNK
    ) -> None:
        """Read the jobs new in any state folder since the last sync, for facts and search.

        The first sync reads every job (the background fill does it at start); later ones only
        what the watches said changed.
        """
        get = self._facts.get
        for state in JOB.states:
            entries = self.job_entries(state)
            keys = entries.keys
            with self._lock:
                before = self._synced.get(state)
            if before is keys:
                continue
            if before is None:
                new: Iterable[int] = entries.numbers()
            else:
                old = set(before)
                new = [k & NUM_MASK for k in keys if k not in old]
            # Numbers, not IDs, until a chunk is read (600,000 ID strings would be 40 MB).
            config = array("q")
            ids = array("q")
            ark_state = state in ARK_STATES
            for n in new:  # without the lock, as in ``job_entries_matching``
                value = get(n)
                if value is None:
                    config.append(n)
                elif value & NO_ARK and ark_state:
                    ids.append(n)
            for start in range(0, max(len(config), len(ids)), chunk):
                part = [jid_of(n) for n in config[start : start + chunk]]
                self._read_jobs(part, [jid_of(n) for n in ids[start : start + chunk]])
                if progress is not None:
                    progress(len(part))
                    if start % TRIM_EVERY < chunk:
                        trim_heap()
                    yield_to_pages()
                    time.sleep(FILL_PAUSE)  # let page requests in between the fill's steps
            with self._lock:
                self._synced[state] = keys
        with self._lock:
            self._facts.compact()
            self._keys.compact()
            self._search_complete = True

    # Start-up ---------------------------------------------------------------------------------

    @property
    def filling(self) -> bool:
        filler = self._filler
        if filler is None and not self._filled:
            # A fill thread started for this process (``queues.web.warmup``) that has not reached
            # ``fill`` yet (it connects first): pages asked meanwhile must not read everything
            # themselves, as they would if the fill were not coming.
            filler = next(
                (t for t in threading.enumerate() if t.name in FILL_THREADS and t.is_alive()),
                None,
            )
        return filler is not None and filler.is_alive() and filler is not threading.current_thread()

    def fill(self, first: Callable[[], Any] | None = None) -> None:
        """Read everything pages need, in the order they need it (run in a thread of its own).

        ``first`` reads what the overview shows (the selectors' own call, so exactly that is
        warm); then the batch states, the failed list, and every job's details for search and
        collection filters.
        """
        with self._lock:
            self._filler = threading.current_thread()
        # The fill is CPU-bound (parsing thousands of nodes a second) and pages are not (each
        # waits on ZooKeeper's answers, then needs the interpreter back). With the usual 5 ms
        # switch interval a page waits up to that long after every answer; while the fill
        # runs, the interpreter switches threads ten times as often.
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, FILL_SWITCH_INTERVAL))
        try:
            self._fill_stage = "job counts and batch states"
            with self._lock:
                self._listing_stage = True
            for state in JOB.states:  # the listings first: every job list can answer
                yield_to_pages()
                self.job_entries(state)
            self._end_listing_stage()
            if first is not None:
                first()
            self.batch_states()
            trim_heap()
            self._fill_stage = "failed jobs' batches and steps"
            self.failed_numbers()
            trim_heap()
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
            self._filled = True
        finally:
            self._end_listing_stage()
            sys.setswitchinterval(switch)
            self._fill_stage = ""
            with self._lock:
                self._filler = None
            give_back_memory()

    def _end_listing_stage(self) -> None:
        with self._lock:
            self._listing_stage = False
            self._listed.notify_all()

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
                "without_ark": sum(v & NO_ARK for v in self._facts.values()),
                "failed": len(self._failed),
                "batches": len(self._batches),
                "odd_ids": len(self.codes),
            }


_indexes: dict[int, ReadIndex] = {}


_indexes_lock = threading.Lock()


# Called with every index ``for_client`` makes, before its first read (the Django app adds the
# feed of the database's text index, ``queues/console/jobtext.py``).
NEW_INDEX_HOOKS: list[Callable[[ReadIndex], Any]] = []


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
            for hook in NEW_INDEX_HOOKS:
                hook(index)
            _indexes[id(zk)] = index
        return index


def reset() -> None:
    """Forget every index (tests, benchmarks, a closed client)."""
    with _indexes_lock:
        for index in _indexes.values():
            index.close()
        _indexes.clear()
