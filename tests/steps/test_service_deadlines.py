"""Merritt's services (storage, inventory, EZID) each get one deadline for a whole exchange:
a service that trickles its answer a byte at a time (each read well inside the per-read
timeout) is cut off at the deadline, and the step's try counts as an outage to be tried again
(issue 52: every outside request has one deadline for the whole exchange)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from queues.chaos.standins import Answer, StorageStandIn, running
from queues.core.retries import outage_of
from queues.steps.inventory import HttpInventory, InventoryError
from queues.steps.merritt_wire import service_session
from queues.steps.minting import EzidMinter, MintError
from queues.steps.storage import HttpStorage, StorageError
from tests.steps.slow_servers import HeaderTrickle

DEADLINE = 1.0


@pytest.fixture
def trickle() -> Iterator[HeaderTrickle]:
    server = HeaderTrickle()
    try:
        yield server
    finally:
        server.close()


def _cut_off(call: Callable[[], object], error: type[Exception]) -> Exception:
    # The whole answer takes about 30 s to trickle in, each byte well inside the per-read
    # timeout: only the deadline ends the exchange without it (the server counts it unfinished).
    with pytest.raises(error) as raised:
        call()
    return raised.value


def test_storage_inventory_and_ezid_are_cut_off_at_their_deadline(trickle: HeaderTrickle) -> None:
    storage = HttpStorage(
        trickle.url, 9501, timeout=10, session=service_session(retries=0, deadline=DEADLINE)
    )
    inventory = HttpInventory(
        trickle.url, timeout=10, session=service_session(retries=0, deadline=DEADLINE)
    )
    ezid = EzidMinter(
        trickle.url, "u", "p", timeout=10, session=service_session(retries=0, deadline=DEADLINE)
    )
    for call, error in (
        (lambda: storage.store(ark="ark:/99999/fk4a", manifest_url="http://x/m"), StorageError),
        (lambda: inventory.primary_for_local_id("owner", "loc"), InventoryError),
        (lambda: ezid.mint("ark:/99999/fk4"), MintError),
    ):
        exc = _cut_off(call, error)
        assert f"took longer than the limit of {DEADLINE:g}s" in str(exc)
        assert outage_of(exc) is not None  # tried again later, not failed
    connections, _hung_up, finished = trickle.counts()
    assert connections == 3 and finished == 0


def test_a_pooled_connection_taken_again_is_watched_too(trickle: HeaderTrickle) -> None:
    session = service_session(retries=0, deadline=DEADLINE)
    for _ in range(2):
        exc = _cut_off(lambda: session.get(trickle.url + "/state/9501", timeout=10), Exception)
        assert f"took longer than the limit of {DEADLINE:g}s" in str(exc)
    assert trickle.counts()[2] == 0


def test_a_retry_after_is_no_sleep_inside_the_exchange() -> None:
    """urllib3 slept a 503's Retry-After (up to six hours) between the session's repeats, past the
    exchange's deadline (a 2 s exchange took 23 s against "Retry-After: 20"), and raised a
    ValueError on 5,000 digits, which failed the job. The repeats wait their own short back-off;
    the job's wait is the retry policy's (tests/daemons/test_downstream_retries.py)."""
    with running(StorageStandIn(nodes=(9501,))) as storage:
        for value in ("3600", "9" * 5000, "soon"):
            storage.refuse_next(Answer(503, b"busy", "text/plain", {"Retry-After": value}))
        session = service_session(retries=3, backoff=0.01, deadline=60)
        answer = session.get(f"{storage.url}/state/9501/ark%3A%2F99999%2Ffk4none", timeout=10)
        assert answer.status_code == 404  # the object's own answer, after three 503s
        assert len(storage.seen("GET")) == 4
