"""The breaker of each storage node: a node that keeps answering "not now" is held by itself,
and released by itself once it answers again.

Every consumer process counts, per storage node, the outages its steps meet in a row
(``queues.core.retries``: refused or reset connections, time-outs, 408, 429, 5xx). At
``MRT_BREAKER_FAILURES`` of them within ``MRT_BREAKER_WINDOW`` seconds, with no step for that
node going through in between, the breaker opens: the node is held as an operator would hold it
(``queues.zk.maintenance``), by ``BREAKER``, with the cause as its reason ("breaker: 5 x 503 from
node 9501 in 12 s"). Its jobs then wait unclaimed before Storing and Recording, the node-held
alert says so with that reason, and the holds page, the overview and the API show it like any
node hold. The maintenance daemon probes each node the breaker holds, at 5 s and then a doubling
interval up to 5 minutes; the first answer that is the node's own state document closes the
breaker (the hold goes, only if it is still the breaker's), the jobs go on and the alert
resolves.

An operator opens a breaker by holding the node and closes it by releasing the hold, on the
holds page or the API, audited as every hold; a hold placed by an operator is never released by
a probe. Merritt's own storage consumer does not read these holds: beside Merritt its storage
service keeps taking the Storing jobs it owns and retries them its own way.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import deque
from typing import Any

import requests
from django.conf import settings

from queues.core import retries
from queues.core.outside_text import url_shown
from queues.operator import audit
from queues.services.depositors import depositor_policy
from queues.steps.merritt_wire import (
    answered_ok,
    service_session,
    state_fields,
    unavailable_answer,
)
from queues.steps.netpolicy import FetchRefused, TooSlow, TransferFailed
from queues.zk.errors import InvalidID
from queues.zk.maintenance import (
    BREAKER,
    NODE_RE,
    SERVER_SERVICES,
    ServiceHold,
    breaker_hold_clear,
    node_hold_set,
    node_holds,
    service_hold_clear,
    service_hold_set,
    service_holds,
    service_key,
    service_name,
)
from queues.zk.servertime import server_now

from .retrying import policy_for

log = logging.getLogger("queues.daemons")

PROBE_FIRST = 5.0
HOLD_REASON_MAX = 300
PROBE_MOST = 300.0
STORAGE_NODE = "storage node "


def storage_node(service: str) -> int | None:
    """The node of a service name like ``storage node 9501``; None for any other service."""
    if not service.startswith(STORAGE_NODE):
        return None
    number = service[len(STORAGE_NODE) :]
    return int(number) if NODE_RE.fullmatch(number) else None


# Connection failures by a telling part of their text (requests and urllib3 nest the OS error's
# words deep in theirs), so a breaker's reason reads "5 x connection reset".
_KINDS = (
    ("connectionreseterror", "connection reset"),
    ("connection reset", "connection reset"),
    ("connectionrefusederror", "connection refused"),
    ("connection refused", "connection refused"),
    ("remotedisconnected", "connection closed"),
    ("timed out", "time-out"),
    ("timeout", "time-out"),
)


def _short(reason: str) -> str:
    """``503`` of ``HTTP 503 Service Unavailable``; the words of anything else, shortened."""
    words = reason.split()
    if len(words) > 1 and words[0] == "HTTP" and words[1].isdigit():
        return words[1]
    lowered = reason.lower()
    for needle, name in _KINDS:
        if needle in lowered:
            return name
    text = " ".join(words)
    return text if len(text) <= 60 else text[:57] + "..."


def probe_url(service: str, given: str = "") -> str:
    """Where the breaker of ``service`` asks whether it answers again: a storage node's state
    (``GET {storage}/state/{node}``), inventory's (``GET {inventory}/state``, JerseyInv in
    CDLUC3/mrt-inventory), EZID's ``GET {ezid}/login`` (asked with the console's credentials,
    so that a breaker opened for their refusal stays open until they are mended), or the root of
    a depositor's or callback receiver's server (``given``, from the URL that failed). "" when
    none is known."""
    node = storage_node(service)
    if node is not None:
        base = settings.MRT_STORAGE_URL
        return f"{base.rstrip('/')}/state/{node}?t=xml" if base else ""
    if service == "inventory":
        base = settings.MRT_INVENTORY_URL
        return f"{base.rstrip('/')}/state?t=xml" if base else ""
    if service == "ezid":
        base = settings.MRT_EZID_URL
        return f"{base.rstrip('/')}/login" if base else ""
    # The hold node that keeps ``given`` is one any client of the ensemble may write: only the
    # root of the very server the service names is asked.
    kind = service.split(" ", 1)[0]
    if given and retries.origin_of(given) == given and retries.service_at(kind, given) == service:
        return given
    return ""


def _hold(zk: Any, service: str, why: str, probe: str) -> bool:
    node = storage_node(service)
    if node is not None:
        return node_hold_set(zk, node, by=BREAKER, reason=why)
    return service_hold_set(zk, service, by=BREAKER, reason=why, probe=probe)


def _release(zk: Any, service: str) -> bool:
    node = storage_node(service)
    if node is not None:
        return breaker_hold_clear(zk, node, by=BREAKER)
    return service_hold_clear(zk, service, by=BREAKER)


def breaker_held(zk: Any, services: dict[str, ServiceHold] | None = None) -> dict[str, str]:
    """Every service and node a breaker holds, by service name, with its probe's URL
    (``services``: the service holds, when the caller has read them)."""
    held = {
        f"{STORAGE_NODE}{n}": probe_url(f"{STORAGE_NODE}{n}")
        for n, h in node_holds(zk).items()
        if h.by == BREAKER
    }
    if services is None:
        services = service_holds(zk)
    held.update({s: probe_url(s, h.probe) for s, h in services.items() if h.by == BREAKER})
    return held


def expired(services: dict[str, ServiceHold], *, wall: float) -> list[str]:
    """The depositors' and callback receivers' servers whose breaker's hold has stood for their
    retry policy's ``within`` (``wall``: epoch seconds): by then every job that met the outage
    goes ahead anyway (``outlived``), and a server that never answers again (gone for good)
    would keep its hold, and the jobs that never tried it, for ever."""
    return [
        service
        for service, hold in services.items()
        if hold.by == BREAKER
        and hold.at is not None
        and _outside_server(service)
        and wall - hold.at.timestamp() >= policy_for(service).within
    ]


def _holdable(service: str) -> str | None:
    """The name a breaker holds ``service`` under; None for a service no hold can name."""
    if storage_node(service) is not None:
        return service
    try:
        return service_name(service)
    except InvalidID:
        return None


# How long a process keeps its view of which holds are the breaker's (``outlived``).
BREAKER_VIEW_SECONDS = 5.0
_breaker_view: tuple[float, frozenset[str]] = (float("-inf"), frozenset())
_breaker_view_lock = threading.Lock()


def _held_by_breaker(zk: Any) -> frozenset[str]:
    """The services and nodes a breaker holds, not an operator (``breaker_held``), read at most
    every BREAKER_VIEW_SECONDS: asked only for a job whose retry window has closed."""
    global _breaker_view
    moment = time.monotonic()
    with _breaker_view_lock:
        at, known = _breaker_view
        if moment - at < BREAKER_VIEW_SECONDS:
            return known
    known = frozenset(breaker_held(zk))
    with _breaker_view_lock:
        _breaker_view = (moment, known)
    return known


def _outside_server(service: str) -> bool:
    """A depositor's or callback receiver's server, not one of Merritt's own services."""
    return retries.policy_name(service) in SERVER_SERVICES


def _window_end(raw: dict[str, Any], services: list[str]) -> float | None:
    """When the retry window of a job (``raw`` its status JSON) held back by ``services``
    closes for the outside server it failed at: its policy's ``within`` after its first
    failure there. None when it has no such window or a service of Merritt's own is among
    ``services``."""
    record = retries.current(raw)
    if record is None or record.get("service") not in services:
        return None
    first = record.get("first")
    if not isinstance(first, int | float) or isinstance(first, bool):
        return None
    if not all(_outside_server(service) for service in services):
        return None
    return float(first) + policy_for(str(record["service"])).within


def outlived(zk: Any, raw: dict[str, Any], services: list[str], *, now: float) -> bool:
    """Whether a job held back by ``services`` (held services it needs) goes ahead anyway: a
    depositor's or callback receiver's server that a breaker holds does not hold a job whose
    retry window for that server has closed (its policy's ``within`` since its first failure,
    ``raw`` its status JSON). The breaker saves the server from every job's tries; it does not
    give an outside party's server longer than its policy: the job's next try, met by the same
    outage, fails it for its own reasons. An operator's hold holds it still, as do the holds of
    Merritt's own services (their jobs spend no tries while held)."""
    end = _window_end(raw, services)
    if end is None or now <= end:
        return False
    try:
        held = _held_by_breaker(zk)
    except Exception:  # ZooKeeper away: held as it was
        return False
    return all(service in held for service in services)


def outlived_from(raw: dict[str, Any], services: list[str], *, now: float) -> float:
    """Until when (epoch seconds) a job that ``outlived`` holds back by ``services`` now stays
    held back while they stay held: until its retry window for the outside server it failed at
    closes; infinity when it has no such window or a service of Merritt's own is held, or when
    the window has closed already (then an operator's hold holds it, which has no end of its
    own, or the breaker's, which ends with that window: ``expired``)."""
    end = _window_end(raw, services)
    return end if end is not None and end > now else math.inf


class Breakers:
    """The counts of one process and the probes of the services its breakers hold."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, deque[tuple[float, str]]] = {}
        self._probes: dict[str, tuple[float, float]] = {}  # service -> (next probe, interval)

    def failed(
        self, zk: Any, service: str, reason: str, *, probe: str = "", ours: bool = False
    ) -> bool:
        """Count one outage of ``service``; True when it opened its breaker. An answer about
        the console (``ours``: its credentials refused, its URL naming no endpoint) opens it at
        once, saying so: every job would meet it alike until the configuration is mended."""
        name = _holdable(service)
        if name is None:
            return False
        if ours:
            with self._lock:
                self._runs.pop(name, None)
            return self._open(zk, name, f"breaker: {name} refuses the console: {reason}")
        limit = settings.MRT_BREAKER_FAILURES
        window = settings.MRT_BREAKER_WINDOW
        now = time.monotonic()
        with self._lock:
            run = self._runs.setdefault(name, deque())
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
        node = storage_node(name)
        label = f"node {node}" if node is not None else name
        why = f"breaker: {count} x {cause} from {label} in {span:.0f} s"
        return self._open(zk, name, why, probe)

    def _open(self, zk: Any, name: str, why: str, probe: str = "") -> bool:
        # The probe is kept with its password hidden (the hold is read by all): inventory's and
        # EZID's are made again from the settings when asked (``breaker_held``).
        if not _hold(zk, name, why[:HOLD_REASON_MAX], url_shown(probe_url(name, probe))):
            return False  # held already (another process's breaker, or an operator)
        log.warning("%s held: %s", name, why)
        _audit("hold", name, why)
        return True

    def worked(self, service: str) -> None:
        """A step of ``service`` went through: its run of outages is over."""
        if service in self._runs:
            with self._lock:
                self._runs.pop(service, None)

    def probe(
        self,
        zk: Any,
        *,
        now: float | None = None,
        wall: float | None = None,
        none_held: bool = False,
    ) -> list[str]:
        """Probe each service a breaker holds whose probe is due; the services whose breaker
        closed. A service with no URL to probe (its setting gone) stays held until an operator
        releases it. A depositor's or callback receiver's server is released without a probe
        once its breaker's hold has stood for its retry window (``expired``; ``wall``: epoch
        seconds): its jobs try it again, and its breaker opens again if it still fails.
        ``none_held``: the caller knows (from a watch) that no node or service is held, so the
        holds are not read."""
        moment = time.monotonic() if now is None else now
        services = {} if none_held else service_holds(zk)
        closed = []
        # The holds' ctime is the server's clock: so is the time they are judged at (asked only
        # when some service is held: an idle queue's rounds send nothing).
        if services and wall is None:
            wall = server_now(zk)
        for service in expired(services, wall=0.0 if wall is None else wall):
            if _release(zk, service):
                within = policy_for(service).within
                why = f"held by its breaker for its jobs' whole retry window ({within:g} s)"
                log.info("%s: %s: released, its jobs try it again", service, why)
                _audit("release", service, why)
                closed.append(service)
            del services[service]
        held = {} if none_held else breaker_held(zk, services)
        self._forget_old_runs(moment)
        with self._lock:
            for service in list(self._probes):
                if service not in held:
                    del self._probes[service]
            due = []
            for service in held:
                at, _interval = self._probes.setdefault(
                    service, (moment + PROBE_FIRST, PROBE_FIRST)
                )
                if at <= moment:
                    due.append(service)
        for service in due:
            if _answers(service, held[service]):
                if _release(zk, service):
                    log.info("%s answers again: its breaker closed", service)
                    _audit("release", service, "it answers again")
                    closed.append(service)
                with self._lock:
                    self._probes.pop(service, None)
            else:
                with self._lock:
                    _at, interval = self._probes.get(service, (moment, PROBE_FIRST))
                    interval = min(PROBE_MOST, interval * 2)
                    self._probes[service] = (moment + interval, interval)
        return closed

    def _forget_old_runs(self, moment: float) -> None:
        """Drop the counts of services whose last outage is older than the breaker's window: a
        server that failed once and was never asked again is not remembered for ever."""
        window = settings.MRT_BREAKER_WINDOW
        with self._lock:
            old = [s for s, run in self._runs.items() if not run or moment - run[-1][0] > window]
            for service in old:
                del self._runs[service]


def _answers(service: str, url: str) -> bool:
    """Whether ``service`` answers again at ``url``; False when there is nothing to ask. A
    depositor's or callback receiver's server answers with anything but "not now" (any status
    but 408, 429, 5xx: its root answering 404 is up), asked under the depositor policy (its
    addresses checked; a redirect is an answer, not followed). A storage node, inventory and
    EZID answer only with their own answer to the probe (``own_answer``: the node's or the
    service's state document, EZID's login line): a page that a wrong URL's server answers 200
    with released the hold, and every job met the wrong answer again. In MRT_HTTP_TIMEOUT for
    the whole exchange."""
    if not url:
        return False
    if storage_node(service) is None and service.split(" ", 1)[0] in SERVER_SERVICES:
        seconds = settings.MRT_HTTP_TIMEOUT
        policy = dataclasses.replace(depositor_policy(), timeout=seconds, deadline=seconds)
        try:
            with policy.open(url, follow=False) as answer:
                status, reason, after = answer.status, answer.reason, answer.header("Retry-After")
        except (FetchRefused, TransferFailed, TooSlow):
            return False
        return retries.http_unavailable(service, status, reason, after, now=time.time()) is None
    session = service_session(retries=0, deadline=settings.MRT_HTTP_TIMEOUT)
    # EZID's login checks the console's credentials as well as that EZID answers.
    auth = (settings.MRT_EZID_USER, settings.MRT_EZID_PASSWORD) if service == "ezid" else None
    try:
        response = session.get(url, timeout=settings.MRT_HTTP_TIMEOUT, auth=auth)
    except requests.RequestException:
        return False
    finally:
        session.close()
    # An answer about the console (its credentials refused, no endpoint there) is no answer.
    if unavailable_answer(service, response) is not None:
        return False
    if own_answer(service, response):
        return True
    log.info(
        "%s still held: its probe %s was answered HTTP %s without the service's own answer: %r",
        service,
        url_shown(url),
        response.status_code,
        response.content[:200],
    )
    return False


# What a probe of each of Merritt's services must be answered with to release its hold
# (docs/merritt-services.md, "The breakers' probes"): a 2xx whose body is the service's own
# answer to that request, not any page a wrong URL's server answers 200 with. A storage node's
# state is mrt-store's NodeState (nod:nodeState), inventory's its InvServiceState
# (invsv:invServiceState), both read by their root's local name as every state document is
# (merritt_wire.state_fields); EZID's login answers this line.
NODE_STATE = "nodeState"
INV_SERVICE_STATE = "invServiceState"
EZID_LOGGED_IN = "success: session cookie returned"


def own_answer(service: str, response: requests.Response) -> bool:
    """Whether ``response`` to a probe of ``service`` is that service's own answer to it."""
    if not answered_ok(response):
        return False
    if storage_node(service) is not None or service == "inventory":
        state = state_fields(response.content)
        root = INV_SERVICE_STATE if service == "inventory" else NODE_STATE
        return state is not None and state[0] == root
    if service == "ezid":
        lines = response.content.decode("utf-8", "replace").strip().splitlines()
        return bool(lines) and lines[0].strip() == EZID_LOGGED_IN
    return True


def _audit(action: str, service: str, reason: str) -> None:
    node = storage_node(service)
    made = audit.entry(
        user=None,
        action=action,
        kind="node" if node is not None else "service",
        item_id=str(node) if node is not None else service_key(service),
        before="released" if action == "hold" else "held",
        after="held" if action == "hold" else "released",
        reason=reason,
        detail=f"by the breaker of {service}",
        via="daemon",
    )
    try:
        # A database outage keeps the entry, written by this process once the database answers.
        audit.write_or_keep([made])
    except Exception as exc:  # the hold stands; the log says what the entry would have said
        log.warning("breaker %s of %s not audited: %s", action, service, exc)


_breakers = Breakers()


def breakers() -> Breakers:
    """This process's breakers."""
    return _breakers


def note_outage(zk: Any, outage: retries.ServiceUnavailable) -> None:
    breakers().failed(zk, outage.service, outage.reason, probe=outage.probe, ours=outage.ours)
