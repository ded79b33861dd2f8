"""The listing's screen of jobs waiting for a later try reads the statuses of the listed jobs it
does not know: another client's status node nested past the JSON parser raised RecursionError
out of it, and so out of the loop's listing, at every listing."""

from __future__ import annotations

import time
from typing import Any

from queues.core.retries import RETRY_KEY
from queues.daemons.retrying import RetryWaits
from queues.daemons.waiting import RetryScreen
from queues.zk import paths as zpaths

from .conftest import make_job


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
