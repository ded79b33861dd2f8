"""A time read from outside (a ZooKeeper node Merritt's library or anyone wrote, a depositor's
manifest, a request), made safe to compare, convert and show. Python's datetime raises on the
calendar's edges: year 1 read as local time is a ValueError, and a time within a day of year 1
or 9999 moved to another zone an OverflowError. Such times are kept two days inside the ends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

EARLIEST = datetime.min.replace(tzinfo=UTC) + timedelta(days=2)
LATEST = datetime.max.replace(tzinfo=UTC) - timedelta(days=2)


def inside(moment: datetime) -> datetime:
    """An aware ``moment`` as it is, or, past either end, that end (in UTC)."""
    if moment < EARLIEST:
        return EARLIEST
    if moment > LATEST:
        return LATEST
    return moment


def aware(moment: datetime, *, local: bool = True) -> datetime:
    """``moment`` with a zone, inside the calendar: a naive one is taken as this machine's
    local time (``local``) or as UTC, and as UTC where the local one cannot be worked out."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        naive = moment.replace(tzinfo=None)
        if local and EARLIEST.replace(tzinfo=None) <= naive <= LATEST.replace(tzinfo=None):
            try:
                return inside(naive.astimezone())
            except (ValueError, OverflowError):
                pass
        moment = naive.replace(tzinfo=UTC)
    return inside(moment)


def seconds_inside(epoch: float) -> float:
    """Epoch seconds inside the same ends: what ``datetime.fromtimestamp`` takes."""
    return min(max(epoch, _EARLIEST_SECONDS), _LATEST_SECONDS)


_EARLIEST_SECONDS = EARLIEST.timestamp()
_LATEST_SECONDS = LATEST.timestamp()
