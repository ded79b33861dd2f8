"""One clock (issue 25): the one written form of a time everywhere the console shows, mails or
exports one. The console's zone is Django's TIME_ZONE (``TZ``, by default the server's)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from django.utils import timezone

from queues.core.moments import aware

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
