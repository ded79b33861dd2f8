"""One clock (issue 25): the one written form of a time everywhere the console shows, mails or
exports one. The console's zone is Django's TIME_ZONE (``TZ``, by default the server's)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from django.utils import timezone

from queues.core.moments import EARLIEST, LATEST, aware, inside

FORMATS = {
    "seconds": "%Y-%m-%d %H:%M:%S %Z",
    "minutes": "%Y-%m-%d %H:%M %Z",
    "date": "%Y-%m-%d",  # a day in the console's zone (the day an item was archived)
}
# The contract's stamp (``2026-11-21 10:02:03 -0800``), as status nodes and reports keep it.
STAMP = "%Y-%m-%d %H:%M:%S %z"


def as_moment(value: datetime | str | None) -> datetime | None:
    """A datetime, or its ISO-8601 or contract-stamp text; a naive one is taken as UTC."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            try:
                moment = datetime.strptime(text, STAMP)
            except ValueError:
                return None
    else:
        return None
    return aware(moment, local=False)


def clock_text(value: datetime | str | None, precision: str = "seconds") -> str:
    """``2026-11-25 10:04:40 PST``: in the console's zone, to the second (or minute); the
    text itself when it is no time."""
    moment = as_moment(value)
    if moment is None:
        return "" if value is None else str(value)
    return timezone.localtime(moment).strftime(FORMATS.get(precision, FORMATS["seconds"]))


def exact(value: datetime | str | None) -> str:
    """The exact time in UTC, ISO-8601, for a hover or a machine."""
    moment = as_moment(value)
    return moment.astimezone(UTC).isoformat(timespec="seconds") if moment else ""


# A time of day in the one form inside a sentence (``held since 2026-11-25 10:04 PST by ada``):
# the zone is the console's, named by strftime's ``%Z`` (``PST``, ``UTC``, or ``-03`` where the
# zone has no abbreviation).
WRITTEN = re.compile(
    r"\b(\d{4}-\d{2}-\d{2} \d{2}:\d{2}(?::\d{2})?) ([A-Z]{2,5}|[+-]\d{2}(?:\d{2})?)(?![\w+-])"
)


def from_text(day_and_time: str, zone_name: str) -> datetime | None:
    """The moment a ``clock_text`` wrote, read back in the console's zone (the zone's name
    decides the hour a clock change writes twice); None when it is not one."""
    for form in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"):
        try:
            naive = datetime.strptime(day_and_time, form)
            break
        except ValueError:
            continue
    else:
        return None
    zone = timezone.get_current_timezone()
    for fold in (0, 1):
        moment = naive.replace(tzinfo=zone, fold=fold)
        if moment.tzname() == zone_name:
            return moment
    return None  # written in another zone than the console's: left as it is


# A time an operator gives (a hold's end, a window's bounds) ---------------------------------
# Read in the console's zone, as it writes times: ``2026-11-25 10:04`` (or ISO's ``T``, with
# seconds or not), the written form with the zone's name (``2026-11-01 01:30 PST``), or ISO-8601
# with an offset or ``Z`` (any zone: an exact instant). A local time the clocks skip (spring
# forward) is refused; one they show twice (fall back) is refused unless the zone's name or an
# offset says which. Nothing is shifted to a neighbouring hour. docs/console.md ("Times").
_GIVEN = re.compile(r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}(?::\d{2})?)(?: ([A-Za-z]{2,5}))?")


def given_time(text: str) -> datetime | None:
    """The moment ``text`` names, in UTC (two moments in one ``ZoneInfo`` compare and subtract
    by their wall clocks, not as instants); None when it is no date and time in a form read here
    (the caller may try others); ValueError, saying why, for a local time the console's zone
    skips or shows twice, or a zone name the zone does not use then."""
    text = text.strip()
    match = _GIVEN.fullmatch(text)
    if match and match.group(3):
        day_and_time = f"{match.group(1)} {match.group(2)}"
        naive = _naive(day_and_time)
        moment = from_text(day_and_time, match.group(3).upper())
        if moment is not None and not _within(moment.replace(tzinfo=None)):
            return inside(moment).astimezone(UTC)  # the calendar's ends: no clock changes there
        if naive is None or moment is None or not _shows_as(moment, naive):
            why = _why_not(naive) if naive else ""
            names = _names_at(naive) if naive else ""
            raise ValueError(
                f"{text} is no time in {_zone_name()}: "
                + (why or f"the zone's clocks say {names} then")
            )
        return moment.astimezone(UTC)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is not None and moment.utcoffset() is not None:
        return inside(moment).astimezone(UTC)
    return local_time(moment)


def local_time(naive: datetime) -> datetime:
    """A wall-clock time in the console's zone, as the moment in UTC; ValueError, saying why
    and what to write instead, when the clocks skip it or show it twice."""
    naive = naive.replace(tzinfo=None, fold=0)
    if not _within(naive):  # the calendar's ends (year 1, 9999): no clock changes there
        return inside(naive.replace(tzinfo=timezone.get_current_timezone())).astimezone(UTC)
    problem = _why_not(naive)
    if problem:
        raise ValueError(f"{_plain(naive)} is no one time in {_zone_name()}: {problem}")
    return naive.replace(tzinfo=timezone.get_current_timezone()).astimezone(UTC)


def _why_not(naive: datetime) -> str:
    """Why a wall-clock time is no one moment in the console's zone; "" when it is one."""
    zone = timezone.get_current_timezone()
    first, second = (naive.replace(tzinfo=zone, fold=fold) for fold in (0, 1))
    if first.utcoffset() == second.utcoffset():
        return ""
    shown = _plain(naive)
    if _shows_as(first, naive):  # both readings are real: the hour the clocks go back
        return (
            f"the clocks go back that night and show it twice, first in {first.tzname()} "
            f"({_offset(first)}), then in {second.tzname()} ({_offset(second)}); say which, "
            f"as {shown} {first.tzname()} or {shown} {second.tzname()}"
        )
    return (
        f"it does not exist, the clocks go forward from {first.tzname()} to "
        f"{second.tzname()} that night and skip it; give a time before or after the change"
    )


def _within(naive: datetime) -> bool:
    """Whether a wall-clock time is far enough inside the calendar to move between zones."""
    return EARLIEST.replace(tzinfo=None) <= naive <= LATEST.replace(tzinfo=None)


def _names_at(naive: datetime) -> str:
    """The zone's name(s) for a wall-clock time: ``PST``, or ``PDT or PST`` in a repeated hour."""
    zone = timezone.get_current_timezone()
    names = dict.fromkeys(str(naive.replace(tzinfo=zone, fold=f).tzname()) for f in (0, 1))
    return " or ".join(names)


def _naive(day_and_time: str) -> datetime | None:
    for form in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"):
        try:
            return datetime.strptime(day_and_time, form)
        except ValueError:
            continue
    return None


def _plain(naive: datetime) -> str:
    return naive.strftime("%Y-%m-%d %H:%M:%S" if naive.second else "%Y-%m-%d %H:%M")


def _shows_as(moment: datetime, naive: datetime) -> bool:
    """Whether ``moment``, shown in the console's zone, reads the wall-clock time ``naive`` (a
    skipped local time does not: it comes back an hour on)."""
    local = timezone.localtime(moment.astimezone(UTC)).replace(tzinfo=None, fold=0)
    return local == naive.replace(tzinfo=None, fold=0)


def _offset(moment: datetime) -> str:
    text = moment.strftime("%z")
    return f"{text[:3]}:{text[3:]}"


def _zone_name() -> str:
    return str(timezone.get_current_timezone_name())
