"""The daemons' side of retries (``queues.core.retries``): the policies from settings, the jobs this
process passes over until their next try, and the record of a wait on the job.

A job whose step met an outage of a service outside is given back with its next try written
on its status; every loop that finds it passes it over, unlocked, until then: this process's
own from ``RetryWaits`` without locking it at all, another process's after one look under the
lock (``due_later``), after which it too passes it over.

The times written on a job (its first failure, its next try) are the ZooKeeper server's
(``queues/zk/servertime.py``), as are the "now"s they are compared with: another host reads the
wait a host wrote, and a host whose clock is off by minutes would otherwise try minutes early or
late, or give a job up before its policy's window. ``RetryWaits`` keeps each wait as a deadline
on this process's monotonic clock, so a step of the local clock shortens or lengthens none.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from queues.core import retries
from queues.core.clock import clock_text
from queues.zk.jobs import job_retry_later
from queues.zk.records import Job
from queues.zk.servertime import server_now

_policies: dict[str, tuple[str, retries.Policy]] = {}
_policies_lock = threading.Lock()


def setting_name(name: str) -> str:
    return f"MRT_RETRY_{name.upper()}"


def policy_for(service: str) -> retries.Policy:
    """The retry policy of ``service`` (``retries.policy_name``), as ``MRT_RETRY_<NAME>``
    sets it over the defaults; ImproperlyConfigured naming the variable when it is malformed."""
    name = retries.policy_name(service)
    text = getattr(settings, "MRT_RETRY", {}).get(name, "")
    with _policies_lock:
        known = _policies.get(name)
        if known is not None and known[0] == text:
            return known[1]
    try:
        policy = retries.parse_policy(text, retries.DEFAULT_POLICIES[name])
    except ValueError as exc:
        raise ImproperlyConfigured(f"{setting_name(name)}: {exc}") from None
    with _policies_lock:
        _policies[name] = (text, policy)
    return policy


def check_policies() -> None:
    """Parse every policy now (a daemon's start): a malformed setting stops it at once."""
    for name in retries.SERVICES:
        policy_for(name)


class RetryWaits:
    """Jobs this loop passes over until their next try; and those it found waiting for a held
    service (``note_held``), passed over while it stays held.

    Times are given in epoch seconds of ``clock`` (the ZooKeeper server's, ``server_now``, in
    the daemons; the local clock without one) and kept as this process's monotonic deadlines."""

    LIMIT = 100_000

    def __init__(
        self,
        held: Callable[[], frozenset[str]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._until: dict[str, float] = {}  # jid -> monotonic deadline
        # jid -> (the held services it waits for, monotonic time it is looked at again anyway)
        self._held: dict[str, tuple[frozenset[str], float]] = {}
        self._held_now = held  # the services held now, from a watch: no request
        self._clock = clock
        self._lock = threading.Lock()

    def now(self) -> float:
        """Now on the clock the waits are given in."""
        return self._clock()

    def _deadline(self, until: float) -> float:
        """``until`` (epoch seconds of the clock) as a monotonic deadline."""
        return time.monotonic() + (until - self._clock())

    def note(self, jid: str, until: float) -> None:
        self.note_in(jid, until - self._clock())

    def note_in(self, jid: str, seconds: float) -> None:
        """``jid`` is passed over for ``seconds`` from now."""
        deadline = time.monotonic() + seconds
        with self._lock:
            if len(self._until) >= self.LIMIT:
                now = time.monotonic()
                self._until = {j: t for j, t in self._until.items() if t > now}
            self._until[jid] = deadline

    def note_held(self, jid: str, services: list[str], until: float) -> None:
        """``jid`` waits for ``services`` (held now): passed over by its ID while any of them
        stays held, up to ``until``, instead of being claimed again and again to be found
        waiting (a lock written and deleted a job a turn while a breaker is open)."""
        if self._held_now is None:
            return
        until = self._deadline(until) if math.isfinite(until) else until
        with self._lock:
            if len(self._held) >= self.LIMIT:
                self._held.clear()  # each looked at once more under its lock: no worse
            self._held[jid] = (frozenset(services), until)

    def __bool__(self) -> bool:
        """Whether any job may be passed over (a listing asks each listed job only then). The
        jobs noted for a hold are let go once no service is held: those the loop does not list
        again (taken elsewhere once the hold went) would keep every listing asking."""
        if self._until:
            return True
        if not self._held:
            return False
        if self._held_now is not None and self._held_now():
            return True
        with self._lock:
            self._held.clear()
        return False

    def __call__(self, jid: str) -> bool:
        return self.waits(jid)

    def waits(self, jid: str) -> bool:
        """Whether ``jid`` is to be passed over now (the listing's skip)."""
        until = self._until.get(jid)
        if until is not None:
            if until > time.monotonic():
                return True
            with self._lock:
                if self._until.get(jid) == until:
                    del self._until[jid]
        held = self._held.get(jid)
        if held is None or self._held_now is None:
            return False
        services, end = held
        if end > time.monotonic() and services & self._held_now():
            return True
        with self._lock:
            if self._held.get(jid) == held:
                del self._held[jid]
        return False

    def forget(self, jid: str) -> None:
        """``jid`` is not passed over any more (a job found waiting under its lock for a later
        try is noted again: ``due_later``)."""
        with self._lock:
            self._until.pop(jid, None)
            self._held.pop(jid, None)

    def due_later(self, job: Job) -> bool:
        """Whether ``job`` (read under its lock) waits for a later try; noted if so."""
        until = retries.next_try(job.status.raw)
        if until is None or until <= self._clock():
            return False
        self.note(job.jid, until)
        return True


def when(epoch: float) -> str:
    return clock_text(datetime.fromtimestamp(epoch, UTC))


def retry_later(
    zk: Any, job: Job, step: str, outage: retries.ServiceUnavailable, reason: str
) -> tuple[bool, str, float]:
    """Decide and record the job's next try after ``outage`` (met by ``step``, ``reason``:
    the step's own words). (True, the waiting message, next try) once written on the job; or
    (False, the Failed message with every try's reason, 0) when the policy is spent."""
    policy = policy_for(outage.service)
    now = server_now(zk)  # the clock every host reads the job's times with
    decision = retries.decide(policy, job.status.raw, outage, now=now)
    if not decision.retry:
        tries = retries.history_text(decision.reasons, when)
        message = (
            f"{step}: {reason} (gave up after {decision.attempt} tries of "
            f"{outage.service}: {tries})"
        )
        return False, message, 0.0
    message = (
        f"{step}: waiting to try again, try {decision.attempt + 1} of {decision.attempts} "
        f"at {when(decision.next_at)}: {reason}"
    )
    job_retry_later(zk, job, decision.state, message)
    return True, message, decision.next_at
