"""Failed jobs grouped by cause: each failure message reduced to a signature (the words that
stay when numbers, URLs, hosts, paths, job and batch IDs, ARKs and digests are taken out), and
the Failed jobs counted per (failing step, signature) with the batches and collections they
touch, their first and last failure time and the newest message as a sample.

Cost: each Failed job's status is read once, when it is first seen in the Failed folder, in
multi-reads of ``READ_CHUNK`` nodes (100k Failed jobs: 50 requests, on the first request after
a start); the groups are computed once per change of the Failed folder (the read index's
``derived``) and kept with their members' places, so a page of groups is a slice.
"""

from __future__ import annotations

import hashlib
import re
import threading
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast
from urllib.parse import urlencode

from queues.console import failed_reads, job_reads
from queues.core import clock
from queues.core.per_key import PerKey
from queues.core.states import JOB, JobState
from queues.zk import index as zindex
from queues.zk import paths as zpaths
from queues.zk.client import connected_client
from queues.zk.nodes import json_objects, stamp
from queues.zk.packed import NumberMap
from queues.zk.records import Status

GROUPS_PER_PAGE = 50
SIGNATURE_MAX = 300  # characters of a signature kept (a stack trace's first lines suffice)
NO_MESSAGE = "(no message)"
LISTED_MAX = 100  # batches and collections a group names in the API
WHEN_BITS = 40  # epoch seconds fit until the year 36812
WHEN_MASK = (1 << WHEN_BITS) - 1
MAX_SIGNATURES = 1 << (63 - WHEN_BITS)  # a fact is one signed 64-bit integer
KEY_RE = re.compile(r"^[0-9a-f]{16}$")

# Order matters: a URL holds a host, a path and numbers; an ARK holds a path.
_REDACTIONS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>()\[\]]*[^\s'\"<>()\[\].,:;]", re.I), "<url>"),
    (re.compile(r"\bark:/?\d{5,}/[^\s'\"<>()\[\],;]+", re.I), "<ark>"),
    (re.compile(r"\bjid\d{10}\b"), "<job>"),
    (re.compile(r"\bbid\d{10}\b"), "<batch>"),
    (re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b"), "<email>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I), "<id>"),
    (re.compile(r"\b[0-9a-f]{16,}\b", re.I), "<digest>"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"), "<host>"),
    (
        re.compile(
            r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2})?(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
        ),
        "<time>",
    ),
    (re.compile(r"(?<![\w.<])(?:~|\.{1,2})?/[^\s'\"<>()\[\],;:]+"), "<path>"),
    (re.compile(r"\b[\w.-]+(?:/[\w.-]+)+"), "<path>"),
    # Hosts: a name under a common top-level domain (not a Java class such as java.io.File),
    # or any name with a port.
    (
        re.compile(
            r"\b(?:[a-z0-9-]+\.)+(?:org|edu|com|net|gov|io|us|uk|local|internal|localdomain)"
            r"(?::\d+)?(?![\w-]|\.\w)",
            re.I,
        ),
        "<host>",
    ),
    (re.compile(r"\b[a-z][a-z0-9-]*(?:\.[a-z0-9-]+)*:\d{2,5}\b", re.I), "<host>"),
    (re.compile(r"(?<![A-Za-z_<])[-+]?\d+(?:[.,:]\d+)*"), "<n>"),
]
_SPACES = re.compile(r"\s+")


def signature(message: str) -> str:
    """The message with what differs between failures of one cause taken out."""
    text = message.strip()
    if not text:
        return NO_MESSAGE
    for pattern, placeholder in _REDACTIONS:
        text = pattern.sub(placeholder, text)
    return _SPACES.sub(" ", text).strip()[:SIGNATURE_MAX]


def group_key(step: str, sig: str) -> str:
    """A short stable name for a (step, signature) group, safe in URLs and form fields."""
    return hashlib.sha256(f"{step}\n{sig}".encode()).hexdigest()[:16]


@dataclass
class CauseGroup:
    key: str
    step: str
    signature: str
    count: int
    batches: list[str]  # sorted
    collections: list[str]  # sorted; "" (no collection known) left out
    first_seen: datetime
    last_seen: datetime
    sample: str  # the newest failure's message
    sample_jid: str
    members: array[int] = field(repr=False)  # places in the matches, oldest job first


@dataclass(frozen=True)
class FailureCauses:
    groups: list[CauseGroup]  # most jobs first, then most recent
    by_key: dict[str, CauseGroup]
    matches: failed_reads.FailedMatches
    total: int
    unread: int  # matching Failed jobs whose status could not be read (not grouped)

    def jids(self, key: str) -> list[str]:
        group = self.by_key.get(key)
        if group is None:
            return []
        return [f"jid{self.matches.numbers[p]:010d}" for p in group.members]


class _Seen:
    """What each Failed job's status said when it was first seen Failed: its signature (an
    index into ``signatures``), its failure time, and the newest message per signature. Kept
    across changes of the Failed folder so that a change reads only the jobs new in it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.signatures: list[str] = []
        self.where: dict[str, int] = {}
        # job number -> signature index << WHEN_BITS | failure time in epoch seconds (the
        # status's precision): 16 bytes a Failed job
        self.facts = NumberMap()
        self.samples: dict[int, tuple[int, str]] = {}  # signature -> (job number, message)

    def intern(self, sig: str) -> int:
        found = self.where.get(sig)
        if found is None:
            if len(self.signatures) >= MAX_SIGNATURES:
                raise OverflowError("too many distinct failure signatures")
            found = self.where[sig] = len(self.signatures)
            self.signatures.append(sig)
        return found

    def read(self, zk: Any, numbers: list[int]) -> None:
        """Read the statuses of ``numbers`` (in chunks) and remember their signatures."""
        number_of = {zpaths.job_node(f"jid{n:010d}", "status"): n for n in numbers}
        # A job gone meanwhile is left out: the next change of the folder says so.
        for found in json_objects(zk, list(number_of), zindex.READ_CHUNK):
            for path, (raw, stat) in found.items():
                self.remember(number_of[path], raw, stat)

    def remember(self, number: int, raw: dict[str, Any], stat: Any) -> None:
        status = Status(raw=raw, version=stat.version, mtime=stamp(stat.mtime))
        sig_index = self.intern(signature(status.message))
        when = max(0, int((status.last_modified or status.mtime).timestamp()))
        self.facts[number] = sig_index << WHEN_BITS | when
        sample = self.samples.get(sig_index)
        if sample is None or self.when(sample[0]) <= when:
            self.samples[sig_index] = (number, status.message)

    def take(self, statuses: list[tuple[int, dict[str, Any], Any]]) -> None:
        """The statuses the read index read of jobs new in Failed (its fill reads every Failed
        job's at a start): what the page would otherwise read again itself."""
        with self.lock:
            for number, raw, stat in statuses:
                self.remember(number, raw, stat)

    def when(self, number: int) -> int:
        return (self.facts.get(number) or 0) & WHEN_MASK

    def forget_except(self, keep: array[int]) -> None:
        """Forget the jobs not in ``keep`` (sorted numbers)."""
        self.facts.retain_sorted(keep)


_seen_for: PerKey[Any, _Seen] = PerKey(lambda _idx: _Seen())


def _messages(zk: Any, numbers: list[int]) -> dict[int, str]:
    """The failure messages of a few jobs (the samples), in one read."""
    number_of = {zpaths.job_node(f"jid{n:010d}", "status"): n for n in numbers}
    found: dict[int, str] = {}
    for chunk in json_objects(zk, list(number_of), zindex.READ_CHUNK):
        for path, (raw, _stat) in chunk.items():
            if isinstance(raw.get("message"), str):
                found[number_of[path]] = raw["message"]
    return found


def attach(idx: Any) -> None:
    """Take the Failed jobs' statuses ``idx`` reads (``zindex.NEW_INDEX_HOOKS``)."""
    idx.status_sinks.append(_seen_for(idx).take)


def _build(
    zk: Any, matches: failed_reads.FailedMatches, keep: array[int] | None, *, read: bool = True
) -> FailureCauses:
    seen = _seen_for(zindex.for_client(zk))
    numbers = matches.numbers
    with seen.lock:
        facts = seen.facts
        if read:
            seen.read(zk, [n for n in numbers if n not in facts])
        if keep is not None:
            seen.forget_except(keep)
        # (step, signature index) -> places in the matches
        members: dict[tuple[str, int], array[int]] = {}
        whens_of: dict[tuple[str, int], array[int]] = {}  # their failure times
        unread = 0
        for place, number in enumerate(numbers):
            fact = facts.get(number)
            if fact is None:
                unread += 1
                continue
            sig_index = fact >> WHEN_BITS
            key = (matches.infos[place][2], sig_index)
            found = members.get(key)
            if found is None:
                found = members[key] = array("q")
                whens_of[key] = array("q")
            found.append(place)
            whens_of[key].append(fact & WHEN_MASK)
        groups: list[CauseGroup] = []
        for (step, sig_index), places in members.items():
            whens = whens_of[step, sig_index]
            # The newest failure; of those in one second (the status says no more), the newest job.
            newest = numbers[places[max(range(len(places)), key=lambda i: (whens[i], i))]]
            sample_number, sample = seen.samples.get(sig_index, (-1, ""))
            infos = {id(matches.infos[p]): matches.infos[p] for p in places}.values()
            sig = seen.signatures[sig_index]
            groups.append(
                CauseGroup(
                    key=group_key(step, sig),
                    step=step,
                    signature=sig,
                    count=len(places),
                    batches=sorted({i[0] for i in infos}),
                    collections=sorted({i[1] for i in infos if i[1]}),
                    first_seen=datetime.fromtimestamp(min(whens), tz=UTC).astimezone(),
                    last_seen=datetime.fromtimestamp(max(whens), tz=UTC).astimezone(),
                    sample=sample if sample_number == newest else "",
                    sample_jid=f"jid{newest:010d}",
                    members=places,
                )
            )
    # A group whose newest job is not the one its signature's message was kept from (another
    # step's, another filter's, or one gone from Failed): that job's message, one read for all.
    missing = [int(g.sample_jid[3:]) for g in groups if not g.sample]
    if missing:
        messages = _messages(zk, missing)
        for group in groups:
            if not group.sample:
                group.sample = messages.get(int(group.sample_jid[3:]), "")
    order = {s: i for i, s in enumerate(JOB.states)}
    groups.sort(key=lambda g: (-g.count, -g.last_seen.timestamp(), order.get(g.step, 99)))
    return FailureCauses(groups, {g.key: g for g in groups}, matches, len(numbers), unread)


def failure_causes(
    *, bid: str = "", profile: str = "", step: str = "", zk: Any = None
) -> FailureCauses:
    """The Failed jobs the filter matches, grouped by cause; computed once per change of the
    Failed folder and filter (while the read index fills, of what is read so far, not kept).
    ``zk``: a client of the caller's own (a daemon's), else the process's."""
    zk = zk if zk is not None else connected_client()
    idx = zindex.for_client(zk)
    if idx.filling:
        # The fill reads every Failed job's status and hands it here: the groups of what it
        # has read, the rest counted as not read yet (the page says the index is loading).
        matches = failed_reads._failed_matches(zk, bid=bid, profile=profile, step=step)
        return _build(zk, matches, None, read=False)

    def build() -> FailureCauses:
        matches = failed_reads._failed_matches(zk, bid=bid, profile=profile, step=step)
        # Jobs no longer Failed are forgotten: one that fails again is read again.
        return _build(zk, matches, idx.failed_numbers().numbers())

    return cast(
        "FailureCauses",
        idx.derived(JobState.FAILED, ("failure-causes", bid, profile, step), build),
    )


@dataclass(frozen=True)
class TopCause:
    """One cause among some Failed jobs: how many of them, and how many it has in all."""

    key: str
    step: str
    signature: str
    count: int  # of the jobs asked about
    total: int  # of every Failed job the filter matches
    query: str  # the causes page's query string that shows this cause alone


def top_causes(
    jids: Iterable[str], *, profile: str = "", zk: Any = None, most: int = 3
) -> tuple[list[TopCause], int]:
    """The causes of ``jids`` (Failed jobs) by the grouping of ``/failed/causes/``, most jobs
    first: the first ``most`` of them, and how many of ``jids`` the others (or no cause the
    grouping knows yet) account for. ``profile`` filters as the page's filter does."""
    wanted = {int(j[3:]) for j in jids if zpaths.JID_RE.fullmatch(j)}
    if not wanted:
        return [], 0
    causes = failure_causes(profile=profile, zk=zk)
    numbers = causes.matches.numbers
    found = []
    for group in causes.groups:
        count = sum(1 for place in group.members if numbers[place] in wanted)
        if count:
            query = {"profile": profile, "cause": group.key} if profile else {"cause": group.key}
            found.append(
                TopCause(
                    group.key, group.step, group.signature, count, group.count, urlencode(query)
                )
            )
    found.sort(key=lambda c: -c.count)
    shown = found[:most]
    return shown, len(wanted) - sum(c.count for c in shown)


NODE_STEPS = (JobState.STORING, JobState.RECORDING)  # steps that talk to one storage node
_NODE_NAMED = re.compile(r"\bnode (?:#)?([1-9][0-9]{0,8})\b")


def nodes_named(group: CauseGroup) -> list[int]:
    """The storage nodes a cause of Storing or Recording names (its newest message's
    ``storage node 9501`` or ``on node 9501``); none for a cause of another step."""
    if group.step not in NODE_STEPS:
        return []
    return sorted({int(n) for n in _NODE_NAMED.findall(group.sample)})


def pending_by_collection() -> dict[str, int]:
    """Jobs waiting to start per collection: what holding one of a cause's collections stops
    (once per change of the Pending folder; while the read index fills, of what is read)."""
    return zindex.for_client(connected_client()).profile_counts_so_far(JobState.PENDING)


def page_of(causes: FailureCauses, page: int) -> job_reads.Page:
    first = (max(1, page) - 1) * GROUPS_PER_PAGE
    shown = causes.groups[first : first + GROUPS_PER_PAGE]
    return job_reads.Page(
        shown,
        max(1, page),
        GROUPS_PER_PAGE,
        len(causes.groups),
        first + GROUPS_PER_PAGE < len(causes.groups),
        loading=zindex.for_client(connected_client()).loading(),
    )


def group_json(group: CauseGroup) -> dict[str, Any]:
    return {
        "key": group.key,
        "step": group.step,
        "signature": group.signature,
        "count": group.count,
        # A cause may span thousands of batches: the first ones, and how many there are.
        "batches": group.batches[:LISTED_MAX],
        "batch_count": len(group.batches),
        "collections": group.collections[:LISTED_MAX],
        "collection_count": len(group.collections),
        "first_seen": clock.exact(group.first_seen),
        "last_seen": clock.exact(group.last_seen),
        "sample": group.sample,
        "sample_job": group.sample_jid,
    }
