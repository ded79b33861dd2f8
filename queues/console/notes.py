"""Operators' notes on a job, a batch or a collection: written, changed and removed here, each
change audited (refusals too), for the console's pages and the JSON API alike.

Any operator may write a note; only its author or an admin may change or remove it, so one
person's word is not rewritten under their name. Notes are text: every page escapes them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, transaction
from django.utils import timezone

from queues.console import batch_reads, job_reads, selectors
from queues.core import clock
from queues.core.roles import ADMIN, OPERATOR
from queues.models import Note
from queues.operator import archive
from queues.operator.audit import record
from queues.operator.auth import has_role
from queues.zk import paths as zpaths
from queues.zk.errors import InvalidID, MalformedNode, NotFound

log = logging.getLogger("queues.console.notes")

_VALIDATORS: dict[str, Callable[[str], str]] = {
    "job": zpaths.jid,
    "batch": zpaths.bid,
    "collection": zpaths.profile,
}


def _check_item(kind: str, item_id: str) -> str:
    """``item_id`` when it names a job or batch that ZooKeeper or the archive knows, or a
    collection the console knows (its profile, a hold or cap on it, a job of it live or
    archived: ``selectors.collection_known``); else an error, NotFound (404) for one not there."""
    validator = _VALIDATORS.get(kind)
    if validator is None:
        raise ValueError(f"a note goes on a job, a batch or a collection, not a {kind!r}")
    item_id = validator(item_id)
    try:
        if kind == "job":
            job_reads.job_one(jid=item_id)
        elif kind == "batch":
            batch_reads.batch_one(bid=item_id)
        else:
            selectors.known_collection(item_id)
    except MalformedNode:
        pass  # unreadable, but there: worth a note all the more
    except NotFound:
        if kind == "collection":
            raise
        kept = archive.archived_job(item_id) if kind == "job" else archive.archived_batch(item_id)
        if kept is None:
            raise
    return item_id


# What a note may not hold: the C0 control characters but tab, newline and carriage return (a
# note is lines of text, and a browser's text area posts its lines ending in CR LF), DEL and C1.
# A NUL was stored as it came, and shown or exported as a byte no reader expects.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _clean(text: str) -> str:
    """The note's text, from every door (the pages and the API); ValueError for one it refuses:
    empty, too long, or holding a control character."""
    text = text.strip()
    if not text:
        raise ValueError("a note needs some text")
    if len(text) > Note.MAX_LENGTH:
        raise ValueError(f"a note is at most {Note.MAX_LENGTH} characters, not {len(text)}")
    control = _CONTROL.search(text)
    if control:
        raise ValueError(
            f"a note holds the control character U+{ord(control.group()):04X}: "
            "text only (new lines and tabs are fine)"
        )
    return text


def may_change(user: Any, note: Note) -> bool:
    """Its author (still an operator) or an admin."""
    if has_role(user, ADMIN):
        return True
    return note.author_id is not None and note.author_id == user.pk and has_role(user, OPERATOR)


def _refused(user: Any, action: str, kind: str, item_id: str, exc: Exception, via: str) -> None:
    record(
        user=user,
        action=action,
        kind=kind,
        item_id=item_id,
        detail=f"refused: {exc}",
        ok=False,
        via=via,
    )


def note_add(*, user: Any, kind: str, item_id: str, text: str, via: str = "web") -> Note:
    try:
        if not has_role(user, OPERATOR):
            raise PermissionDenied("writing a note needs the operator role")
        item_id = _check_item(kind, item_id)
        text = _clean(text)
    except (PermissionDenied, ValueError, InvalidID, NotFound) as exc:
        _refused(user, "note", kind[:20], item_id, exc, via)
        raise
    # The note and its entry are written both or neither (a database lost between them).
    with transaction.atomic():
        note = Note.objects.create(
            kind=kind, item_id=item_id, text=text, author=user, author_name=user.get_username()
        )
        record(user=user, action="note", kind=kind, item_id=item_id, detail=text, via=via)
    return note


def _mine(user: Any, pk: int, action: str, via: str) -> Note:
    note = Note.objects.filter(pk=pk).first()
    if note is None:
        raise NotFound(f"note {pk} does not exist")
    if not may_change(user, note):
        exc = PermissionDenied(
            f"only {note.author_name or 'its author'} or an admin may change this note"
        )
        _refused(user, action, note.kind, note.item_id, exc, via)
        raise exc
    return note


def note_edit(*, user: Any, pk: int, text: str, via: str = "web") -> Note:
    note = _mine(user, pk, "note-edit", via)
    try:
        text = _clean(text)
    except ValueError as exc:
        _refused(user, "note-edit", note.kind, note.item_id, exc, via)
        raise
    before = note.text
    note.text, note.edited = text, timezone.now()
    with transaction.atomic():
        note.save(update_fields=["text", "edited"])
        record(
            user=user,
            action="note-edit",
            kind=note.kind,
            item_id=note.item_id,
            detail=f"{text}\n(was: {before})",
            via=via,
        )
    return note


def note_delete(*, user: Any, pk: int, via: str = "web") -> Note:
    note = _mine(user, pk, "note-delete", via)
    with transaction.atomic():
        note.delete()
        record(
            user=user,
            action="note-delete",
            kind=note.kind,
            item_id=note.item_id,
            detail=f"by {note.author_name}: {note.text}",
            via=via,
        )
    return note


def notes_for(kind: str, item_id: str) -> list[Note]:
    return list(Note.objects.filter(kind=kind, item_id=item_id).select_related("author"))


def note_json(note: Note) -> dict[str, Any]:
    return {
        "id": note.pk,
        "kind": note.kind,
        "item": note.item_id,
        "text": note.text,
        "author": note.author_name,
        "created": clock.exact(note.created),
        "edited": clock.exact(note.edited) or None,
    }


class NoteLookup:
    """The notes of one kind of item for the rows of one page. With no note of that kind (the
    usual case) it costs one query; with notes on up to ``WHOLE`` items, two; past that, one
    per row. A database that cannot answer leaves the markers out, not the page."""

    WHOLE = 500

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.known: dict[str, list[Note]] = {}
        self.whole = True
        try:
            noted = list(
                Note.objects.filter(kind=kind)
                .values_list("item_id", flat=True)
                .distinct()[: self.WHOLE + 1]
            )
            self.whole = len(noted) <= self.WHOLE
            if self.whole and noted:
                for note in Note.objects.filter(kind=kind, item_id__in=noted):
                    self.known.setdefault(note.item_id, []).append(note)
        except DatabaseError as exc:
            log.warning("notes on %ss not read: %s", kind, exc)

    def get(self, item_id: str) -> list[Note]:
        if self.whole:
            return self.known.get(item_id, [])
        if item_id not in self.known:
            try:
                self.known[item_id] = list(Note.objects.filter(kind=self.kind, item_id=item_id))
            except DatabaseError as exc:
                log.warning("notes on %s %s not read: %s", self.kind, item_id, exc)
                self.known[item_id] = []
        return self.known[item_id]
