"""Notes on jobs, batches and collections: add, edit, delete (``queues/console/notes.py`` checks who
may and audits each). Every one is a POST that goes back where it came from; the notes are
shown by the item's page and as markers in lists (``templatetags/followup.py``)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponse
from django.urls import re_path, reverse
from django.views.decorators.http import require_POST

from queues.console import notes
from queues.operator.auth import VIEWER
from queues.zk import paths as zpaths

from .common import HtmxHttpRequest, console_view, only_fields, redirect_after_post, safe_next

# What the notes' forms post: the text (but to delete) and the page to go back to.
NOTE_FIELDS = ("text", "next")


def _item_page(kind: str, item_id: str) -> str:
    if kind == "job":
        return reverse("job", args=[item_id])
    if kind == "batch":
        return reverse("batch", args=[item_id])
    return reverse("holds")


@require_POST
@console_view(VIEWER)
def note_add(request: HtmxHttpRequest, kind: str, item_id: str) -> HttpResponse:
    # The text is checked (and a refusal audited) by notes.note_add, whatever was posted.
    only_fields(request, also=NOTE_FIELDS)
    text = request.POST.get("text", "")
    note = notes.note_add(user=request.user, kind=kind, item_id=item_id, text=text)
    messages.success(request, f"Note added to {kind} {note.item_id}")
    back = _item_page(kind, note.item_id)
    return redirect_after_post(safe_next(request, request.POST.get("next"), back))


@require_POST
@console_view(VIEWER)
def note_edit(request: HtmxHttpRequest, pk: str) -> HttpResponse:
    only_fields(request, also=NOTE_FIELDS)
    note = notes.note_edit(user=request.user, pk=int(pk), text=request.POST.get("text", ""))
    messages.success(request, f"Note on {note.kind} {note.item_id} changed")
    back = _item_page(note.kind, note.item_id)
    return redirect_after_post(safe_next(request, request.POST.get("next"), back))


@require_POST
@console_view(VIEWER)
def note_delete(request: HtmxHttpRequest, pk: str) -> HttpResponse:
    only_fields(request, also=("next",))
    note = notes.note_delete(user=request.user, pk=int(pk))
    messages.success(request, f"Note on {note.kind} {note.item_id} deleted")
    back = _item_page(note.kind, note.item_id)
    return redirect_after_post(safe_next(request, request.POST.get("next"), back))


urlpatterns = [
    re_path(
        rf"^(?P<kind>job|batch|collection)/(?P<item_id>(?!\.\.?/){zpaths.PROFILE_CHARS})/$",
        note_add,
        name="note-add",
    ),
    re_path(r"^(?P<pk>[0-9]{1,18})/edit/$", note_edit, name="note-edit"),
    re_path(r"^(?P<pk>[0-9]{1,18})/delete/$", note_delete, name="note-delete"),
]
