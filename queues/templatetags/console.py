"""Template helpers: ages, state badges (glyph + text, never colour alone), roles, JSON."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from django import template
from django.urls import NoReverseMatch, reverse
from django.utils.html import escape, format_html
from django.utils.safestring import SafeData, mark_safe
from django.utils.timesince import timeuntil

from queues.console.diagrams import GLYPHS, human_age, shape_of
from queues.console.job_reads import shown_now
from queues.core import clock as clock_module
from queues.core.states import BATCH_FOLDER_WORDS, MACHINES
from queues.operator import auth
from queues.operator.actions import is_destructive
from queues.services import deployment
from queues.steps.submission import processing_problem
from queues.zk.jobs import NOT_RESUMABLE
from queues.zk.records import Broken

register = template.Library()


@register.filter
def dom_id(value: object) -> str:
    """A name as a piece of an element's id: lowercase letters and digits, runs of anything
    else one ``-`` (``depositor:files.example.org:443`` -> ``depositor-files-example-org-443``)."""
    return re.sub(r"[^a-z0-9]+", "-", str(value).lower()).strip("-")


@register.filter
def age(seconds: float | None) -> str:
    return human_age(seconds)


@register.filter
def when(value: datetime | str | None, precision: str = "seconds") -> str:
    """``<time>`` in the console's one form (``queues/core/clock.py``), the exact UTC time on
    hover."""
    moment = clock_module.as_moment(value)
    if moment is None:
        return "" if value in (None, "") else str(value)
    iso = clock_module.exact(moment)
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        iso,
        iso,
        clock_module.clock_text(moment, precision),
    )


@register.filter
def timed(text: object) -> str:
    """A sentence from the console's own words (``held since 2026-11-25 10:04 PST by ada``),
    escaped, each time in it a ``<time>`` with the exact UTC time on hover, as ``when`` makes."""
    if isinstance(text, SafeData):
        return text  # type: ignore[return-value]  # markup already: not read as a sentence
    value = "" if text is None else str(text)
    parts: list[str] = []
    at = 0
    for match in clock_module.WRITTEN.finditer(value):
        moment = clock_module.from_text(match.group(1), match.group(2))
        if moment is None:
            continue
        iso = clock_module.exact(moment)
        parts.append(escape(value[at : match.start()]))
        parts.append(
            format_html('<time datetime="{}" title="{}">{}</time>', iso, iso, match.group(0))
        )
        at = match.end()
    parts.append(escape(value[at:]))
    return mark_safe("".join(parts))  # noqa: S308 - every part escaped or built by format_html


@register.filter
def clock(value: datetime | str | None, precision: str = "seconds") -> str:
    """The same written form as plain text, where no element may go (an attribute)."""
    return clock_module.clock_text(value, precision) if value not in (None, "") else ""


@register.filter
def item_url(item_id: str, kind: str) -> str:
    """The page of a job or batch by its ID ("" for another kind, or an ID no page takes)."""
    name = {"job": "job", "batch": "batch"}.get(kind)
    if name is None:
        return ""
    try:
        return reverse(name, args=[item_id])
    except NoReverseMatch:
        return ""


@register.filter
def left_to_merritt(job: Any) -> bool:
    """A job this console's daemons never process (written by Merritt's ingest, its payload on
    ingest's disk): a list says so beside its Resume."""
    config = getattr(job, "configuration", None)
    return isinstance(config, dict) and processing_problem(config) is not None


@register.filter
def resumes_to_processing(queue: str) -> bool:
    """Whether a request of access queue ``queue`` may be resumed to Processing here: only when
    this deployment's own consumer serves the queue (``services.moves.access_resume`` refuses
    it otherwise; a deployment setting that cannot be read offers Pending only)."""
    try:
        return deployment.runs_access(queue)
    except deployment.DeploymentError:
        return False


@register.filter
def folder_words(folder: str) -> str:
    """A batch index folder as people say it: ``batch-completed`` -> ``completed``."""
    return BATCH_FOLDER_WORDS.get(folder, folder)


@register.filter
def since(moment: datetime | None) -> str:
    """How long ago ``moment`` was ("5m"), by the ZooKeeper server's clock: the one that
    stamped node times, and the one the daemons read, where this web host's may be minutes off
    (``job_reads.shown_now``)."""
    if moment is None:
        return ""
    return human_age(shown_now() - moment.timestamp())


@register.filter
def ended(moment: datetime | None) -> bool:
    """Whether ``moment`` (a maintenance window's end) is past by the server's clock, as the
    maintenance daemon that releases the hold judges it."""
    return moment is not None and moment.timestamp() <= shown_now()


@register.filter
def time_left(moment: datetime | None) -> str:
    """Django's ``timeuntil`` of ``moment``, from the server's time now rather than the host's."""
    if moment is None:
        return ""
    return timeuntil(moment, now=datetime.fromtimestamp(shown_now(), UTC))


@register.filter
def gb(value: int | None) -> str:
    return f"{(value or 0) / 1024**3:,.2f} GB"


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


@register.filter
def is_broken(item: Any) -> bool:
    return isinstance(item, Broken)


@register.filter
def get_item(mapping: Any, key: Any) -> Any:
    try:
        return mapping.get(key)
    except AttributeError:
        return None


@register.simple_tag
def state_badge(machine: str, state: str) -> str:
    """The state as text with a shape glyph; the class only adds colour."""
    m = MACHINES[machine]
    known = m.is_state(state)
    shape = shape_of(m, state) if known else "unknown"
    glyph = GLYPHS.get(shape, "?" if not known else "")
    return format_html(
        '<span class="badge badge-{}" data-state="{}">{}{}</span>',
        shape,
        state,
        format_html('<span aria-hidden="true">{} </span>', glyph) if glyph else "",
        state if known else f"{state} (unknown state)",
    )


@register.simple_tag
def actions_for(machine: str, state: str, user: Any) -> list[dict[str, Any]]:
    """The actions a row may offer: allowed by the state machine AND by the user's role."""
    m = MACHINES[machine]
    return [
        {"name": a, "destructive": is_destructive(machine, a)}
        for a in m.actions_for(state)
        if auth.may(user, machine, a)
    ]


@register.simple_tag
def may(user: Any, kind: str, action: str) -> bool:
    return auth.may(user, kind, action)


@register.filter
def role(user: Any) -> str:
    return auth.role_of(user) or "no role"


MESSAGE_HEAD = 60
MESSAGE_TAIL = 40


@register.simple_tag
def message_cell(message: str | None) -> str:
    """A failure message in a list: whole when short; else its start and its end (where the
    digest mismatch or the HTTP status usually is), with the full text one click away."""
    text = message or ""
    if not text:
        return format_html('<span class="muted">{}</span>', "—")
    if len(text) <= MESSAGE_HEAD + MESSAGE_TAIL + 10:
        return format_html('<span class="msg">{}</span>', text)
    return format_html(
        '<details class="msg"><summary title="{}"><span class="msg-head">{}</span>'
        '<span aria-hidden="true"> … </span><span class="msg-tail">{}</span>'
        ' <span class="msg-more">show all<span class="visually-hidden"> of the message</span>'
        '</span><span class="msg-less">show less<span class="visually-hidden"> of the message'
        '</span></span></summary><div class="msg-full">{}</div></details>',
        text,
        text[:MESSAGE_HEAD],
        text[-MESSAGE_TAIL:],
        text,
    )


_SERVER = "This failure will repeat unless the depositor's server changes: "
# (pattern in a failure message, the sentence shown beside Resume); the first match wins.
_WILL_REPEAT = [
    (
        re.compile(r"\bdigest\b.*\bdoes not match\b", re.I | re.S),
        _SERVER + "the digest does not match.",
    ),
    # The fetch's own words: "<url>: HTTP 404 Not Found" (not another service's HTTP 404).
    (re.compile(r"https?://\S+: HTTP 404\b"), _SERVER + "it answered HTTP 404 (not found)."),
    (re.compile(r"https?://\S+: HTTP 410\b"), _SERVER + "it answered HTTP 410 (gone)."),
    (
        re.compile(r"which is not fetched for depositors"),
        "This failure will repeat unless the URL changes: it is one the console is not allowed to"
        " fetch (not fetched for depositors).",
    ),
    (
        re.compile(r"links are not accepted in containers"),
        _SERVER + "the container holds links, and links are not accepted in containers.",
    ),
    (
        re.compile(
            r"\b(?:file name|member) ['\"].*?['\"] "
            r"(?:is absolute|contains|already used|repeated|is not under)"
        ),
        "This failure will repeat unless the depositor's manifest or container changes: a file"
        " name is refused.",
    ),
    (
        re.compile(r"compression-ratio limit"),
        "This failure will repeat unless the object or the limit changes: it unpacks past the"
        " compression-ratio limit.",
    ),
    (
        re.compile(r"(?:larger|more) than the (?:per-object )?limit of"),
        "This failure will repeat unless the object or the limit changes: it is larger than the"
        " per-object limit.",
    ),
]


@register.filter
def will_repeat(message: str | None) -> str:
    """A sentence for a failure that a resume will only repeat as it is (a digest mismatch, an
    HTTP 404/410 from the depositor's server, a refused URL, a refused file name, links in a
    container, an object over a size or compression-ratio limit); "" for any other failure.

    A message starting with "Not resumable: " gets "": the service refuses that resume and says
    why. Resume stays offered for the others: the depositor may have fixed the cause since."""
    text = message or ""
    if not text or text.startswith(NOT_RESUMABLE):
        return ""
    for pattern, sentence in _WILL_REPEAT:
        if pattern.search(text):
            return sentence
    return ""
