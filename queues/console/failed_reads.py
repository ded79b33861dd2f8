"""The failed jobs' page: Failed jobs grouped by batch, collection or step from the read index's
failed facts, each group paged, and the jobs matching a group for a bulk action.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast, overload
from urllib.parse import quote

from django.utils.text import slugify

from queues.console.job_reads import Page
from queues.core.states import JOB, JobState
from queues.zk import index as zindex
from queues.zk.client import connected_client
from queues.zk.errors import StillLoading
from queues.zk.jobs import jobs_load
from queues.zk.records import Broken, Job

# Rows of one group shown per page, and groups per page. The API pages its rows the same way.
FAILED_ROWS_PER_PAGE = 50
FAILED_GROUPS_PER_PAGE = 50
FAILED_GROUPINGS = ("batch", "collection", "step")
EMPTY_PLACES = array("q")  # a batch with no Failed job: no places (shared, never modified)


@dataclass(frozen=True)
class FailedGroup:
    key: str
    count: int
    slug: str = ""  # the key as an HTML id
    quoted: str = ""  # the key as a URL's query value


@dataclass(frozen=True)
class FailedView:
    """The Failed jobs a filter matches, grouped, with rows only where asked for.

    Counts come from the read index (each Failed job's batch, collection and failing step,
    read once per job); only the rows shown are loaded, at most ``FAILED_ROWS_PER_PAGE``.
    """

    group: str  # "batch", "collection" or "step"
    groups: list[FailedGroup]  # this page of groups
    group_page: Page  # paging of the groups (items: the same FailedGroup list)
    total: int  # Failed jobs the filter matches
    failed_total: int  # every job in the Failed state
    # Rows: key -> (page of that group's jobs); every group when all matches fit in one page,
    # else only the open one.
    rows: dict[str, Page]
    open: str  # the group whose rows were asked for ("" when none)
    steps: dict[str, str]  # jid -> failing step, for the rows shown
    unindexed: list[Job | Broken]  # Failed jobs whose batch or status cannot be read
    loading: str = ""

    @property
    def broken(self) -> list[Broken]:
        return [j for j in self.unindexed if isinstance(j, Broken)]

    @property
    def shown(self) -> int:
        return sum(len(p.items) for p in self.rows.values())


class FailedMatches(Sequence[tuple[str, str, str, str]]):
    """(jid, batch, collection, step) of Failed jobs, oldest first: a job number each and one
    shared (batch, collection, step) triple per distinct triple, items made when asked for."""

    __slots__ = ("infos", "numbers")

    def __init__(self, numbers: array[int], infos: list[tuple[str, str, str]]) -> None:
        self.numbers = numbers
        self.infos = infos

    def __len__(self) -> int:
        return len(self.numbers)

    @overload
    def __getitem__(self, i: int) -> tuple[str, str, str, str]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[str, str, str, str]]: ...

    def __getitem__(
        self, i: int | slice
    ) -> tuple[str, str, str, str] | list[tuple[str, str, str, str]]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self.numbers)))]
        info = self.infos[i]
        return (f"jid{self.numbers[i]:010d}", *info)

    def __iter__(self) -> Iterator[tuple[str, str, str, str]]:
        for number, info in zip(self.numbers, self.infos, strict=True):
            yield (f"jid{number:010d}", *info)

    def jids(self) -> list[str]:
        return [f"jid{n:010d}" for n in self.numbers]


def _failed_matches(zk: Any, *, bid: str = "", profile: str = "", step: str = "") -> FailedMatches:
    """(jid, batch, collection, step) of every Failed job the filter takes, oldest first;
    from the read index, computed once per change of the Failed folder and filter. While the
    read index fills, of the Failed jobs read so far (not kept)."""
    idx = zindex.for_client(zk)
    filling = idx.filling

    def build() -> FailedMatches:
        failed = idx.failed_numbers(wait=not filling)
        numbers = failed.numbers()
        facts = idx.job_facts_by_number(numbers, read=not filling)
        shared: dict[tuple[str, str, str], tuple[str, str, str]] = {}
        kept = array("q")
        infos = []
        for number, ff in zip(numbers, failed.in_order(), strict=True):
            collection = facts[number].profile if number in facts else ""
            if bid and ff.bid != bid:
                continue
            if profile and collection != profile:
                continue
            if step and ff.step != step:
                continue
            info = (ff.bid, collection, ff.step)
            kept.append(number)
            infos.append(shared.setdefault(info, info))
        return FailedMatches(kept, infos)

    def build_one_batch() -> FailedMatches:
        # The unfiltered matches grouped by batch (kept, as the failed page's own grouping):
        # a batch's matches are then its own places, not a pass over every Failed job.
        every, by_batch = _failed_groups(zk, "batch")
        kept = array("q")
        infos = []
        for place in by_batch.members.get(bid, EMPTY_PLACES):
            info = every.infos[place]
            if (profile and info[1] != profile) or (step and info[2] != step):
                continue
            kept.append(every.numbers[place])
            infos.append(info)
        return FailedMatches(kept, infos)

    if filling:
        return build()
    key = ("failed", bid, profile, step)
    return cast(
        "FailedMatches", idx.derived(JobState.FAILED, key, build_one_batch if bid else build)
    )


def failed_matching(*, bid: str = "", profile: str = "", step: str = "") -> list[str]:
    """Every Failed job ID the filter matches now (for "resume everything matching");
    StillLoading while the read index fills after a start (it knows the Failed jobs read so
    far only)."""
    zk = connected_client()
    if zindex.for_client(zk).filling:
        raise StillLoading.about("the Failed jobs")
    return _failed_matches(zk, bid=bid, profile=profile, step=step).jids()


def _failed_key(match: tuple[str, str, str, str], group: str) -> str:
    if group == "collection":
        return match[2] or "(none)"
    return match[3] if group == "step" else match[1]


@dataclass(frozen=True)
class FailedGroups:
    """One filter's matches under one grouping: the groups in the page's order, each with the
    places of its jobs in the matches (oldest first). A page of groups, or a page of one
    group's rows, is then a slice, not a pass over every Failed job."""

    keys: list[str]
    counts: dict[str, int]  # in the order of ``keys``
    where: dict[str, int]  # key -> its place in ``keys``
    members: dict[str, array[int]]  # key -> places in the matches
    # The groups shown so far, made once per change (a page of 50 groups shows each key in
    # an id and in links: made in the template, that was most of the page's time).
    shown: dict[str, FailedGroup] = field(default_factory=dict)
    # Each page of groups asked for, made once per change: a page asked again is one look-up,
    # not a call per group (a filter's 20 groups and another's 50 cost the same).
    pages: dict[int, list[FailedGroup]] = field(default_factory=dict)

    def page(self, first: int, size: int) -> list[FailedGroup]:
        """The groups of the page starting at place ``first``."""
        found = self.pages.get(first)
        if found is None:
            found = self.pages[first] = [self.group(k) for k in self.keys[first : first + size]]
        return found

    def group(self, key: str) -> FailedGroup:
        found = self.shown.get(key)
        if found is None:
            found = self.shown[key] = FailedGroup(
                key, self.counts[key], slugify(key), quote(key, safe="/")
            )
        return found


def _grouped(matches: FailedMatches, group: str) -> FailedGroups:
    # Jobs share a few thousand (batch, collection, step) triples: each triple's key once.
    key_of: dict[int, str] = {}
    members: dict[str, array[int]] = {}
    for place, info in enumerate(matches.infos):
        key = key_of.get(id(info))
        if key is None:
            key = key_of[id(info)] = _failed_key(("", *info), group)
        found = members.get(key)
        if found is None:
            found = members[key] = array("q")
        found.append(place)
    if group == "step":
        keys = [s for s in JOB.states if s in members] + sorted(
            s for s in members if not JOB.is_state(s)
        )
    else:
        keys = sorted(members)
    return FailedGroups(
        keys, {k: len(members[k]) for k in keys}, {k: i for i, k in enumerate(keys)}, members
    )


def _failed_groups(
    zk: Any, group: str, *, bid: str = "", profile: str = "", step: str = ""
) -> tuple[FailedMatches, FailedGroups]:
    """A filter's matches with their groups, computed together (the groups' places refer to
    those matches) once per change of the Failed folder; while the read index fills, of the
    Failed jobs read so far (not kept)."""
    idx = zindex.for_client(zk)

    def build() -> tuple[FailedMatches, FailedGroups]:
        matches = _failed_matches(zk, bid=bid, profile=profile, step=step)
        return matches, _grouped(matches, group)

    if idx.filling:
        return build()
    return cast(
        "tuple[FailedMatches, FailedGroups]",
        idx.derived(JobState.FAILED, ("failed-groups", bid, profile, step, group), build),
    )


def _failed_unindexed(zk: Any) -> list[str]:
    """Failed jobs whose batch or status the index could not read (no batch node, an
    unreadable status), at most a page of them, found once per change of the Failed folder."""
    idx = zindex.for_client(zk)
    if idx.filling:
        return []

    def build() -> list[str]:
        failed = idx.failed_numbers()
        entries = idx.job_entries(JobState.FAILED).numbers()
        return [f"jid{n:010d}" for n in entries if n not in failed][:FAILED_ROWS_PER_PAGE]

    return cast("list[str]", idx.derived(JobState.FAILED, ("failed-unindexed",), build))


def failed_jobs(
    *,
    bid: str = "",
    profile: str = "",
    step: str = "",
    group: str = "batch",
    group_page: int = 1,
    open_group: str = "",
    row_page: int = 1,
) -> FailedView:
    """The failed list: groups with counts (a page of them), and rows of at most one page.

    When everything the filter matches fits in one page of rows, every group shows its rows;
    otherwise only ``open_group`` does, ``row_page`` of it.
    """
    zk = connected_client()
    idx = zindex.for_client(zk)
    group = group if group in FAILED_GROUPINGS else "batch"
    matches, grouped = _failed_groups(zk, group, bid=bid, profile=profile, step=step)
    keys, counts = grouped.keys, grouped.counts
    group_page = max(1, group_page)
    if open_group in grouped.where:  # the page of groups that holds the open one
        group_page = grouped.where[open_group] // FAILED_GROUPS_PER_PAGE + 1
    first = (group_page - 1) * FAILED_GROUPS_PER_PAGE
    shown = list(grouped.page(first, FAILED_GROUPS_PER_PAGE))
    paging = Page(
        shown,
        group_page,
        FAILED_GROUPS_PER_PAGE,
        len(keys),
        first + FAILED_GROUPS_PER_PAGE < len(keys),
    )

    row_page = max(1, row_page)
    row_first = (row_page - 1) * FAILED_ROWS_PER_PAGE
    # key -> (this page of the group's matches, how many the group has)
    wanted: dict[str, tuple[list[tuple[str, str, str, str]], int]] = {}
    if len(matches) <= FAILED_ROWS_PER_PAGE:
        row_page, row_first = 1, 0
        for m in matches:
            key = _failed_key(m, group)
            wanted.setdefault(key, ([], counts[key]))[0].append(m)
    elif open_group in grouped.members:
        places = grouped.members[open_group]
        shown_places = places[row_first : row_first + FAILED_ROWS_PER_PAGE]
        wanted[open_group] = ([matches[p] for p in shown_places], len(places))
    loaded = {
        (j.id if isinstance(j, Broken) else j.jid): j
        for j in jobs_load(zk, [m[0] for ms, _n in wanted.values() for m in ms])
    }
    rows: dict[str, Page] = {}
    shown_steps: dict[str, str] = {}
    for key, (part, count) in wanted.items():
        rows[key] = Page(
            [loaded[m[0]] for m in part if m[0] in loaded],
            row_page,
            FAILED_ROWS_PER_PAGE,
            count,
            row_first + FAILED_ROWS_PER_PAGE < count,
        )
        shown_steps.update((m[0], m[3]) for m in part if isinstance(loaded.get(m[0]), Job))
    # Listed so that nothing failed is hidden; there are normally none.
    unindexed: list[Job | Broken] = []
    if not (bid or profile or step):
        missing = _failed_unindexed(zk)
        unindexed = jobs_load(zk, missing) if missing else []
    return FailedView(
        group=group,
        groups=shown,
        group_page=paging,
        total=len(matches),
        failed_total=idx.job_count(JobState.FAILED),
        rows=rows,
        open=open_group if open_group in grouped.where else "",
        steps=shown_steps,
        unindexed=unindexed,
        loading=idx.loading(),
    )


def failed_group_counts(
    *, bid: str = "", profile: str = "", step: str = ""
) -> dict[str, dict[str, int]]:
    """The matches of a filter counted per batch, collection and failing step (the API's
    ``groups``), each sorted by key; shared answers, not to be modified."""
    zk = connected_client()
    # While the read index fills nothing is kept: the matches of what is read so far, once.
    matches = (
        _failed_matches(zk, bid=bid, profile=profile, step=step)
        if zindex.for_client(zk).filling
        else None
    )
    found = {}
    for name in FAILED_GROUPINGS:
        if matches is not None:
            counts = _grouped(matches, name).counts
        else:
            counts = _failed_groups(zk, name, bid=bid, profile=profile, step=step)[1].counts
        # Batches and collections are kept sorted by key already; steps in the machine's order.
        found[name] = dict(sorted(counts.items())) if name == "step" else counts
    return found


def failed_page(
    *,
    bid: str = "",
    profile: str = "",
    step: str = "",
    page: int = 1,
    per_page: int = FAILED_ROWS_PER_PAGE,
) -> tuple[Page, dict[str, str]]:
    """One page of every matching Failed job, oldest first (the API's paging), with each
    shown job's failing step."""
    zk = connected_client()
    matches = _failed_matches(zk, bid=bid, profile=profile, step=step)
    page = max(1, page)
    first = (page - 1) * per_page
    part = matches[first : first + per_page]
    items = jobs_load(zk, [m[0] for m in part])
    return (
        Page(
            items,
            page,
            per_page,
            len(matches),
            first + per_page < len(matches),
            loading=zindex.for_client(zk).loading(),
        ),
        {m[0]: m[3] for m in part},
    )
