"""The listing's screen of jobs waiting for a later try reads the statuses of the listed jobs it
does not know: another client's status node nested past the JSON parser raised RecursionError
out of it, and so out of the loop's listing, at every listing."""

from __future__ import annotations

import math
import time
from typing import Any

from queues.core.retries import RETRY_KEY
from queues.daemons.retrying import RetryWaits
from queues.daemons.waiting import RetryScreen
from queues.zk import paths as zpaths
from queues.zk.maintenance import held_services, service_hold_clear, service_hold_set

from .conftest import make_job, wait_for


def test_a_status_nested_past_the_parser_is_left_to_the_claim(zk: Any) -> None:
    waiting, odd, plain = (make_job(zk, {}, state="Estimating") for _ in range(3))
    status = zk.get(zpaths.job_node(waiting.jid, "status"))[0].decode()
    later = time.time() + 3600
    retry = f'"{RETRY_KEY}": {{"state": "Estimating", "attempt": 1, "next": {later}}}'
    zk.set(zpaths.job_node(waiting.jid, "status"), (status[:-1] + f", {retry}}}").encode())
    zk.set(zpaths.job_node(odd.jid, "status"), b"[" * 100_000 + b"]" * 100_000)
    waits = RetryWaits()
    waits.note("jid9999999999", later)  # a wait known: the screen reads the listed statuses
    names = [f"05-{j.jid}" for j in (waiting, odd, plain)]

    kept = RetryScreen(zk, waits)(names)

    assert kept == [f"05-{odd.jid}", f"05-{plain.jid}"]  # the odd one is the claim's to judge


def test_jobs_noted_for_a_hold_cost_the_listings_nothing_once_no_service_is_held(
    zk: Any,
) -> None:
    """A job noted as waiting for a held service that the loop never lists again (another
    host took it once the hold went) stayed noted: the loop's skip and its screen, which read
    every listed job's status while any job is noted, went on doing so after the hold."""
    service = "depositor 127.0.0.1:9"
    waits = RetryWaits(held=lambda: held_services(zk))
    assert service_hold_set(zk, service, by="breaker", reason="breaker: 5 x HTTP 503")
    wait_for(lambda: service in held_services(zk))
    waits.note_held("jid0000000001", [service], math.inf)
    assert waits and waits.waits("jid0000000001")
    service_hold_clear(zk, service)
    wait_for(lambda: not held_services(zk))

    assert not waits  # nothing is held: no job waits for a hold
