"""What an operator follows up with: notes in pages (a list row's marker, an item's panel),
the "fixed batch" notice, and the steps a resume may start from."""

from __future__ import annotations

from collections.abc import Mapping, Sized
from typing import Any

from django import template
from django.utils.html import format_html

from queues.console import notes
from queues.core.roles import OPERATOR
from queues.core.states import JOB, BatchState, JobState
from queues.operator.auth import has_role
from queues.zk import index as zindex
from queues.zk.client import connected_client

register = template.Library()


def _lookup(context: template.Context, kind: str) -> notes.NoteLookup:
    """One lookup per request and kind: a list's rows are separate renders of one partial."""
    request = context.get("request")
    kept: dict[str, notes.NoteLookup] = getattr(request, "_note_lookups", {})
    if kind not in kept:
        kept[kind] = notes.NoteLookup(kind)
        if request is not None:
            request._note_lookups = kept  # type: ignore[attr-defined]
    return kept[kind]


@register.simple_tag(takes_context=True)
def note_marker(context: template.Context, kind: str, item_id: str) -> str:
    """A small marker beside an item in a list when it has notes; the notes on hover (and to a
    screen reader), escaped."""
    found = _lookup(context, kind).get(item_id)
    if not found:
        return ""
    words = "\n".join(f"{n.author_name or '?'}: {n.text}" for n in found)
    return format_html(
        '<span class="note-marker" tabindex="0" title="{}" aria-label="{} note{}: {}">'
        '<span aria-hidden="true">✎</span>{}</span>',
        words,
        len(found),
        "" if len(found) == 1 else "s",
        words,
        len(found) if len(found) > 1 else "",
    )


@register.inclusion_tag("queues/_notes.html", takes_context=True)
def notes_panel(
    context: template.Context, kind: str, item_id: str, compact: bool = False
) -> dict[str, Any]:
    """An item's notes with their edit and delete buttons (for whoever may), and the form to
    add one (for an operator); ``compact`` inside a list's row."""
    user = context.get("user")
    request = context.get("request")
    shown = [(n, notes.may_change(user, n)) for n in notes.notes_for(kind, item_id)]
    return {
        "kind": kind,
        "item_id": item_id,
        "compact": compact,
        "shown": shown,
        "can_write": has_role(user, OPERATOR),
        "csrf_token": context.get("csrf_token"),
        "next": request.get_full_path() if request is not None else "",
    }


def _count(value: int | Sized) -> int:
    return value if isinstance(value, int) else len(value)


def waits_for_update_reporting(state: str, jobs: Mapping[str, int | Sized]) -> bool:
    """A Failed batch whose jobs have all ended well since (resumed and completed): none
    failed, none under way, at least one completed. Only Update-reporting moves it on, and
    the seeds leave that to an operator. ``jobs``: batch index folder -> count (or its IDs)."""
    return (
        state == BatchState.FAILED
        and _count(jobs.get("batch-completed", 0)) > 0
        and _count(jobs.get("batch-failed", 0)) == 0
        and _count(jobs.get("batch-processing", 0)) == 0
    )


@register.simple_tag
def batch_waits_for_update_reporting(detail: Any) -> int:
    """For the batch page (``selectors.BatchDetail``): how many of its jobs completed when the
    batch waits for Update-reporting, else 0."""
    folders = detail.folders
    if not waits_for_update_reporting(detail.batch.state, folders):
        return 0
    return _count(folders.get("batch-completed", 0))


def batches_waiting_for_update_reporting() -> list[str]:
    """The Failed batches whose jobs have all ended well since, oldest first: from the read
    index, which keeps the answer while no batch changed state and no Failed batch's folders
    changed (``ReadIndex.fixed_batches``), so a page asking again looks at no batch."""
    idx = zindex.for_client(connected_client())
    if not idx.filling:
        return idx.fixed_batches()
    # While the index fills after a start: the batches whose state is read so far.
    states = idx.batch_states_now()
    failed = [b for b, s in states.items() if s.state == BatchState.FAILED]
    counts = idx.batch_folder_counts(sorted(failed))
    return [b for b, c in counts.items() if waits_for_update_reporting(BatchState.FAILED, c)]


@register.simple_tag
def waiting_batch_count() -> int:
    """For a link from the overview: how many batches wait for an operator's Update-reporting."""
    return len(batches_waiting_for_update_reporting())


@register.simple_tag
def resume_steps() -> tuple[str, ...]:
    """Every step the job state machine lets a resume start from (a job may use those up to
    the one it failed in; the service says so for one that would skip a step)."""
    return JOB.action_targets("resume", JobState.FAILED)
