"""The console's search: one box that finds jobs and batches, live and archived, by what an
operator remembers of them, in any case; a single exact match opens the item.

What each field searches, and where (each request costs the same at 1,000 or 1,000,000 jobs:
nothing here walks every job in ZooKeeper):

- **IDs.** A job ID (``jid`` and digits) or batch ID (``bid`` and digits) by prefix: a job ID
  prefix is a range of job numbers, found by bisection in the read index's state listings
  (``jid00012`` finds every job from ``jid0001200000`` to ``jid0001299999``); batch IDs and a
  batch's own ID (Merritt's ``bid-…`` or a UUID) by prefix among the live batches, whose
  submissions are read once each. ARK and local ID exactly (any case) through the read index's
  map of every live job's keys, and by a part of them in the database's text index.
- **Submitter**: a part of it, over every live job (the read index's table of distinct
  collection/submitter pairs) and every live batch.
- **Title and file name**: a part of them, over every live batch and every live job (the
  database's text index, ``queues/console/jobtext.py``: an FTS5 trigram table on SQLite, ``pg_trgm``
  on PostgreSQL, fed from what the read index reads as its watches show new jobs).
- **Error text**: a part of it, in the message every live job last failed with (the text
  index, fed as the read index reads jobs new in Failed), of every Failed batch, and in the
  step history's failures (``StepRecord.detail``, kept ``MRT_STEP_HISTORY_DAYS``).
- **Archived** jobs and batches (``queues/operator/archive.py``): every field, in the database.
- **Dates**: created, or last changed (finished, failed, or any other move), between two days;
  checked for the ``DATE_CHECKED`` newest live matches of each kind (the page says when there
  were more) and for every archived one.

The text index's matches are read newest first a chunk at a time, as a page needs them, each
checked to be still listed in a state folder (a row of a job gone is taken away), and counted
up to ``COUNT_CAP``. A text of three characters or more is found through the index; a shorter
one is a scan of the table (SQLite) that stops at a page of matches.

Each kind of result (live jobs, live batches, archived jobs, archived batches) is paged on its
own, newest first; the page says what was searched where it is less than everything.

The batches' texts searched by a part (every live batch's fields) are prepared once per
change of the read index's listings they come from, as case-folded lines in one string
(``_Lines``): a search finds the lines holding its text with ``str.find`` and tries only
those, and reads a page of results off the first of them (``tests/scale/test_search_flat.py``).
On a queue that changes between two searches, the first search after the change prepares the
lines again.

Why one module (about 1,060 lines), for now: the four kinds of result share the parsed query,
the paging and the constants the tests lower on this module (``PER_PAGE``, ``COUNT_CAP``,
``DATE_CHECKED``). A split by kind (live jobs about 350 lines, live batches 200, archived 100)
is possible and not done yet.
"""

from __future__ import annotations

import heapq
import re
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from itertools import islice
from typing import Any

from django.urls import reverse
from django.utils import timezone

from queues.console import jobtext, submissions
from queues.core.per_key import PerKey
from queues.core.states import JOB, BatchState
from queues.core.words import digits
from queues.operator import archive
from queues.zk import index as zindex
from queues.zk import packed
from queues.zk import paths as zpaths
from queues.zk.batches import batches_load
from queues.zk.client import connected_client
from queues.zk.jobs import jobs_load
from queues.zk.nodes import json_objects, read_many, stamp
from queues.zk.records import Batch, Broken, Job, text_field

PER_PAGE = 25
MAX_TEXT = 300  # the header box's maxlength
MIN_TEXT = 2
MAX_PAGE = 10_000
# Said while the read index fills after a start: jobs are searched in the database's text
# index, which lacks only what was made or failed while no console ran.
LOADING_NOTE = (
    "the read index is still loading: batch fields are searched once it has loaded, and jobs "
    "made or failed while no console ran once their texts are read"
)
# Matches of the database's text index counted at most (a page then says "more than").
COUNT_CAP = 10_000
# Live matches of each kind whose times are read for a date range.
DATE_CHECKED = 2000
# Step-history failures taken, newest first.
HISTORY_TAKEN = 500
# Candidates of an exact ARK or local ID lookup whose nodes are read to confirm it.
KEY_CANDIDATES = 2000
# Lines holding a search's text tried one by one; more are counted by a pattern in C.
LOOK_AT_MOST = 200

FIELDS: dict[str, str] = {
    "id": "IDs (job, batch, ARK, local ID)",
    "submitter": "submitter",
    "title": "title",
    "filename": "file name",
    "error": "error text",
}
DATE_OF = {"created": "created", "changed": "last changed"}
SECTIONS = {
    "jobs": "Jobs",
    "batches": "Batches",
    "archived-jobs": "Archived jobs",
    "archived-batches": "Archived batches",
}

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_JID_PART = re.compile(r"jid([0-9]{1,10})")
_BID_PART = re.compile(r"bid[0-9]{0,10}")
_PRIO = packed.PRIO_BITS


class BadSearch(ValueError):
    """A search the console will not run (shown with the form, 400)."""


@dataclass(frozen=True)
class Query:
    text: str = ""
    scope: str = ""  # the field searched: "" every field, else a key of FIELDS
    since: datetime | None = None
    until: datetime | None = None  # exclusive: the start of the day after the one asked
    date_of: str = "created"
    pages: Mapping[str, int] = field(default_factory=dict)

    @property
    def folded(self) -> str:
        return self.text.casefold()

    @property
    def dated(self) -> bool:
        return self.since is not None or self.until is not None

    @property
    def until_day(self) -> datetime | None:
        """The last day of the range, as asked."""
        return None if self.until is None else self.until - timedelta(days=1)

    def wants(self, name: str) -> bool:
        return not self.scope or self.scope == name

    def page(self, section: str) -> int:
        return self.pages.get(section, 1)

    def in_range(self, created: datetime | None, changed: datetime | None) -> bool:
        moment = created if self.date_of == "created" else changed
        if moment is None:
            return False
        if self.since is not None and moment < self.since:
            return False
        return self.until is None or moment < self.until


def _day(params: Mapping[str, str], name: str) -> date | None:
    value = (params.get(name) or "").strip()
    if not value:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise BadSearch(f"{name}: {value[:40]!r} is not a day (YYYY-MM-DD)") from None


def _start_of(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=timezone.get_current_timezone())


def parse(params: Mapping[str, str]) -> Query:
    """The search a request asks for; BadSearch for input it refuses."""
    raw = params.get("q") or ""
    if len(raw) > MAX_TEXT:
        raise BadSearch(f"the search is {len(raw):,} characters long; at most {MAX_TEXT}")
    text = raw.strip()
    if _CONTROL.search(text):
        raise BadSearch("the search holds control characters")
    name = params.get("field") or ""
    if name and name not in FIELDS:
        raise BadSearch(f"field: {name[:40]!r} is not one of {', '.join(FIELDS)}")
    date_of = params.get("date_of") or "created"
    if date_of not in DATE_OF:
        raise BadSearch(f"date_of: {date_of[:40]!r} is not one of {', '.join(DATE_OF)}")
    since, until = _day(params, "since"), _day(params, "until")
    if since and until and until < since:
        raise BadSearch("the range ends before it starts")
    pages = {}
    for section in SECTIONS:
        value = params.get(f"page_{section}") or "1"
        page = digits(value)
        if page is None or not 1 <= page <= MAX_PAGE:
            raise BadSearch(f"page_{section}: {value[:20]!r} is not a page number")
        pages[section] = page
    return Query(
        text=text,
        scope=name,
        since=_start_of(since) if since else None,
        until=_start_of(until + timedelta(days=1)) if until else None,
        date_of=date_of,
        pages=pages,
    )


# Results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    kind: str  # "job" | "batch"
    id: str
    archived: bool
    state: str
    bid: str  # a job's batch; "" for a batch
    collection: str
    submitter: str
    title: str
    why: list[tuple[str, str]]  # (field, the value that matched)
    created: datetime | None
    changed: datetime | None
    broken: str = ""  # why its nodes could not be read

    @property
    def url(self) -> str:
        return reverse("job" if self.kind == "job" else "batch", args=[self.id])


@dataclass(frozen=True)
class Section:
    key: str
    rows: list[Row]
    total: int
    page: int
    notes: list[str]

    @property
    def title(self) -> str:
        return SECTIONS[self.key]

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // PER_PAGE))

    @property
    def has_next(self) -> bool:
        return self.page * PER_PAGE < self.total

    @property
    def has_previous(self) -> bool:
        return self.page > 1


@dataclass(frozen=True)
class Results:
    query: Query
    sections: list[Section]
    opens: str  # the page of the single exact match, "" when there is none
    loading: str  # what the read index is still reading after a start

    @property
    def total(self) -> int:
        return sum(s.total for s in self.sections)


# Searched lines ---------------------------------------------------------------------------------

_SEP = "\x1f"  # between the fields of a line; no search holds it (control characters refused)
_NL = "\n"  # before every line


def _clean(value: str) -> str:
    return value.casefold().replace(_NL, " ").replace(_SEP, " ")


@dataclass(frozen=True)
class _Lines:
    """The searched texts of many items, prepared once: one string of case-folded lines, one
    an item in the order results are shown (newest first), fields apart, so a search is one
    regular expression run over it in C (``_pattern``) instead of a Python loop per item, and
    a page of results is read off its first matches."""

    items: list[Any]  # each line's item (a job number, a batch ID)
    texts: list[tuple[str, ...]]  # each line's fields as written (to say what matched)
    blob: str
    starts: array[int]  # where each line's newline is in ``blob``
    line_of: dict[Any, int]

    @classmethod
    def of(cls, items: Sequence[Any], texts: Sequence[tuple[str, ...]]) -> _Lines:
        parts, starts, at = [], array("q"), 0
        for fields in texts:
            line = _NL + _SEP.join(_clean(f) for f in fields)
            starts.append(at)
            at += len(line)
            parts.append(line)
        line_of = {item: i for i, item in enumerate(items)}
        return cls(list(items), list(texts), "".join(parts), starts, line_of)

    def count(self, match: _Match) -> int:
        """How many lines match: those holding the text looked at one by one when they are
        few, else counted by the pattern in C (a match never spans two lines)."""
        if self.blob.count(match.needle, 0) <= LOOK_AT_MOST:
            return sum(1 for _ in self.matching(match))
        return len(match.regex.findall(self.blob))

    def matching(self, match: _Match) -> Iterator[Any]:
        """The items of the matching lines, in order, found as they are asked for: only the
        lines holding the text (found by ``str.find``) are tried."""
        blob, starts, items, regex = self.blob, self.starts, self.items, match.regex
        end = len(starts)
        at = blob.find(match.needle)
        while at >= 0:
            i = bisect_right(starts, at) - 1
            if regex.match(blob, starts[i]):
                yield items[i]
            if i + 1 >= end:
                return
            at = blob.find(match.needle, starts[i + 1])

    def matches(self, item: Any, match: _Match) -> bool:
        i = self.line_of.get(item)
        return i is not None and match.regex.match(self.blob, self.starts[i]) is not None

    def texts_of(self, item: Any) -> tuple[str, ...] | None:
        i = self.line_of.get(item)
        return None if i is None else self.texts[i]


@dataclass(frozen=True)
class _Match:
    needle: str  # the case-folded text: a line that matches holds it
    regex: re.Pattern[str]  # the fields it must be in, matched from a line's start


def _pattern(folded: str, contains: Iterable[int] = (), starts: Iterable[int] = ()) -> Any:
    """A match of a line whose field ``i`` contains ``folded`` (for ``i`` in ``contains``)
    or starts with it (``starts``); None when no field is searched."""
    needle = re.escape(folded)
    ways = [f"(?:[^{_SEP}{_NL}]*{_SEP}){{{i}}}[^{_SEP}{_NL}]*?{needle}" for i in contains]
    ways += [f"(?:[^{_SEP}{_NL}]*{_SEP}){{{i}}}{needle}" for i in starts]
    return _Match(folded, re.compile(f"{_NL}(?:{'|'.join(ways)})")) if ways else None


# What is kept between searches, per read index ------------------------------------------------


class _Kept:
    """Texts read for earlier searches: what never changes is read once (a job's title, file
    name and local ID; a batch's submission, in ``submissions``), the rest again when its
    listing or status did.
    The searched lines (``_Lines``) are prepared from them once per change of the read index's
    listings they come from, not per search."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batch_messages: dict[str, tuple[int, str]] = {}  # bid -> (status mtime, message)
        # Every live batch's lines, for this batch list and these batch states.
        self.batch_lines: tuple[list[str], Any, _Lines] | None = None


_kept_for: PerKey[zindex.ReadIndex, _Kept] = PerKey(lambda _idx: _Kept())


def _json_chunks(zk: Any, wanted: list[str]) -> Iterator[dict[str, tuple[dict[str, Any], Any]]]:
    """``nodes.json_objects`` in the read index's chunks. (The 20,000 batches' submissions of a
    million-job queue, decoded and held at once with their stats, were about 36 MB for a
    moment, and the process stayed that much larger after its first search.)"""
    return json_objects(zk, wanted, zindex.READ_CHUNK)


def _json_reads(zk: Any, wanted: list[str]) -> dict[str, tuple[dict[str, Any], Any]]:
    """``_json_chunks``' nodes all together (for a few nodes)."""
    found: dict[str, tuple[dict[str, Any], Any]] = {}
    for chunk in _json_chunks(zk, wanted):
        found.update(chunk)
    return found


# Live jobs --------------------------------------------------------------------------------------


def _desc(keys: array[int], lo: int, hi: int) -> Iterator[int]:
    """Job numbers of by-age keys ``keys[lo:hi]``, newest first."""
    return (keys[i] >> _PRIO for i in range(hi - 1, lo - 1, -1))


def _unique(numbers: Iterable[int]) -> Iterator[int]:
    last = -1
    for n in numbers:
        if n != last:
            yield n
            last = n


# The database's text index names a field by its column; a match says it by these names.
_DB_FIELDS = {
    "title": "title",
    "filename": "file name",
    "submitter": "submitter",
    "local_ids": "local ID",
    "ark": "ARK",
    "error": "error",
}


@dataclass
class _Texts:
    """Live jobs whose texts in the database's text index (``queues/console/jobtext.py``) hold the
    search's text in ``fields``, newest first, with the rows the feed has not written yet;
    rows of jobs no longer listed in any state folder are taken away as they are met."""

    idx: zindex.ReadIndex
    fields: list[str]
    text: str
    pending: dict[int, dict[str, Any]]
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)  # rows met, by job number
    gone: int = 0
    capped: bool = False
    _count: int | None = None
    _search: jobtext.Search | None = None

    @property
    def search(self) -> jobtext.Search:
        """The text index's search, its rare trigrams probed once for the count and the rows."""
        if self._search is None:
            self._search = jobtext.Search(self.fields, self.text)
        return self._search

    def _live(self, chunk: list[tuple[int, dict[str, Any]]]) -> list[int]:
        jids = {f"jid{n:010d}": n for n, _v in chunk}
        live = self.idx.job_states_of(jids)
        dead = [n for j, n in jids.items() if j not in live]
        if dead:
            self.gone += len(dead)
            jobtext.forget(dead)
        found = []
        for n, values in chunk:
            if f"jid{n:010d}" in live:
                self.rows[n] = values
                found.append(n)
        return found

    def _from_db(self) -> Iterator[int]:
        chunk: list[tuple[int, dict[str, Any]]] = []
        for item in self.search.rows():
            chunk.append(item)
            if len(chunk) >= 100:
                yield from self._live(chunk)
                chunk = []
        if chunk:
            yield from self._live(chunk)

    def matching(self) -> Iterator[int]:
        newest = sorted(self.pending, reverse=True)
        waiting = self._live([(n, self.pending[n]) for n in newest]) if newest else []
        return _unique(heapq.merge(self._from_db(), waiting, reverse=True))

    def count(self) -> int:
        """How many rows match, the rows not written yet counted; at most ``COUNT_CAP``
        (``capped`` says whether there were more)."""
        if self._count is None:
            found = self.search.count(COUNT_CAP) + len(self.pending)
            self.capped = found > COUNT_CAP
            self._count = min(found, COUNT_CAP)
        return self._count

    def matches(self, number: int) -> bool:
        values = self.rows.get(number) or self.pending.get(number)
        if values is None:
            found = jobtext.Row.objects.filter(number=number).values(*jobtext.FIELDS).first()
            values = self.rows[number] = found or {}
        folded = self.text.casefold()
        return any(folded in (values.get(f) or "").casefold() for f in self.fields)

    def why(self, number: int) -> list[tuple[str, str]]:
        if not self.matches(number):
            return []
        folded = self.text.casefold()
        found = []
        for name in self.fields:
            values = self.rows.get(number) or self.pending.get(number) or {}
            for value in str(values.get(name) or "").split("\n"):
                if value and folded in value.casefold():
                    found.append((_DB_FIELDS[name], value))
        return found


@dataclass
class _Jobs:
    """Live jobs found: many at once as runs of a listing's by-age keys (a job ID prefix, a
    submitter), as the matches of the database's text index (newest first), the others one
    by one with the fields they matched."""

    runs: list[tuple[array[int], int, int]] = field(default_factory=list)
    runs_why: str = ""
    texts: _Texts | None = None
    one: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    exact: set[int] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    overlap: bool = False

    def add(self, number: int, why: str, value: str) -> None:
        found = self.one.setdefault(number, [])
        if (why, value) not in found:
            found.append((why, value))

    def in_runs(self, number: int) -> bool:
        key = number << _PRIO
        for keys, lo, hi in self.runs:
            i = bisect_left(keys, key, lo, hi)
            if i < hi and keys[i] >> _PRIO == number:
                return True
        return False

    def count(self) -> int:
        """How many jobs were found, each once: the runs' lengths, and the text index's
        matches (at most ``COUNT_CAP``) and the single finds not in them. Text matches beside
        runs are looked up in the runs one by one when they are at most ``LOOK_AT_MOST``;
        more are added as counted (``overlap`` says a job may then be counted twice)."""
        extra = set(self.one)
        texts = self.texts
        if self.runs:
            if texts is not None:
                if texts.count() <= LOOK_AT_MOST:
                    extra.update(texts.matching())
                else:
                    self.overlap = True
                    return (
                        sum(hi - lo for _k, lo, hi in self.runs)
                        + texts.count()
                        + sum(1 for n in self.one if not self.in_runs(n))
                    )
            return sum(hi - lo for _k, lo, hi in self.runs) + sum(
                1 for n in extra if not self.in_runs(n)
            )
        if texts is None:
            return len(extra)
        return texts.count() + sum(1 for n in extra if not texts.matches(n))

    def newest(self) -> Iterator[int]:
        parts = [_desc(keys, lo, hi) for keys, lo, hi in self.runs]
        if self.texts is not None:
            parts.append(self.texts.matching())
        parts.append(iter(sorted(self.one, reverse=True)))
        return _unique(heapq.merge(*parts, reverse=True))

    def why(self, number: int) -> list[tuple[str, str]]:
        """What a shown job matched (the runs' field aside)."""
        found = list(self.one.get(number, []))
        if self.texts is not None:
            found += [w for w in self.texts.why(number) if w not in found]
        return found


def _confirmed_keys(zk: Any, jids: list[str], folded: str) -> dict[int, tuple[str, str]]:
    """The jobs among ``jids`` one of whose local IDs or ARK is ``folded`` in any case (the
    read index keeps hashes), each with the field and the value as written."""
    wanted = [zpaths.job_node(j, n) for j in jids for n in ("configuration", "identifiers")]
    reads = _json_reads(zk, wanted)
    found = {}
    for jid in jids:
        config = reads.get(zpaths.job_node(jid, "configuration"))
        ids = reads.get(zpaths.job_node(jid, "identifiers"))
        identifiers = ids[0] if ids else {}
        for key in zindex.search_keys(config[0] if config else {}, identifiers):
            if key.casefold() == folded:
                is_ark = key == text_field(identifiers, "primary_id").strip()
                found[int(jid[3:])] = ("ARK" if is_ark else "local ID", key)
                break
    return found


def _live_jobs(zk: Any, idx: zindex.ReadIndex, kept: _Kept, query: Query) -> _Jobs:
    found = _Jobs()
    text, folded = query.text, query.folded
    id_prefix = _JID_PART.fullmatch(folded)
    states = list(JOB.states)
    if query.wants("id") and id_prefix:
        digits = id_prefix.group(1)
        scale = 10 ** (10 - len(digits))
        lo, hi = int(digits) * scale, (int(digits) + 1) * scale
        for state in states:
            keys = idx.job_entries(state, order="oldest").keys
            a, b = bisect_left(keys, lo << _PRIO), bisect_left(keys, hi << _PRIO)
            if b > a:
                found.runs.append((keys, a, b))
        found.runs_why = "job ID"
        if len(digits) == 10:
            found.exact.add(int(digits))
    if query.wants("id") and not id_prefix:
        jids, _complete = idx.find(text)
        candidates = [j for j in jids if zpaths.JID_RE.fullmatch(j)]
        if len(candidates) > KEY_CANDIDATES:
            found.notes.append(
                f"{len(candidates):,} jobs may carry this ARK or local ID; "
                f"the {KEY_CANDIDATES:,} newest were checked"
            )
            candidates = sorted(candidates)[-KEY_CANDIDATES:]
        for n, (why, value) in _confirmed_keys(zk, candidates, folded).items():
            found.add(n, why, value)
            found.exact.add(n)
    if (
        query.wants("submitter")
        and not (id_prefix and not query.scope)
        and idx.any_submitter_holds(text)  # else no entry to filter for it
    ):
        for state in states:
            entries = idx.job_entries_matching(state, submitter=text, order="oldest")
            if len(entries):
                found.runs.append((entries.keys, 0, len(entries)))
        found.runs_why = found.runs_why or "submitter"
    fields = [
        name
        for name, wanted in (
            ("title", query.wants("title")),
            ("filename", query.wants("filename")),
            ("local_ids", query.wants("id") and not id_prefix),
            ("ark", query.wants("id") and not id_prefix),
            ("error", query.wants("error")),
        )
        if wanted
    ]
    if fields:
        feed = jobtext.feed_for(idx)
        if not idx.filling:
            idx.sync()  # what is new since the last look goes to the feed, searched below
        found.texts = _Texts(idx, fields, text, feed.pending_matching(fields, folded))
        found.texts.count()
        if found.texts.capped:
            found.notes.append(
                f"more than {COUNT_CAP:,} jobs hold this text: {COUNT_CAP:,} counted, "
                "the newest shown first"
            )
        if idx.filling:
            found.notes.append(LOADING_NOTE)
        status = feed.status()
        if status:
            found.notes.append(status)
    if query.wants("error"):
        _history_failures(idx, found, text)
    return found


def _history_failures(idx: zindex.ReadIndex, found: _Jobs, text: str) -> None:
    """Live jobs whose step failed with ``text`` in its detail, from the step history."""
    from queues.models import StepRecord

    rows = (
        StepRecord.objects.filter(kind="job", outcome="failed", detail__icontains=text)
        .order_by("-started")
        .values_list("item_id", "detail")[:HISTORY_TAKEN]
    )
    details: dict[str, str] = {}
    for item_id, detail in rows:
        if zpaths.JID_RE.fullmatch(item_id):
            details.setdefault(item_id, detail)
    for jid in idx.job_states_of(details):  # still live: listed in a state folder
        found.add(int(jid[3:]), "error (step history)", details[jid])


def _status_times(zk: Any, nodes: list[str]) -> dict[str, tuple[datetime, datetime]]:
    """Created and last changed of each item, from its status node's stat."""
    times = {}
    for start in range(0, len(nodes), zindex.READ_CHUNK):
        for path, read in read_many(zk, nodes[start : start + zindex.READ_CHUNK]).items():
            if read is not None:
                times[path] = (stamp(read[1].ctime), stamp(read[1].mtime))
    return times


def _dated(
    zk: Any, query: Query, ids: Iterator[str], total: int, node: Any, kind: str
) -> tuple[list[str], list[str]]:
    """The newest DATE_CHECKED of ``ids`` in the query's range, and a note when there were
    more than were checked."""
    checked = list(islice(ids, DATE_CHECKED))
    times = _status_times(zk, [node(i, "status") for i in checked])
    kept = [i for i in checked if (t := times.get(node(i, "status"))) and query.in_range(*t)]
    notes = []
    if total > DATE_CHECKED:
        notes.append(
            f"the date range was checked on the {DATE_CHECKED:,} newest of {total:,} "
            f"matching {kind}; narrow the search to check them all"
        )
    return kept, notes


def _job_rows(zk: Any, jids: list[str], found: _Jobs) -> list[Row]:
    rows = []
    for item in jobs_load(zk, jids):
        if isinstance(item, Broken):
            rows.append(_broken_row("job", item))
            continue
        why = found.why(int(item.jid[3:])) if item.jid[3:].isdigit() else []
        if found.runs_why and found.in_runs(int(item.jid[3:])):
            value = item.jid if found.runs_why == "job ID" else item.submitter
            why.insert(0, (found.runs_why, value))
        rows.append(_job_row(item, why))
    return rows


def _job_row(job: Job, why: list[tuple[str, str]]) -> Row:
    return Row(
        kind="job",
        id=job.jid,
        archived=False,
        state=job.state,
        bid=job.bid,
        collection=job.profile,
        submitter=job.submitter,
        title=text_field(job.configuration, "title"),
        why=why,
        created=job.created,
        changed=job.status.mtime,
    )


def _broken_row(kind: str, item: Broken) -> Row:
    return Row(kind, item.id, False, "?", "", "", "", "", [], None, None, broken=item.reason)


def _jobs_section(zk: Any, idx: zindex.ReadIndex, kept: _Kept, query: Query) -> Section:
    found = _live_jobs(zk, idx, kept, query)
    page = query.page("jobs")
    start = (page - 1) * PER_PAGE
    notes = list(found.notes)
    if query.dated:
        total = found.count()
        node = zpaths.job_node
        ids = (f"jid{n:010d}" for n in found.newest())
        kept_ids, more = _dated(zk, query, ids, total, node, "jobs")
        notes += more
        shown, total = kept_ids[start : start + PER_PAGE], len(kept_ids)
    else:
        total = found.count()
        shown = [f"jid{n:010d}" for n in islice(found.newest(), start, start + PER_PAGE)]
    if found.overlap:
        notes.append("counted by field: a job that matches in more than one may count twice")
    section = Section("jobs", _job_rows(zk, shown, found), total, page, notes)
    return section


# Live batches -----------------------------------------------------------------------------------


def _batch_texts(zk: Any, bids: list[str]) -> dict[str, submissions.Submission]:
    """Each live batch's searched texts (its submission never changes: read once, and kept
    with the batch list's)."""
    found = submissions.read(zk, bids)
    submissions.forget_gone(zk, zindex.for_client(zk).batch_ids())
    return found


def _batch_messages(zk: Any, idx: zindex.ReadIndex, kept: _Kept) -> dict[str, str]:
    """Status messages of the Failed batches, each read again only when its status changed."""
    failed = {b: s.mtime_ms for b, s in idx.batch_states().items() if s.state == BatchState.FAILED}
    with kept.lock:
        todo = [b for b, m in failed.items() if kept.batch_messages.get(b, (None,))[0] != m]
    bid_of = {zpaths.batch_node(b, "status"): b for b in todo}
    read = dict.fromkeys(todo, "")
    for chunk in _json_chunks(zk, list(bid_of)):
        for path, (status, _stat) in chunk.items():
            read[bid_of[path]] = text_field(status, "message")
    with kept.lock:
        for bid, message in read.items():
            kept.batch_messages[bid] = (failed[bid], message)
        for gone in [b for b in kept.batch_messages if b not in failed]:
            del kept.batch_messages[gone]
        return {b: message for b, (_m, message) in kept.batch_messages.items()}


def _batch_lines(zk: Any, idx: zindex.ReadIndex, kept: _Kept) -> _Lines:
    """Every live batch's searched fields, newest first (ID, its own ID, submitter, title,
    file name, a Failed batch's message), prepared once per change of the batch list or of a
    batch's state."""
    bids = idx.batch_ids()
    states = idx.batch_states()
    with kept.lock:
        kept_lines = kept.batch_lines
        if kept_lines is not None and kept_lines[0] is bids and kept_lines[1] is states:
            return kept_lines[2]
    texts = _batch_texts(zk, bids)
    messages = _batch_messages(zk, idx, kept)
    newest = list(reversed(bids))
    rows = []
    for bid in newest:
        t = texts.get(bid, submissions.NONE)
        rows.append((bid, t.own_id, t.submitter, t.title, t.filename, messages.get(bid, "")))
    lines = _Lines.of(newest, rows)
    if len(texts) >= len(bids):  # a batch whose submission could not be read: read it again
        with kept.lock:
            kept.batch_lines = (bids, states, lines)
    return lines


@dataclass
class _Batches:
    """Live batches found: the matching lines of every live batch's, newest first."""

    lines: _Lines
    pattern: Any  # None when no batch field is searched
    query: Query
    id_like: bool

    def count(self) -> int:
        return 0 if self.pattern is None else self.lines.count(self.pattern)

    def newest(self) -> Iterator[str]:
        return iter(()) if self.pattern is None else self.lines.matching(self.pattern)

    def why(self, bid: str) -> tuple[list[tuple[str, str]], bool]:
        """What a batch matched, and whether it is an exact match of one of its IDs."""
        texts = self.lines.texts_of(bid)
        if texts is None:
            return [], False
        query, folded = self.query, self.query.folded
        _bid, uuid, submitter, title, filename, message = texts
        found: list[tuple[str, str]] = []
        exact = False
        if query.wants("id"):
            if self.id_like and bid.startswith(folded):
                found.append(("batch ID", bid))
                exact = bid == folded
            if uuid and uuid.casefold().startswith(folded):
                found.append(("batch's own ID", uuid))
                exact = exact or uuid.casefold() == folded
        for name, key, value in (
            ("submitter", "submitter", submitter),
            ("title", "title", title),
            ("file name", "filename", filename),
        ):
            if query.wants(key) and folded in value.casefold():
                found.append((name, value))
        if query.wants("error") and message and folded in message.casefold():
            found.append(("error", message))
        return found, exact


def _live_batches(zk: Any, idx: zindex.ReadIndex, kept: _Kept, query: Query) -> _Batches:
    """The live batches matching, found in the prepared lines of every live batch (while the
    read index fills after a start, the batch whose ID was given whole only)."""
    folded = query.folded
    id_like = bool(_BID_PART.fullmatch(folded))
    if idx.filling:
        exact = [folded] if query.wants("id") and zpaths.BID_RE.fullmatch(folded) else []
        texts = _batch_texts(zk, exact) if exact else {}
        rows = [(b, t.own_id, t.submitter, t.title, t.filename, "") for b, t in texts.items()]
        lines = _Lines.of(list(texts), rows)
        return _Batches(lines, _pattern(folded, [], [0]), query, True)
    # Fields: 0 ID, 1 the batch's own ID, 2 submitter, 3 title, 4 file name, 5 error.
    starts = []
    if query.wants("id"):
        starts = [0, 1] if id_like else [1]
    contains = [
        i
        for i, key in ((2, "submitter"), (3, "title"), (4, "filename"), (5, "error"))
        if query.wants(key)
    ]
    if 5 in contains and not folded:
        contains.remove(5)  # a batch without a message has no error text to match
    pattern = _pattern(folded, contains, starts)
    return _Batches(_batch_lines(zk, idx, kept), pattern, query, id_like)


def _batches_section(
    zk: Any, idx: zindex.ReadIndex, kept: _Kept, query: Query
) -> tuple[Section, set[str]]:
    found = _live_batches(zk, idx, kept, query)
    notes: list[str] = [LOADING_NOTE] if idx.filling else []
    page = query.page("batches")
    start = (page - 1) * PER_PAGE
    total = found.count()
    if query.dated:
        bids, notes = _dated(zk, query, found.newest(), total, zpaths.batch_node, "batches")
        total, shown = len(bids), bids[start : start + PER_PAGE]
    else:
        shown = list(islice(found.newest(), start, start + PER_PAGE))
    rows = []
    exact = set()
    for item in batches_load(zk, shown):
        if isinstance(item, Broken):
            rows.append(_broken_row("batch", item))
            continue
        why, is_exact = found.why(item.bid)
        rows.append(_batch_row(item, why))
        if is_exact:
            exact.add(item.bid)
    if total == 1 and not shown:  # the one match is on another page than the one asked
        bid = next(found.newest(), "")
        if bid and found.why(bid)[1]:
            exact.add(bid)
    return Section("batches", rows, total, page, notes), exact


def _batch_row(batch: Batch, why: list[tuple[str, str]]) -> Row:
    return Row(
        kind="batch",
        id=batch.bid,
        archived=False,
        state=batch.state,
        bid="",
        collection=batch.profile,
        submitter=batch.submitter,
        title=batch.title,
        why=why,
        created=batch.created,
        changed=batch.status.mtime,
    )


# Archived ---------------------------------------------------------------------------------------


def _archived_search(query: Query) -> archive.ArchivedSearch:
    return archive.ArchivedSearch(
        text=query.text,
        fields=frozenset({query.scope} if query.scope else ()),
        since=query.since,
        until=query.until,
        date_of=query.date_of,
    )


def _contains(value: str, folded: str) -> bool:
    return folded in value.casefold()


def _archived_job_why(row: Any, query: Query) -> tuple[list[tuple[str, str]], bool]:
    folded = query.folded
    why: list[tuple[str, str]] = []
    exact = False
    if query.wants("id"):
        for name, value in (("job ID", row.jid), ("ARK", row.primary_id)):
            if value and value.casefold().startswith(folded):
                why.append((name, value))
                exact = exact or value.casefold() == folded
        for value in row.local_ids or []:
            if isinstance(value, str) and value.casefold().startswith(folded):
                why.append(("local ID", value))
                exact = exact or value.casefold() == folded
    configuration = (row.nodes or {}).get("configuration") or {}
    filename = text_field(configuration, "filename") if isinstance(configuration, dict) else ""
    for name, field_name, value in (
        ("submitter", "submitter", row.submitter),
        ("title", "title", row.title),
        ("file name", "filename", filename),
        ("error", "error", row.final_message),
    ):
        if query.wants(field_name) and value and _contains(value, folded):
            why.append((name, value))
    return why, exact


def _archived_batch_why(row: Any, query: Query) -> tuple[list[tuple[str, str]], bool]:
    folded = query.folded
    why: list[tuple[str, str]] = []
    exact = False
    if query.wants("id"):
        for name, value in (("batch ID", row.bid), ("batch's own ID", row.batch_uuid)):
            if value and value.casefold().startswith(folded):
                why.append((name, value))
                exact = exact or value.casefold() == folded
    submission = row.submission if isinstance(row.submission, dict) else {}
    for name, field_name, value in (
        ("submitter", "submitter", row.submitter),
        ("title", "title", row.title),
        ("file name", "filename", text_field(submission, "filename")),
        ("error", "error", row.final_message),
    ):
        if query.wants(field_name) and value and _contains(value, folded):
            why.append((name, value))
    return why, exact


def _archived_sections(query: Query) -> tuple[list[Section], list[str]]:
    """The archived jobs' and batches' sections, and the pages of their exact matches."""
    search = _archived_search(query)
    sections, exact = [], []
    for key, rows, explain, kind in (
        ("archived-jobs", archive.archived_jobs_search(search), _archived_job_why, "job"),
        ("archived-batches", archive.archived_batches_search(search), _archived_batch_why, "batch"),
    ):
        page = query.page(key)
        start = (page - 1) * PER_PAGE
        total = rows.count()
        shown = []
        for row in rows[start : start + PER_PAGE]:
            why, is_exact = explain(row, query)
            item = Row(
                kind=kind,
                id=row.jid if kind == "job" else row.bid,
                archived=True,
                state=row.final_state,
                bid=row.bid if kind == "job" else "",
                collection=row.profile,
                submitter=row.submitter,
                title=row.title,
                why=why,
                created=row.created,
                changed=row.last_modified,
            )
            shown.append(item)
            if is_exact and total == 1:
                exact.append(item.url)
        sections.append(Section(key, shown, total, page, []))
    return sections, exact


# The search -------------------------------------------------------------------------------------


def run(query: Query) -> Results:
    """Every section of one search; ``opens`` the single exact match's page, if that is all
    it found."""
    zk = connected_client()
    idx = zindex.for_client(zk)
    kept = _kept_for(idx)
    jobs = _jobs_section(zk, idx, kept, query)
    batches, exact_batches = _batches_section(zk, idx, kept, query)
    archived, exact_archived = _archived_sections(query)
    sections = [jobs, batches, *archived]
    opens = ""
    if sum(s.total for s in sections) == 1:
        if jobs.total == 1 and jobs.rows and _is_exact_job(jobs.rows[0], query):
            opens = jobs.rows[0].url
        elif batches.total == 1 and exact_batches:
            opens = reverse("batch", args=[next(iter(exact_batches))])
        elif exact_archived:
            opens = exact_archived[0]
    return Results(query, sections, opens, idx.loading())


def _is_exact_job(row: Row, query: Query) -> bool:
    folded = query.folded
    if row.id == folded:
        return True
    return any(
        name in ("ARK", "local ID") and value.casefold() == folded for name, value in row.why
    )
