"""An answer about the console, not the job (our credentials refused, the configured URL naming
no endpoint of the service), fails no job: every job would meet it alike. The service's breaker
opens at the first one with the reason, its jobs wait unclaimed and unfailed, the depositor
hears nothing, and once the configuration is mended (or the service answers) the jobs go on."""

from __future__ import annotations

import time
from typing import Any

import pytest

from queues.chaos.standins import Answer
from queues.daemons import breakers as breaker_module
from queues.zk.jobs import job_load
from queues.zk.maintenance import node_holds, service_holds

from .conftest import FileServer, wait_for
from .test_downstream_retries import Rounds, _job, services  # noqa: F401 - the fixture

pytestmark = [pytest.mark.django_db, pytest.mark.zookeeper]

HTML_404 = Answer(404, b"<html><body><h1>404 Not Found</h1></body></html>", "text/html")


def _held(zk: Any, kind: str) -> str | None:
    """The reason of the breaker's hold on ``kind``'s service, None while it is not held."""
    hold = node_holds(zk).get(9501) if kind == "storage" else service_holds(zk).get(kind)
    return hold.reason if hold is not None else None


@pytest.mark.parametrize(
    ("kind", "answer", "words"),
    [
        ("ezid", None, "401"),  # the console's EZID password is wrong
        ("storage", Answer(401, b"Unauthorized", "text/plain"), "401"),
        ("storage", HTML_404, "is its configured URL right?"),
        ("inventory", Answer(403, b"<html>Forbidden</html>", "text/html"), "403"),
        ("inventory", Answer(405, b"", "text/plain"), "405"),
    ],
)
def test_a_service_refusing_the_console_holds_its_jobs_unfailed_until_mended(
    kind: str,
    answer: Answer | None,
    words: str,
    zk: Any,
    files: FileServer,
    services: dict[str, Any],  # noqa: F811 - the fixture
    settings: Any,
) -> None:
    settings.MRT_BREAKER_FAILURES = 5  # one answer about the console is enough
    stand_in = services[kind]
    receiver = services["receiver"]
    if answer is None:
        settings.MRT_EZID_PASSWORD = "wrong"

        def mend() -> None:
            settings.MRT_EZID_PASSWORD = "s3cret"
    else:
        for _ in range(10_000):
            stand_in.refuse_next(answer)

        def mend() -> None:
            stand_in.stop_refusing()

    jobs = [_job(zk, files, f"{kind}{i}.txt") for i in range(3)]
    rounds = Rounds(zk)
    rounds.until(lambda: _held(zk, kind) is not None, jobs)
    reason = _held(zk, kind) or ""
    assert "refuses the console" in reason and words in reason, reason

    # Held: no job fails, nobody is told, and the probe, refused as well, keeps it held.
    for _ in range(3):
        for d in rounds.daemons:
            d.run_once()
    assert not any(job_load(zk, j.jid).state in ("Failed", "Completed") for j in jobs)
    assert receiver.received == {}
    start = time.monotonic()
    breaker_module.breakers().probe(zk, now=start + 6)
    assert _held(zk, kind) is not None

    # Mended: the next probe closes the breaker and every job completes, none ever Failed.
    mend()
    wait_for(lambda: bool(breaker_module.breakers().probe(zk, now=time.monotonic() + 3600)))
    assert _held(zk, kind) is None
    rounds.until(lambda: all(job_load(zk, j.jid).state == "Completed" for j in jobs), jobs)
    for job in jobs:
        assert "Failed" not in rounds.seen[job.jid], rounds.seen[job.jid]
    assert sorted(receiver.received) == sorted(j.jid for j in jobs)


def test_an_add_answered_200_by_no_inventory_holds_the_jobs_unrecorded_and_unfailed(
    zk: Any,
    files: FileServer,
    services: dict[str, Any],  # noqa: F811 - the fixture
    settings: Any,
) -> None:
    """A wrong MRT_INVENTORY_URL whose server answers the add 200 with a page of its own was
    taken for a record: the jobs completed with nothing recorded. Inventory's add answers its
    process state (mrt-inventory InvProcessState); anything else is about the console."""
    settings.MRT_BREAKER_FAILURES = 5
    inventory, receiver = services["inventory"], services["receiver"]
    page = Answer(200, b"<html><body>Welcome to nginx!</body></html>", "text/html")
    for _ in range(10_000):
        inventory.refuse_next(page, "POST")

    jobs = [_job(zk, files, f"page{i}.txt") for i in range(2)]
    rounds = Rounds(zk)
    rounds.until(lambda: _held(zk, "inventory") is not None, jobs)
    reason = _held(zk, "inventory") or ""
    assert "refuses the console" in reason and "invProcessState" in reason, reason
    for _ in range(3):
        for d in rounds.daemons:
            d.run_once()
    assert not any(job_load(zk, j.jid).state in ("Failed", "Completed") for j in jobs)
    assert inventory.added == [] and receiver.received == {}

    inventory.stop_refusing()
    wait_for(lambda: bool(breaker_module.breakers().probe(zk, now=time.monotonic() + 3600)))
    rounds.until(lambda: all(job_load(zk, j.jid).state == "Completed" for j in jobs), jobs)
    for job in jobs:
        assert "Failed" not in rounds.seen[job.jid], rounds.seen[job.jid]
    assert len(inventory.added) == len(jobs)
