"""A depositor's or callback receiver's server that fails once and is gone for good: its
breaker's hold (``/mrt-console/holds/services/depositor:HOST:PORT``) stood for ever, one more
node for every such server, probed every five minutes for ever, and the jobs that never tried
it waited for ever. It now ends once it has stood for the server's retry window (the policy's
``within``), when every job that met the outage goes ahead anyway; an operator's hold and the
holds of Merritt's own services are not touched. Times are passed in, never waited for."""

from __future__ import annotations

import time
from typing import Any

import pytest

from queues.daemons.breakers import BREAKER, Breakers
from queues.daemons.retrying import policy_for
from queues.models import AuditEntry
from queues.zk.maintenance import service_hold_set, service_holds

pytestmark = pytest.mark.django_db

GONE = "depositor gone.example.org:443"
HOOK = "callback hooks.example.org:8443"
MINE = "depositor moving.example.org:443"


def test_a_breakers_hold_of_a_server_gone_for_good_ends_with_its_retry_window(zk: Any) -> None:
    # As a breaker leaves them: no probe URL that would ever answer (the server is gone).
    assert service_hold_set(zk, GONE, by=BREAKER, reason="breaker: 5 x connection refused")
    assert service_hold_set(zk, HOOK, by=BREAKER, reason="breaker: 5 x 503")
    assert service_hold_set(zk, "inventory", by=BREAKER, reason="breaker: 5 x 503")
    assert service_hold_set(zk, MINE, by="ops", reason="their server moves")
    placed = time.time()
    depositor, callback = policy_for(GONE).within, policy_for(HOOK).within
    assert depositor < callback
    breakers = Breakers()
    now = time.monotonic()

    assert breakers.probe(zk, now=now, wall=placed + depositor - 60) == []
    assert set(service_holds(zk)) == {GONE, HOOK, "inventory", MINE}

    assert breakers.probe(zk, now=now, wall=placed + depositor + 1) == [GONE]
    assert set(service_holds(zk)) == {HOOK, "inventory", MINE}

    later = placed + 10 * callback
    assert breakers.probe(zk, now=now, wall=later) == [HOOK]
    # Merritt's own services' jobs spend no tries while held: their holds wait for the probe;
    # an operator's hold is the operator's to release.
    assert set(service_holds(zk)) == {"inventory", MINE}
    assert breakers.probe(zk, now=now, wall=later) == []

    entries = AuditEntry.objects.filter(kind="service", action="release", via="daemon")
    assert sorted(e.item_id for e in entries) == sorted(
        s.replace(" ", ":", 1) for s in (GONE, HOOK)
    )
    assert all("retry window" in e.reason for e in entries)


def test_the_count_of_a_server_that_failed_once_is_forgotten(zk: Any, settings: Any) -> None:
    settings.MRT_BREAKER_FAILURES = 5
    settings.MRT_BREAKER_WINDOW = 60.0
    breakers = Breakers()
    assert not breakers.failed(zk, GONE, "HTTP 503 Service Unavailable")
    assert GONE in breakers._runs
    breakers.probe(zk, now=time.monotonic() + 61)
    assert GONE not in breakers._runs
