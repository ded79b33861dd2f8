"""The breaker of each storage node: a node that keeps answering "not now" is held by itself,
and released by itself once it answers again.

Every consumer process counts, per storage node, the outages its steps meet in a row
(``queues.retries``: refused or reset connections, time-outs, 408, 429, 5xx). At
``MRT_BREAKER_FAILURES`` of them within ``MRT_BREAKER_WINDOW`` seconds, with no step for that
node going through in between, the breaker opens: the node is held as an operator would hold it
(``queues.zk.maintenance``), by ``BREAKER``, with the cause as its reason ("breaker: 5 x 503 from
node 9501 in 12 s"). Its jobs then wait unclaimed before Storing and Recording, the node-held
alert says so with that reason, and the holds page, the overview and the API show it like any
node hold. The maintenance daemon probes each node the breaker holds, at 5 s and then a doubling
interval up to 5 minutes; the first answer that is not "not now" closes the breaker (the hold
goes, only if it is still the breaker's), the jobs go on and the alert resolves.

An operator opens a breaker by holding the node and closes it by releasing the hold, on the
holds page or the API, audited as every hold; a hold placed by an operator is never released by
a probe. Merritt's own storage consumer does not read these holds: beside Merritt its storage
service keeps taking the Storing jobs it owns and retries them its own way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

import requests
from django.conf import settings

from queues import audit, retries
from queues.steps.merritt_wire import service_session, unavailable_answer
from queues.zk.maintenance import (
    BREAKER,
    NODE_RE,
    breaker_hold_clear,
    node_hold_set,
    node_holds,
)

log = logging.getLogger("queues.daemons")

PROBE_FIRST = 5.0
PROBE_MOST = 300.0
STORAGE_NODE = "storage node "


def storage_node(service: str) -> int | None:
    """The node of a service name like ``storage node 9501``; None for any other service."""
    if not service.startswith(STORAGE_NODE):
        return None
    number = service[len(STORAGE_NODE) :]
    return int(number) if NODE_RE.fullmatch(number) else None


def _short(reason: str) -> str:
    """``503`` of ``HTTP 503 Service Unavailable``; the words of anything else, shortened."""
    words = reason.split()
    if len(words) > 1 and words[0] == "HTTP" and words[1].isdigit():
        return words[1]
    text = " ".join(words)
    return text if len(text) <= 60 else text[:57] + "..."


class Breakers:
    """The counts of one process and the probes of the nodes its breakers hold."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[int, deque[tuple[float, str]]] = {}
        self._probes: dict[int, tuple[float, float]] = {}  # node -> (next probe, interval)

    def failed(self, zk: Any, service: str, reason: str) -> bool:
        """Count one outage of ``service``; True when it opened the node's breaker."""
        node = storage_node(service)
        if node is None:
            return False
        limit = settings.MRT_BREAKER_FAILURES
        window = settings.MRT_BREAKER_WINDOW
        now = time.monotonic()
        with self._lock:
            run = self._runs.setdefault(node, deque())
            run.append((now, _short(reason)))
            while run and now - run[0][0] > window:
                run.popleft()
            if len(run) < limit:
                return False
            span = now - run[0][0]
            causes = [cause for _, cause in run]
            count = len(run)
            run.clear()
        cause = max(set(causes), key=causes.count)
        why = f"breaker: {count} x {cause} from node {node} in {span:.0f} s"
        if not node_hold_set(zk, node, by=BREAKER, reason=why):
            return False  # held already (another process's breaker, or an operator)
        log.warning("storage node %d held: %s", node, why)
        _audit("hold", node, why)
        return True

    def worked(self, service: str) -> None:
        """A step of ``service`` went through: its run of outages is over."""
        node = storage_node(service)
        if node is not None and node in self._runs:
            with self._lock:
                self._runs.pop(node, None)

    def probe(self, zk: Any, *, now: float | None = None) -> list[int]:
        """Probe each node a breaker holds whose probe is due; the nodes whose breaker closed."""
        base = settings.MRT_STORAGE_URL
        if not base:
            return []
        moment = time.monotonic() if now is None else now
        held = {n: h for n, h in node_holds(zk).items() if h.by == BREAKER}
        closed = []
        with self._lock:
            for node in list(self._probes):
                if node not in held:
                    del self._probes[node]
            due = []
            for node in held:
                at, interval = self._probes.setdefault(node, (moment + PROBE_FIRST, PROBE_FIRST))
                if at <= moment:
                    due.append(node)
        for node in due:
            if _answers(base, node):
                if breaker_hold_clear(zk, node, by=BREAKER):
                    log.info("storage node %d answers again: its breaker closed", node)
                    _audit("release", node, "the node answers again")
                    closed.append(node)
                with self._lock:
                    self._probes.pop(node, None)
            else:
                with self._lock:
                    _at, interval = self._probes.get(node, (moment, PROBE_FIRST))
                    interval = min(PROBE_MOST, interval * 2)
                    self._probes[node] = (moment + interval, interval)
        return closed


def _answers(base: str, node: int) -> bool:
    """Whether storage answers for ``node`` with anything but "not now": ``GET state/{node}``,
    the node's state document in Merritt's storage service."""
    url = f"{base.rstrip('/')}/state/{node}"
    session = service_session(retries=0, deadline=settings.MRT_HTTP_TIMEOUT)
    try:
        response = session.get(url, params={"t": "xml"}, timeout=settings.MRT_HTTP_TIMEOUT)
    except requests.RequestException:
        return False
    finally:
        session.close()
    return unavailable_answer(f"{STORAGE_NODE}{node}", response) is None


def _audit(action: str, node: int, reason: str) -> None:
    try:
        audit.record(
            user=None,
            action=action,
            kind="node",
            item_id=str(node),
            before="released" if action == "hold" else "held",
            after="held" if action == "hold" else "released",
            reason=reason,
            detail="by the storage node's breaker",
            via="daemon",
        )
    except Exception as exc:  # the hold stands; the log says what the entry would have said
        log.warning("breaker %s of node %d not audited: %s", action, node, exc)


_breakers = Breakers()


def breakers() -> Breakers:
    """This process's breakers."""
    return _breakers


def note_outage(zk: Any, outage: retries.ServiceUnavailable) -> None:
    breakers().failed(zk, outage.service, outage.reason)
