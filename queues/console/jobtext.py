"""The console's database text index of live jobs: what the search finds a job by however old
it is (title, file name, submitter, local IDs, ARK, the message it last failed with).

Why the database and not the read index: a job's title, file names, submitter, local IDs and
ARK never change once it is made. They are not queue state, and at 1,000,000 jobs they are
about 150 MB of Python strings a web process would hold (the read index keeps 60 bytes a job,
docs/architecture.md weighs the two). The database keeps them on disk with an index made for a
part of a text (SQLite's FTS5 trigram table, PostgreSQL's ``pg_trgm``), survives a restart, and
is shared by every web process.

Fed from the read index (``queues/zk/index.py``), never from a walk of ZooKeeper of its own:

- the index reads a job's ``configuration`` and ``identifiers`` once, when a watch of a state
  folder shows it new (``sync_jobs``), and the ``identifiers`` again when a job without an ARK
  passes Processing; each read hands the texts to ``text_sink``. A Failed job's status is read
  when it is new in Failed (``failed_numbers``) and handed to the ``status_sinks``.
- ``Feed`` keeps those in memory (``pending``, at most ``MAX_PENDING`` rows) and a writer
  thread upserts them in transactions of ``WRITE_BATCH``. When the database is down the writer
  waits (back-off up to ``MAX_BACKOFF`` seconds, the reason kept for ``status()``) and the
  sinks keep taking rows: the watches and the read index never wait for the database. Rows
  past ``MAX_PENDING`` are kept as job numbers only (``missed``, 8 bytes a job), and read
  again from ZooKeeper when the writer has caught up.
- a feeder thread waits on the read index's ``jobs_changed`` event (set by every watch event
  of a job state folder), then after ``settings.MRT_SEARCH_FEED_SECONDS`` syncs the index, so
  the database follows the queue while nobody searches. A search syncs first too.
- a restart: the background fill reads every job (``ReadIndex.fill``); the feed loads the
  numbers the database already holds (``known``, a sorted array) and the checksums of the
  error texts it holds, and takes only jobs not in it, or whose error changed: the backfill is
  what was made, or failed, while no console ran, and ``status()`` says how far it is.

Rows of jobs that are gone from ZooKeeper (deleted, archived) are taken away when a search
meets them (``forget``).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from queues.core import transient
from queues.models import JobText as Row
from queues.zk import index as zindex
from queues.zk import paths as zpaths
from queues.zk.codecs import decode_json
from queues.zk.errors import MalformedNode
from queues.zk.nodes import read_many

log = logging.getLogger(__name__)

FIELDS = ("title", "filename", "submitter", "local_ids", "ark", "error")  # searched
TEXT_FIELDS = ("title", "filename", "submitter", "local_ids", "ark")
MAX_PENDING = 20_000  # rows kept in memory for the writer; more are kept as numbers
WRITE_BATCH = 500  # rows a transaction
READ_BATCH = 500  # missed jobs read again from ZooKeeper at once
MAX_BACKOFF = 30.0
FRESH_MAX = 50_000  # rows written since the start kept in a set before a merge
COUNT_CAP = 10_000  # matches counted at most (a page says "more than")
SHORTEST_INDEXED = 3  # a trigram index finds texts of three characters or more


def _known_key(number: int, made: int, ark: bool) -> int:
    """A job's number (34 bits), whether its row has an ARK, and the low 24 bits of when it
    was made, in one integer."""
    return number << 25 | ark << 24 | (made & 0xFFFFFF)


# ``_known_key`` of every row, worked out by the database (SQLite and PostgreSQL alike: the
# bit operators share one precedence, hence every parenthesis).
KNOWN_KEYS_SQL = (
    "SELECT (number << 25) | (CASE WHEN ark <> '' THEN 16777216 ELSE 0 END) | (made & 16777215) "
    "FROM queues_jobtext ORDER BY number"
)


def _crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


@dataclass
class Progress:
    """What the feed has done, for pages and tests."""

    written: int = 0
    waiting: int = 0  # rows in memory not written yet
    missed: int = 0  # jobs to read again from ZooKeeper
    known_loaded: bool = False
    reason: str = ""  # why the database could not be written, "" when it could


class Feed:
    """The feed of one read index into the database (one per web process)."""

    def __init__(self, idx: zindex.ReadIndex, *, start: bool = False) -> None:
        self.idx = idx
        self.lock = threading.Lock()
        self.pending: dict[int, dict[str, Any]] = {}
        # Rows taken from ``pending`` by the writer and not committed yet: still searched, so
        # that a row is never in neither place while its batch is written.
        self.writing_rows: dict[int, dict[str, Any]] = {}
        self.missed = array("q")
        self.missed_errors = array("q")
        # Sorted numbers of the rows the database holds, and the (number << 32 | checksum) of
        # their error texts, as read at the start; what was written since in ``fresh`` and
        # ``fresh_errors`` (merged into the arrays now and then).
        self.known: array[int] | None = None
        self.known_errors: array[int] = array("q")
        self.fresh: set[int] = set()
        self.fresh_errors: dict[int, int | None] = {}
        self.wake = threading.Event()
        self.stopped = threading.Event()
        self.progress = Progress()
        self.writing = threading.Lock()  # held while a batch is written
        idx.text_sink = self.take_texts
        idx.status_sinks.append(self.take_statuses)
        self.threads: list[threading.Thread] = []
        if start:
            self.start()

    def start(self) -> None:
        """Start the writer and the feeder (once)."""
        with self.lock:
            if self.threads:
                return
            for name, target in (("jobtext-write", self._write_loop), ("jobtext-feed", self._feed)):
                thread = threading.Thread(target=target, name=name, daemon=True)
                thread.start()
                self.threads.append(thread)

    # Sinks: called by the read index on its reader's thread; never wait on the database ------

    def _in_db(self, number: int, made: int, ark: bool) -> bool:
        """Whether the database holds this job's texts (its number, made at ``made``, with an
        ARK or not)."""
        key = _known_key(number, made, ark)
        if key in self.fresh:
            return True
        known = self.known
        if known is None:
            return False
        i = bisect_left(known, key)
        return i < len(known) and known[i] == key

    def _error_in_db(self, number: int) -> int | None:
        """The checksum of the error text the database holds for a job, None for none."""
        if number in self.fresh_errors:
            return self.fresh_errors[number]
        errors = self.known_errors
        i = bisect_left(errors, number << 32)
        if i < len(errors) and errors[i] >> 32 == number:
            return errors[i] & 0xFFFFFFFF
        return None

    def _merge_fresh(self) -> None:
        """Fold the rows written since into the sorted arrays (bounded memory: a set of at most
        ``FRESH_MAX`` numbers between two merges)."""
        if self.known is not None and len(self.fresh) >= FRESH_MAX:
            self.known = array("q", heapq.merge(self.known, sorted(self.fresh)))
            self.fresh = set()
        if len(self.fresh_errors) >= FRESH_MAX:
            changed = self.fresh_errors
            kept = (e for e in self.known_errors if (e >> 32) not in changed)
            new = sorted(n << 32 | c for n, c in changed.items() if c is not None)
            self.known_errors = array("q", heapq.merge(kept, new))
            self.fresh_errors = {}

    def _put(self, number: int, values: dict[str, Any], missed: array[int]) -> None:
        row = self.pending.get(number)
        if row is not None:
            row.update(values)
        elif len(self.pending) < MAX_PENDING:
            self.pending[number] = dict(values)
        else:
            missed.append(number)

    def take_texts(self, texts: list[zindex.JobText]) -> None:
        with self.lock:
            for t in texts:
                values: dict[str, Any]
                if not t.whole:
                    values = {"ark": t.ark}
                elif self._in_db(t.number, t.made, bool(t.ark)):
                    continue  # never changes: already there (an ARK comes as its own update)
                else:
                    values = {
                        "made": t.made,
                        "title": t.title,
                        "filename": t.filename,
                        "submitter": t.submitter,
                        "local_ids": "\n".join(t.local_ids),
                    }
                    if t.ark:
                        values["ark"] = t.ark
                self._put(t.number, values, self.missed)
            self.progress.waiting = len(self.pending)
            self.progress.missed = len(self.missed) + len(self.missed_errors)
        self.wake.set()

    def take_statuses(self, statuses: list[tuple[int, dict[str, Any], Any]]) -> None:
        messages = []
        for number, status, _stat in statuses:
            message = status.get("message")
            messages.append((number, message if isinstance(message, str) else ""))
        self.take_errors(messages)

    def take_errors(self, messages: list[tuple[int, str]]) -> None:
        with self.lock:
            for number, message in messages:
                if self._error_in_db(number) == (_crc(message) if message else None):
                    continue
                self._put(number, {"error": message}, self.missed_errors)
            self.progress.waiting = len(self.pending)
            self.progress.missed = len(self.missed) + len(self.missed_errors)
        self.wake.set()

    # The writer -------------------------------------------------------------------------------

    def _load_known(self) -> None:
        # The keys made by the database (``_known_key``), in order of the primary key (their
        # high bits): at 1,000,000 rows half the interpreter time of a key made per row and
        # sorted here, taken from the first pages asked after a start.
        numbers = array("q")
        errors = array("q")
        with connection.cursor() as cursor:
            cursor.execute(KNOWN_KEYS_SQL)
            while chunk := cursor.fetchmany(10_000):
                numbers.extend([key for (key,) in chunk])
            cursor.execute("SELECT number, error FROM queues_jobtext WHERE error <> ''")
            while chunk := cursor.fetchmany(10_000):
                errors.extend(n << 32 | _crc(e) for n, e in chunk)
        errors = array("q", sorted(errors))
        with self.lock:
            self.known, self.known_errors = numbers, errors
            self.progress.known_loaded = True

    def _needed(self, number: int, values: dict[str, Any]) -> dict[str, Any]:
        """What of a row taken before the database's rows were known it does not hold yet."""
        values = dict(values)
        if "error" in values:
            error = values["error"]
            if self._error_in_db(number) == (_crc(error) if error else None):
                del values["error"]
        if "made" in values and self._in_db(number, values["made"], bool(values.get("ark"))):
            for name in ("made", *TEXT_FIELDS):
                values.pop(name, None)
        return values

    def _take_batch(self) -> list[tuple[int, dict[str, Any]]]:
        with self.lock:
            batch: list[tuple[int, dict[str, Any]]] = []
            while self.pending and len(batch) < WRITE_BATCH:
                number = next(iter(self.pending))
                values = self._needed(number, self.pending.pop(number))
                if values:
                    batch.append((number, values))
                    self.writing_rows[number] = values
            self.progress.waiting = len(self.pending)
            return batch

    def _write(self, batch: list[tuple[int, dict[str, Any]]]) -> None:
        groups: dict[tuple[str, ...], list[Row]] = {}
        for number, values in batch:
            columns = tuple(sorted(values))
            groups.setdefault(columns, []).append(Row(number=number, **values))
        with transaction.atomic():
            for columns, rows in groups.items():
                Row.objects.bulk_create(
                    rows, update_conflicts=True, unique_fields=["number"], update_fields=columns
                )

    def _write_loop(self) -> None:
        backoff = 0.5
        said = 0  # the count of rows written last said in the log
        while not self.stopped.is_set():
            try:
                if self.known is None:
                    self._load_known()
                with self.writing:  # taken and written as one, for ``flush``
                    batch = self._take_batch()
                    if batch:
                        try:
                            self._write(batch)
                        except BaseException:
                            with self.lock:  # back in line, newer values first
                                for number, values in batch:
                                    newer = self.pending.get(number, {})
                                    self.pending[number] = {**values, **newer}
                                    self.writing_rows.pop(number, None)
                            raise
                if not batch:
                    if not self._read_missed():
                        self.progress.reason = ""
                        if self.progress.written != said:
                            said = self.progress.written
                            log.info(
                                "search text index: caught up, %s jobs written since the start",
                                f"{said:,}",
                            )
                        self.wake.wait(5.0)
                        self.wake.clear()
                    continue
                self._written(batch)
                backoff = 0.5
                self.progress.reason = ""
            except Exception as exc:
                self.progress.reason = transient.reason(exc) or str(exc)[:200]
                log.warning("search text index: cannot write (%s); trying again", exc)
                try:  # a broken connection is opened afresh on the next try
                    connection.close()
                except Exception as closing:
                    log.debug("search text index: closing the connection: %s", closing)
                self.stopped.wait(backoff)
                backoff = min(MAX_BACKOFF, backoff * 2)
        connection.close()

    def _written(self, batch: list[tuple[int, dict[str, Any]]]) -> None:
        with self.lock:
            for number, values in batch:
                self.writing_rows.pop(number, None)
                if "made" in values:
                    has_ark = bool(values.get("ark"))
                    self.fresh.add(_known_key(number, values["made"], has_ark))
                if "error" in values:
                    error = values["error"]
                    self.fresh_errors[number] = _crc(error) if error else None
            self._merge_fresh()
            self.progress.written += len(batch)
            self.progress.waiting = len(self.pending)

    def write_pending(self) -> int:
        """Write every row taken so far on the calling thread's connection (in its
        transaction), not the writer's; how many. For a process that starts no writer (tests
        that measure pages inside one transaction)."""
        count = 0
        with self.writing:
            while batch := self._take_batch():
                self._write(batch)
                self._written(batch)
                count += len(batch)
        return count

    def _read_missed(self) -> bool:
        """Read again from ZooKeeper a chunk of the jobs whose texts did not fit in memory;
        False when there were none."""
        with self.lock:
            if not self.missed and not self.missed_errors:
                return False
            free = max(0, MAX_PENDING - len(self.pending))
            take = min(READ_BATCH, free)
            if take == 0:
                return False
            numbers = list(self.missed[:take])
            del self.missed[:take]
            failed = list(self.missed_errors[:take])
            del self.missed_errors[:take]
        jids = [f"jid{n:010d}" for n in numbers]
        node = zpaths.job_node
        wanted = [node(j, name) for j in jids for name in ("configuration", "identifiers")]
        wanted += [node(f"jid{n:010d}", "status") for n in failed]
        reads = read_many(self.idx.zk, wanted)

        def json_of(path: str) -> dict[str, Any]:
            read = reads.get(path)
            if read is None:
                return {}
            try:
                value = decode_json(path, read[0])
            except MalformedNode:
                return {}
            return value if isinstance(value, dict) else {}

        texts = []
        for number, jid in zip(numbers, jids, strict=True):
            config = json_of(node(jid, "configuration"))
            if config:
                made = reads[node(jid, "configuration")][1].ctime  # type: ignore[index]
                ids = json_of(node(jid, "identifiers"))
                texts.append(zindex.job_text(number, config, ids, made))
        messages = []
        for number in failed:
            status = json_of(node(f"jid{number:010d}", "status"))
            if status:
                message = status.get("message")
                messages.append((number, message if isinstance(message, str) else ""))
        self.take_texts(texts)
        self.take_errors(messages)
        return True

    # The feeder: the read index's watches, then a sync -----------------------------------------

    def _feed(self) -> None:
        changed = self.idx.jobs_changed
        while not self.stopped.is_set():
            changed.wait()
            if self.stopped.wait(settings.MRT_SEARCH_FEED_SECONDS):
                return
            changed.clear()
            if self.idx.filling:
                continue  # the fill reads every job itself
            try:
                self.idx.sync()  # reads what is new; the sinks take its texts
            except Exception as exc:  # ZooKeeper away: the next watch event tries again
                log.info("search text index: cannot read the queue now (%s)", exc)

    # Reading ----------------------------------------------------------------------------------

    def status(self) -> str:
        """What is not in the database yet, for pages; "" when nothing."""
        p = self.progress
        parts = []
        if self.threads and not p.known_loaded:
            parts.append("the search text index has not been read yet")
        if p.waiting or p.missed:
            parts.append(
                f"search texts: {p.written:,} written since the start, "
                f"{p.waiting + p.missed:,} jobs still to write"
            )
        if p.reason:
            parts.append(f"the search text index cannot be written now: {p.reason}")
        return "; ".join(parts)

    def pending_matching(self, fields: Iterable[str], folded: str) -> dict[int, dict[str, Any]]:
        """Rows not written yet (waiting, or in a batch being written) whose ``fields`` hold
        ``folded`` (case-folded). Read before the database is, so a row committed in between is
        met twice (the search lists it once), never not at all."""
        wanted = list(fields)
        with self.lock:
            rows = {n: dict(v) for n, v in self.writing_rows.items()}
            for n, v in self.pending.items():
                rows[n] = {**rows.get(n, {}), **v}
        return {
            n: v
            for n, v in rows.items()
            if any(folded in str(v.get(f, "")).casefold() for f in wanted)
        }

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every row taken so far is written (tests); False at the deadline."""
        deadline = time.monotonic() + timeout
        self.wake.set()
        while time.monotonic() < deadline:
            with self.lock:
                empty = not self.pending and not self.missed and not self.missed_errors
            if empty and not self.writing.locked():
                return True
            self.wake.set()
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        self.stopped.set()
        self.wake.set()
        self.idx.jobs_changed.set()
        if self.idx.text_sink == self.take_texts:
            self.idx.text_sink = None
        if self.take_statuses in self.idx.status_sinks:
            self.idx.status_sinks.remove(self.take_statuses)


_feeds: dict[int, Feed] = {}
_feeds_lock = threading.Lock()


def feed_for(idx: zindex.ReadIndex, *, start: bool = False) -> Feed:
    """The feed of ``idx``; ``start``: with its writer and feeder running.

    The web process starts them with its read index's fill (``queues/web/warmup.py``); a search
    only attaches the sinks if they are not there, so a process that never warmed up (a
    management command, a test through Django's client) searches what the database holds and
    the rows read since, and writes nothing from threads of its own."""
    with _feeds_lock:
        feed = _feeds.get(id(idx))
        if feed is None or feed.idx is not idx:
            if feed is not None:
                feed.stop()
            feed = _feeds[id(idx)] = Feed(idx, start=False)
    if start:
        feed.start()
    return feed


def attach(idx: zindex.ReadIndex) -> None:
    """Hand what ``idx`` reads to a feed from its first read on (``zindex.NEW_INDEX_HOOKS``)."""
    feed_for(idx)


def reset() -> None:
    """Stop every feed (tests)."""
    with _feeds_lock:
        for feed in _feeds.values():
            feed.stop()
        _feeds.clear()


# Queries ----------------------------------------------------------------------------------------


def _like(folded: str) -> str:
    escaped = folded.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _check(fields: list[str]) -> None:
    """Refuse what is not a column of ``FIELDS``: the names are written into the statements."""
    if not fields or not set(fields) <= set(FIELDS):
        raise ValueError(f"not fields of the text index: {fields!r}")


def _where(fields: list[str], text: str) -> tuple[str, str, list[Any]]:
    """The table, the condition and its parameters of a search for ``text`` in ``fields``
    (column names of ``FIELDS`` only: they are written into the statement; the text is a
    parameter)."""
    _check(fields)
    if connection.vendor == "sqlite":
        if len(text) >= SHORTEST_INDEXED:
            return (
                "queues_jobtext_fts",
                "queues_jobtext_fts MATCH %s",
                ["{" + " ".join(fields) + "} : " + _quoted(text)],
            )
        # Shorter than a trigram: a scan of the table (newest first, it stops at a page).
        ors = " OR ".join(f"{f} LIKE %s ESCAPE '\\'" for f in fields)
        return "queues_jobtext_fts", f"({ors})", [_like(text)] * len(fields)
    ors = " OR ".join(f"{f} ILIKE %s ESCAPE '\\'" for f in fields)
    return "queues_jobtext", f"({ors})", [_like(text)] * len(fields)


def _key() -> str:
    return "rowid" if connection.vendor == "sqlite" else "number"


# SQLite's phrase query reads the whole list of rows of every trigram of the text: an ARK or a
# file name holds trigrams that every row holds ("ark", "jid", ".bi"), and at 1,000,000 rows
# such a search took 30-50 ms of the database where the same answer took 1 ms at 1,000. A
# text at least ``RARE_FROM`` long is first looked for through trigrams of it that few rows
# hold: the two richest in digits, apart from each other, tried at once (``_guessed``);
# failing that, up to ``RARE_PROBES`` probed, each with a count that stops at ``RARE_AT_MOST``, the
# likeliest rare first (most digits, then the last); two that do not overlap, and a third
# apart from both, taken (``_apart``: overlapping ones, "718" and "189", are in nearly the
# same rows); and the rows holding them all, when they are few, checked for the whole text
# here. A text without two such trigrams, or with too many rows holding them, is a phrase
# query. At 1,000,000 rows a three-digit trigram is in about 4,000 rows: an ARK, a file name
# or a local ID was found in 5-7 ms this way, against 26-47 ms by its phrase.
RARE_FROM = 6
RARE_AT_MOST = 10_000
RARE_PROBES = 8
RARE_ENOUGH = 50  # two trigrams this rare end the probes
RARE_TAKEN = 3  # rare trigrams apart from each other that the rows must all hold
CHECKED_AT_MOST = 100  # rows holding the rare trigrams checked here for the whole text


def _rare_rows(fields: list[str], text: str) -> list[tuple[int, dict[str, Any]]] | None:
    """The rows whose ``fields`` hold ``text``, newest first, found through its rarest trigrams
    that do not overlap (two or three); None where that does not apply (PostgreSQL, a short
    text, no two such trigrams, too many rows holding them).

    The trigrams richest in digits are tried first without a count (``_guessed``): an ID's
    digits are rare, and their rows are found by one query instead of up to ``RARE_PROBES``
    counts and one (at 1,000,000 rows each count read about 8,000 rows of a three-digit
    trigram; those counts were a third of a warm search by ARK)."""
    if connection.vendor != "sqlite" or len(text) < RARE_FROM:
        return None
    _check(fields)
    seen: set[str] = set()
    trigrams = []
    for i in range(len(text) - 2):
        piece = text[i : i + 3]
        if piece.casefold() not in seen:
            seen.add(piece.casefold())
            trigrams.append((-sum(c.isdigit() for c in piece), -i, piece))
    trigrams.sort()
    with connection.cursor() as cursor:
        guess = _guessed(trigrams)
        rows = _holding_all(cursor, fields, guess) if guess else None
        if rows is None:
            rows = _holding_all(cursor, fields, _probed(cursor, trigrams))
    if rows is None:
        return None
    folded = text.casefold()
    found = []
    for number, *values in rows:
        row = dict(zip(FIELDS, values, strict=True))
        if any(folded in (row[f] or "").casefold() for f in fields):
            found.append((number, row))
    return found


def _guessed(trigrams: list[tuple[int, int, str]]) -> list[str]:
    """Of (-digits, -where, trigram), most digits first: the first two apart from each other
    with at least two digits each, or none. Two, not three: a third is often a run of an ID's
    leading zeros ("000"), which every row of a large queue holds."""
    taken: list[tuple[int, str]] = []
    for digits, at, piece in trigrams:
        if -digits < 2 or len(taken) >= 2:
            break
        if all(abs(at - other) >= 3 for other, _p in taken):
            taken.append((at, piece))
    return [piece for _at, piece in taken] if len(taken) >= 2 else []


def _probed(cursor: Any, trigrams: list[tuple[int, int, str]]) -> list[str]:
    """The rare trigrams apart from each other (``_apart``) among the first ``RARE_PROBES``,
    each counted up to ``RARE_AT_MOST``; the probes end at two apart in at most
    ``RARE_ENOUGH`` rows."""
    held: list[tuple[int, int, str]] = []  # (rows holding it, where, trigram): the rare ones
    for _digits, at, piece in trigrams[:RARE_PROBES]:
        cursor.execute(
            "SELECT count(*) FROM (SELECT 1 FROM queues_jobtext_fts "
            "WHERE queues_jobtext_fts MATCH %s LIMIT %s)",
            [_quoted(piece), RARE_AT_MOST + 1],
        )
        rows_holding = cursor.fetchone()[0]
        if rows_holding <= RARE_AT_MOST:
            held.append((rows_holding, -at, piece))
        if len(_apart([h for h in held if h[0] <= RARE_ENOUGH])) >= 2:
            break
    rare = _apart(held)
    return rare if len(rare) >= 2 else []


def _holding_all(cursor: Any, fields: list[str], pieces: list[str]) -> list[tuple[Any, ...]] | None:
    """The rows whose ``fields`` hold every one of ``pieces``, newest first; None when there
    are none to ask for or more than ``CHECKED_AT_MOST`` (too many to check here)."""
    if not pieces:
        return None
    both = "{" + " ".join(fields) + "} : (" + " AND ".join(map(_quoted, pieces)) + ")"
    cursor.execute(
        f"SELECT rowid, {', '.join(FIELDS)} FROM queues_jobtext_fts "  # noqa: S608 (names ours)
        "WHERE queues_jobtext_fts MATCH %s ORDER BY rowid DESC LIMIT %s",
        [both, CHECKED_AT_MOST + 1],
    )
    rows = cursor.fetchall()
    return None if len(rows) > CHECKED_AT_MOST else rows


def _apart(held: list[tuple[int, int, str]]) -> list[str]:
    """Of (rows holding it, where, trigram): the two that do not overlap with the fewest rows
    between them, then the rarest apart from both (``RARE_TAKEN``). Overlapping trigrams,
    "718" and "189", are in nearly the same rows, and many rows hold both; the rarest two
    often overlap where only six characters vary (an ID's last digits)."""
    pairs = [(x[0] + y[0], x, y) for x, y in combinations(sorted(held), 2) if abs(x[1] - y[1]) >= 3]
    if not pairs:
        return []
    _sum, first, second = min(pairs)
    taken = [first, second]
    for other in sorted(held):
        if len(taken) >= RARE_TAKEN:
            break
        if all(abs(other[1] - t[1]) >= 3 for t in taken):
            taken.append(other)
    return [piece for _n, _at, piece in taken]


def _quoted(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


class Search:
    """One search of the text index: the rows whose ``fields`` hold ``text`` (any case) and how
    many, its rare trigrams (``_rare_rows``) probed once for both."""

    def __init__(self, fields: list[str], text: str) -> None:
        self.fields = fields
        self.text = text
        self._rare: list[tuple[int, dict[str, Any]]] | None = None
        self._rare_known = False

    def _rare_rows(self) -> list[tuple[int, dict[str, Any]]] | None:
        if not self._rare_known:
            self._rare = _rare_rows(self.fields, self.text)
            self._rare_known = True
        return self._rare

    def rows(self, *, chunk: int = 200) -> Iterator[tuple[int, dict[str, Any]]]:
        """The matching rows, newest job first, read a chunk at a time as they are asked for:
        (number, {field: value})."""
        rare = self._rare_rows()
        if rare is not None:
            yield from rare
            return
        table, where, params = _where(self.fields, self.text)
        key = _key()
        below: int | None = None
        columns = ", ".join(FIELDS)
        while True:
            more = f" AND {key} < %s" if below is not None else ""
            sql = (
                f"SELECT {key}, {columns} FROM {table} WHERE {where}{more} "  # noqa: S608 (names ours)
                f"ORDER BY {key} DESC LIMIT %s"
            )
            with connection.cursor() as cursor:
                cursor.execute(sql, [*params, *([below] if below is not None else []), chunk])
                rows = cursor.fetchall()
            for number, *values in rows:
                yield number, dict(zip(FIELDS, values, strict=True))
            if len(rows) < chunk:
                return
            below = rows[-1][0]

    def count(self, cap: int | None = None) -> int:
        """How many rows match, counted up to ``cap`` + 1 (``COUNT_CAP`` unless told)."""
        cap = COUNT_CAP if cap is None else cap
        rare = self._rare_rows()
        if rare is not None:
            return min(len(rare), cap + 1)
        table, where, params = _where(self.fields, self.text)
        sql = f"SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {where} LIMIT %s) AS found"  # noqa: S608
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, cap + 1])
            (found,) = cursor.fetchone()
        return int(found)


def matching(fields: list[str], text: str, *, chunk: int = 200) -> Iterator[tuple[int, dict]]:
    """``Search(fields, text).rows()``: the rows matching, newest job first."""
    return Search(fields, text).rows(chunk=chunk)


def count(fields: list[str], text: str, cap: int | None = None) -> int:
    """``Search(fields, text).count(cap)``."""
    return Search(fields, text).count(cap)


def forget(numbers: Iterable[int]) -> None:
    """Take away the rows of jobs gone from ZooKeeper (a search met them)."""
    gone = list(numbers)
    if gone:
        Row.objects.filter(number__in=gone).delete()
