"""What the one-job loops pass over unclaimed, by listing (issue 51): jobs waiting for their
next try that this loop has not claimed itself.

A job given back to be tried later carries its next try on its status (``queues.core.retries``).
The loop that gave it back passes it over by ID (``RetryWaits``); another loop learnt it only
by claiming the job, reading it and giving it back: once per job, but with 100,000 jobs waiting
that was 300,000 requests for each of a process's four downloading loops. Once a loop knows of
one job waiting for a try (its ``RetryWaits`` is not empty), ``RetryScreen`` reads the statuses
of the listed jobs it has not seen, 200 to a request (``multiRead``), and notes those whose
next try is later; a job seen is not read again while it stays in the folder. While the loop
knows of none, nothing is read. The check under the lock stays (``JobDaemon._accept``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from queues.core import retries
from queues.zk import paths as zpaths
from queues.zk.codecs import decode_json
from queues.zk.errors import MalformedNode
from queues.zk.nodes import read_many

from .retrying import RetryWaits

Screen = Callable[[list[str]], list[str]]
CHUNK = 200  # statuses read a request


class RetryScreen:
    """See the module's docstring. One per loop, called from its thread only."""

    def __init__(self, zk: Any, waits: RetryWaits) -> None:
        self.zk = zk
        self.waits = waits
        self._seen: set[str] = set()  # listed jobs read already

    def __call__(self, names: list[str]) -> list[str]:
        if not self.waits:
            self._seen.clear()
            return names
        jids = {name: zpaths.entry_jid(name) for name in names}
        listed = {jid for jid in jids.values() if jid is not None}
        self._seen &= listed
        unknown = [jid for jid in listed if jid not in self._seen]
        now = self.waits.now()  # the clock of the waits written on the jobs
        for start in range(0, len(unknown), CHUNK):
            part = unknown[start : start + CHUNK]
            found = read_many(self.zk, [zpaths.job_node(jid, "status") for jid in part])
            for jid in part:
                self._seen.add(jid)
                path = zpaths.job_node(jid, "status")
                read = found[path]
                if read is None:
                    continue
                try:
                    # Another client's node: nested past the parser it raised RecursionError,
                    # which ended the loop's listing (decode_json says MalformedNode).
                    raw = decode_json(path, read[0])
                except MalformedNode:
                    continue  # the claim reads it and says what is wrong
                until = retries.next_try(raw) if isinstance(raw, dict) else None
                if until is not None and until > now:
                    self.waits.note(jid, until)
        return [name for name, jid in jids.items() if jid is None or not self.waits.waits(jid)]


def chained(*screens: Screen | None) -> Screen | None:
    """The screens one after another (None: none)."""
    present = [s for s in screens if s is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]

    def chain(names: list[str]) -> list[str]:
        for screen in present:
            names = screen(names)
        return names

    return chain
