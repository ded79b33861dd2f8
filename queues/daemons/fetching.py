"""Downloads under way per depositor server, so one slow depositor cannot hold every
downloading loop of a process (the policy itself is in queues/services/depositors.py)."""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from queues.core.retries import url_server
from queues.steps.netpolicy import (
    FetchPolicy,
    FetchRefused,
    TransferFailed,
    connect_key,
)

# How long a host's resolved address is reused for the cap: a job passed over is asked about
# again on every claim, and a DNS query each time would cost more than the answer is worth.
ADDRESS_SECONDS = 30.0
_ADDRESS_ENTRIES = 4096


@functools.lru_cache(maxsize=4096)
def depositor_host(url: str) -> str:
    """The host a payload URL names, lowercased ("" for file:// URLs). Kept for the URLs
    asked last: a job's URL is asked about by every loop that takes or hands it on."""
    return (urlsplit(url).hostname or "").lower()


def depositor_server(url: str) -> str:
    """The server a payload URL names: its host, lowercased, and port (the scheme's when none
    is written), as ``host:port`` ("" for file:// URLs). Two ports of one host are two servers.
    ValueError when the port is not one."""
    return url_server(url)


class ServerKeys:
    """What the per-host cap counts a payload URL under: the address the policy connects to.

    ``127.0.0.2``, ``127.2``, ``2130706434``, ``0x7f.2`` and ``[::ffff:127.0.0.2]`` are one
    server, and so are two names of one address; counting the host as written would give one
    server a slot per spelling. A URL the policy refuses or cannot resolve now is counted under
    its host as written: its download fails, or waits, whatever the count.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[str, tuple[float, str]] = {}

    def key(self, url: str, policy: FetchPolicy) -> str:
        host = depositor_host(url)
        if not host:
            return ""
        now = time.monotonic()
        with self._lock:
            known = self._known.get(host)
        if known is not None and known[0] > now:
            return known[1]
        try:
            _name, _port, ip = policy.resolve(url)
        except (FetchRefused, TransferFailed):
            # Kept as long as an address: a refused host's jobs are looked at as often as any,
            # and asking the resolver again for each of them changes nothing about its count.
            key = host
        else:
            key = connect_key(ip)
        with self._lock:
            if len(self._known) >= _ADDRESS_ENTRIES:
                self._known.clear()
            self._known[host] = (now + ADDRESS_SECONDS, key)
        return key


class HostSlots:
    """Downloads under way per depositor server in this process, at most ``per_host`` each.

    A consumer asks before it takes a job (``try_take``) and passes over a job whose server is
    full, so one slow depositor occupies at most ``per_host`` download threads, never all.
    """

    # A job passed over is remembered this long (it is looked at again far sooner) so that the
    # process's registration can say what it waits for.
    PASSED_SECONDS = 60.0
    PASSED_SHOWN = 50

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy: Counter[str] = Counter()
        self._passed: dict[str, tuple[str, float]] = {}  # job -> (server, when passed over)
        self._held: dict[str, str] = {}  # job -> the server whose slot it took (``job=``)
        # The wake-ups of the loops waiting for a slot: a slot given back sets them.
        self._waiters: weakref.WeakSet[threading.Event] = weakref.WeakSet()

    def subscribe(self, event: threading.Event) -> None:
        """Set ``event`` whenever a slot is given back."""
        with self._lock:
            self._waiters.add(event)

    def try_take(self, host: str, per_host: int, *, job: str = "") -> bool:
        """Take a slot of ``host`` if it has one free. With ``job``, the slot is the job's: it
        takes one at most, and ``give_back_job`` gives it back (once, however often asked)."""
        with self._lock:
            if job and job in self._held:
                return True
            if host and self._busy[host] >= per_host:
                if job:
                    self._passed[job] = (host, time.monotonic())
                return False
            self._busy[host] += 1
            if job:
                self._held[job] = host
                self._passed.pop(job, None)
            return True

    def note_passed(self, jobs: dict[str, str]) -> None:
        """Note jobs passed over for their server's cap without asking for a slot (job ->
        server; a listing's screen notes as many as ``passed_over`` shows)."""
        now = time.monotonic()
        with self._lock:
            for job, host in jobs.items():
                self._passed[job] = (host, now)

    def give_back_job(self, job: str) -> None:
        """Give back the slot ``job`` took, if it holds one."""
        with self._lock:
            host = self._held.pop(job, None)
        if host is not None:
            self.give_back(host)

    def passed_over(self) -> dict[str, str]:
        """Jobs passed over lately because their server was at its cap: job -> server."""
        cutoff = time.monotonic() - self.PASSED_SECONDS
        with self._lock:
            for job in [j for j, (_h, t) in self._passed.items() if t < cutoff]:
                del self._passed[job]
            recent = sorted(self._passed.items(), key=lambda kv: -kv[1][1])
            return {job: host for job, (host, _t) in recent[: self.PASSED_SHOWN]}

    def give_back(self, host: str) -> None:
        with self._lock:
            self._busy[host] -= 1
            if self._busy[host] <= 0:
                del self._busy[host]
            waiters = list(self._waiters)
        for event in waiters:
            event.set()

    def busy(self, host: str) -> int:
        with self._lock:
            return self._busy[host]

    def full(self, per_host: int) -> bool:
        """Whether any server has all ``per_host`` of its slots taken."""
        with self._lock:
            return any(count >= per_host for count in self._busy.values())

    @contextmanager
    def holding(self, host: str) -> Iterator[None]:
        try:
            yield
        finally:
            self.give_back(host)


HOST_SLOTS = HostSlots()
SERVER_KEYS = ServerKeys()
