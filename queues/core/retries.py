"""Retries of a job whose step met a service outside that cannot answer now.

A service outside the job (a storage node, inventory, EZID, a depositor's server, a callback
receiver) that refuses a connection, resets it, does not answer in time, or answers 408, 429 or
5xx has not judged the job: it is away or overloaded. The step's client says so by raising its
own error *from* a ``ServiceUnavailable`` (``unavailable``, ``http_unavailable``); a step's
error that has one along its chain of causes is retried, with exponential back-off and jitter,
until the service's ``Policy`` is spent. Anything else (a wrong digest, 400/404/410, a refused
identifier) fails the job at once, as before.

A job waiting for its next try keeps its state folder, its lock is released, and its status
keeps Merritt's five keys as the library writes them plus one the library ignores, ``RETRY_KEY``
(docs/zookeeper-contract-notes.md, "A job waiting to be tried again"). ``retry_count`` is not
touched: in Merritt's code it counts an operator's resumes.

Pure: the standard library only (the daemons read the policies from settings and write the
status).
"""

from __future__ import annotations

import email.utils
import functools
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from typing import Any
from urllib.parse import urlsplit

from queues.core.moments import seconds_inside
from queues.core.transient import causes
from queues.core.words import digits

# The status key of a job waiting to be tried again: {"state" (the state it waits in),
# "service", "attempt" (tries failed so far), "first" (epoch seconds of the first failure),
# "next" (epoch seconds of the next try), "reasons" (the last REASONS_KEPT failures,
# "<epoch> <reason>")}. Merritt's library copies a status's unknown keys into the next status
# it writes (QueueItem.statusObject), so the key may outlive a move made by Merritt's services:
# a record of another state than the status's own is ignored.
RETRY_KEY = "console_retry"
REASONS_KEPT = 12
REASON_MAX = 300

# The services a policy is kept for, and the part of a service name that picks its policy
# ("storage node 9501" -> storage).
SERVICES = ("storage", "inventory", "ezid", "depositor", "callback")
UNAVAILABLE_STATUSES = frozenset({408, 429})


@dataclass(frozen=True)
class Policy:
    """Tries in all (the first included), the wait before the second (seconds), the longest
    wait, and the time after the first failure past which no try is made."""

    attempts: int
    first: float
    most: float
    within: float

    def wait(self, failed: int, *, jitter: float | None = None) -> float:
        """The wait after the ``failed``-th failure in a row: ``first`` doubling, at most
        ``most``, and then between 50% and 100% of it (full jitter would let a flapping
        service's jobs come back at once)."""
        base = min(self.most, self.first * 2 ** min(max(failed - 1, 0), 32))
        share = random.random() if jitter is None else jitter
        return base * (0.5 + 0.5 * share)


# Defaults a Merritt operator would choose: an outage of a storage node, inventory or EZID is
# ridden out for a working day (a redeploy, a night's maintenance); a depositor's server gets
# a few tries over two hours (a hostile or dead URL should fail soon, with its reason); a
# callback receiver a day, as it only hears of work already done.
DEFAULT_POLICIES = {
    "storage": Policy(attempts=12, first=30, most=1800, within=12 * 3600),
    "inventory": Policy(attempts=12, first=30, most=1800, within=12 * 3600),
    "ezid": Policy(attempts=12, first=30, most=1800, within=12 * 3600),
    "depositor": Policy(attempts=5, first=60, most=1800, within=2 * 3600),
    "callback": Policy(attempts=10, first=60, most=3600, within=24 * 3600),
}

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def _seconds(text: str, what: str) -> float:
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{what}: {text!r} is not a duration (like 30, 30s, 5m, 12h, 2d)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_policy(text: str, default: Policy) -> Policy:
    """``attempts=12 first=30s most=30m within=12h`` (any of them, the rest from ``default``);
    ValueError naming what is wrong."""
    fields: dict[str, Any] = {
        "attempts": default.attempts,
        "first": default.first,
        "most": default.most,
        "within": default.within,
    }
    for part in text.split():
        key, sep, value = part.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"{part!r}: expected attempts=, first=, most= or within=")
        if key == "attempts":
            attempts = digits(value)
            if attempts is None or attempts < 1:
                raise ValueError(f"attempts={value!r}: a whole number, at least 1")
            fields[key] = attempts
        else:
            fields[key] = _seconds(value, key)
    policy = Policy(**fields)
    if policy.first <= 0 or policy.most < policy.first:
        raise ValueError("first must be above 0 and most at least first")
    return policy


class ServiceUnavailable(Exception):
    """A service outside answered "not now"; a client raises its own error from this.

    ``ours``: the answer is about the console, not the job (its credentials refused, its
    configured URL naming no endpoint of the service): every job would meet it alike, so the
    service's breaker opens at the first one (``queues.daemons.breakers``) and the jobs wait,
    unfailed, until the configuration is mended."""

    def __init__(
        self,
        service: str,
        reason: str,
        *,
        retry_after: float | None = None,
        probe: str = "",
        ours: bool = False,
    ) -> None:
        super().__init__(f"{service}: {reason}")
        self.service = service
        self.reason = reason
        self.retry_after = retry_after
        self.probe = probe  # where a breaker asks whether the service answers again ("": its own)
        self.ours = ours


def unavailable(
    service: str, error: BaseException | str, *, probe: str = "", ours: bool = False
) -> ServiceUnavailable:
    """The marker for a connection that failed, was reset or timed out (``ours``: an answer
    about the console's configuration, ``ServiceUnavailable``)."""
    text = error if isinstance(error, str) else (str(error) or type(error).__name__)
    return ServiceUnavailable(service, " ".join(text.split())[:REASON_MAX], probe=probe, ours=ours)


_PORTS = {"http": 80, "https": 443}


def server_of_url(url: str) -> str:
    """``host:port`` of a URL, the host lowercased and the port the scheme's when none is
    written (``[::1]:8080`` for an IPv6 address); "?" when the URL names none."""
    try:
        return url_server(url) or "?"
    except ValueError:
        return "?"


def url_server(url: str) -> str:
    """``host:port`` of a URL as ``server_of_url`` gives it, "" when it names no host (a
    file:// URL); ValueError when its port is not one. A loop asks this of every job it takes
    (its depositor's server), so the answer is kept by the URL's scheme and authority: the
    part ``urlsplit`` reads it from."""
    origin = _ORIGIN.match(url)
    if origin is not None and origin.end() < len(url) and url[origin.end()] not in "/?#":
        origin = None  # a character urlsplit would take out or stop at first: parsed whole
    return _server_of(origin.group() if origin is not None else url)


# A URL's scheme and authority up to where urlsplit ends the authority, without the characters
# urlsplit takes out of a URL (tab, CR, LF) or strips from its start.
_ORIGIN = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^/?#\t\r\n]*")


@functools.lru_cache(maxsize=4096)
def _server_of(url: str) -> str:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not host:
        return ""
    port = parts.port or _PORTS.get(parts.scheme.lower(), 0)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def service_at(kind: str, url: str) -> str:
    """The service name of a server outside by its URL: ``depositor example.org:443``."""
    return f"{kind} {server_of_url(url)}"


def origin_of(url: str) -> str:
    """The root of a URL's server (``https://example.org:8443/``): what a breaker probes."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    if parts.scheme.lower() not in _PORTS or not parts.netloc:
        return ""
    return f"{parts.scheme.lower()}://{parts.netloc.rsplit('@', 1)[-1]}/"


def retry_after_seconds(value: str | None, *, now: float) -> float | None:
    """A ``Retry-After`` header's wait in seconds (a number or an HTTP date); None if absent or
    unreadable."""
    if not value:
        return None
    text = value.strip()
    seconds = digits(text)
    if seconds is not None:
        return float(seconds)
    try:
        moment = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, moment.timestamp() - now)


def is_unavailable_status(status: int) -> bool:
    return status in UNAVAILABLE_STATUSES or 500 <= status <= 599


def http_unavailable(
    service: str, status: int, reason: str, retry_after: str | None = None, *, now: float
) -> ServiceUnavailable | None:
    """The marker for an answer that means "not now" (408, 429, 5xx); None for any other."""
    if not is_unavailable_status(status):
        return None
    return ServiceUnavailable(
        service,
        f"HTTP {status} {' '.join(reason.split())}".strip()[:REASON_MAX],
        retry_after=retry_after_seconds(retry_after, now=now),
    )


def outage_of(exc: BaseException) -> ServiceUnavailable | None:
    """The ``ServiceUnavailable`` along ``exc``'s causes, if any."""
    for cause in causes(exc):
        if isinstance(cause, ServiceUnavailable):
            return cause
    return None


def policy_name(service: str) -> str:
    """Which policy a service name falls under ("storage node 9501" -> "storage")."""
    first = service.split(" ", 1)[0].lower()
    return first if first in SERVICES else "storage"


@dataclass(frozen=True)
class Decision:
    """What an outage means for the job: ``retry`` at ``next_at`` (epoch seconds), with the
    status key to write; or not (the policy is spent), with every failure's reason."""

    retry: bool
    attempt: int  # failures so far, this one included
    attempts: int  # the policy's tries in all
    next_at: float
    state: dict[str, Any]
    reasons: list[str]


def current(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The retry record of a status JSON ``raw``, when it is one of the status's own state."""
    record = raw.get(RETRY_KEY)
    if isinstance(record, dict) and record.get("state") == raw.get("status"):
        return record
    return None


def decide(
    policy: Policy,
    raw: dict[str, Any],
    outage: ServiceUnavailable,
    *,
    now: float,
    jitter: float | None = None,
) -> Decision:
    """The next try after ``outage`` of a job whose status JSON is ``raw`` (a retry record of
    another state, or a malformed one, counts as none). A server's ``Retry-After`` is honoured
    when it asks for longer than the back-off, up to ``policy.most``."""
    earlier = current(raw) or {}
    attempt = _count(earlier.get("attempt")) + 1
    first = _moment(earlier.get("first"), now)
    kept = [r for r in earlier.get("reasons", []) if isinstance(r, str)][-(REASONS_KEPT - 1) :]
    reason = f"{int(now)} {outage}"[:REASON_MAX]
    reasons = [*kept, reason]
    wait = policy.wait(attempt, jitter=jitter)
    if outage.retry_after is not None:
        wait = min(policy.most, max(wait, outage.retry_after))
    next_at = now + wait
    spent = attempt >= policy.attempts or next_at - first > policy.within
    state = {
        "state": raw.get("status"),
        "service": outage.service,
        "attempt": attempt,
        "first": round(first, 3),
        "next": round(next_at, 3),
        "reasons": reasons,
    }
    return Decision(
        retry=not spent,
        attempt=attempt,
        attempts=policy.attempts,
        next_at=next_at,
        state=state,
        reasons=reasons,
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _moment(value: Any, default: float) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(min(value, default))
    return default


def next_try(raw: dict[str, Any]) -> float | None:
    """When a job whose status JSON is ``raw`` may be tried again (epoch seconds); None when it
    is not waiting for a retry."""
    value = current(raw)
    if value is None:
        return None
    moment = value.get("next")
    if isinstance(moment, (int, float)) and not isinstance(moment, bool) and math.isfinite(moment):
        return seconds_inside(float(moment))  # anyone may have written it: shown as a date
    return None


def history_text(reasons: list[str], when: Callable[[float], str]) -> str:
    """Every failure of a retried step, oldest first (``when`` writes a moment), for a Failed
    job's message."""
    parts = []
    for reason in reasons:
        stamp, _, text = reason.partition(" ")
        try:
            moment = when(float(stamp))
        except (ValueError, OverflowError, OSError):
            moment, text = "", reason
        parts.append(f"{moment} {text}".strip())
    return "; ".join(parts)
