"""Merritt's services (storage, inventory, EZID) each get one deadline for a whole exchange:
a service that trickles its answer a byte at a time (each read well inside the per-read
timeout) is cut off at the deadline, and the step's try counts as an outage to be tried again
(issue 52: every outside request has one deadline for the whole exchange). The lookup of the
service's host name, before any socket exists, is held to the same deadline."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import requests
from urllib3.exceptions import MaxRetryError, NewConnectionError

from queues.chaos.standins import Answer, StorageStandIn, running
from queues.core.retries import outage_of
from queues.steps.access import RequestError, read_merritt_request
from queues.steps.inventory import HttpInventory, InventoryError
from queues.steps.merritt_wire import service_session
from queues.steps.minting import EzidMinter, MintError
from queues.steps.netpolicy import RetryWithin, exchange_deadline
from queues.steps.storage import HttpStorage, StorageError
from tests.steps.conftest import Loopback, Reply
from tests.steps.slow_servers import HeaderTrickle, refused_port

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


# A back-off that cannot fit in the exchange: 0 s before the first repeat, then 4 s, then 8 s,
# within a deadline of 2 s. urllib3 slept all of it, 12 s, whatever the deadline (the alarm shut
# down the connection of each repeat made past it, and then the session said the exchange took
# longer than its limit).
LONG_BACKOFF = 2.0
SHORT_DEADLINE = 2.0


def test_a_repeat_whose_back_off_would_pass_the_deadline_is_not_waited_for(
    http_server: Loopback,
) -> None:
    """A service answering 503 every time: the first repeat goes at once, the second would
    wait past the exchange's deadline, so the exchange ends there with the service's own answer,
    before the deadline could cut it off, and its Retry-After is the job's wait."""
    path = "/primary/owner/loc?t=json"
    http_server.add("GET", path, Reply(503, b"busy", {"Retry-After": "120"}))
    session = service_session(retries=3, backoff=LONG_BACKOFF, deadline=SHORT_DEADLINE)
    inventory = HttpInventory(http_server.url, timeout=10, session=session)
    with pytest.raises(InventoryError) as raised:
        inventory.primary_for_local_id("owner", "loc")
    assert "HTTP 503 busy" in str(raised.value)
    assert "took longer than" not in str(raised.value)  # not cut off: it ended before
    outage = outage_of(raised.value)
    assert outage is not None and outage.retry_after == 120  # tried again later, not failed
    assert len(http_server.seen("GET", path)) == 2  # the first try and one repeat, of 4


def test_a_service_refusing_connections_is_given_up_on_before_the_deadline() -> None:
    """Nothing reaches a service that refuses connections: the repeats stop where the next one's
    back-off would pass the deadline, with the refusal's own error, an outage."""
    with refused_port() as port:
        url = f"http://127.0.0.1:{port}"
        session = service_session(retries=3, backoff=LONG_BACKOFF, deadline=SHORT_DEADLINE)
        with pytest.raises(requests.ConnectionError) as raised:
            session.get(f"{url}/state/9501", timeout=10)
        storage = HttpStorage(url, 9501, timeout=10, session=session)
        with pytest.raises(StorageError) as failed:
            storage.read_manifest(f"{url}/manifest/9501/ark")
    assert not isinstance(raised.value, requests.Timeout)  # the deadline did not pass
    for words in (str(raised.value), str(failed.value)):
        assert "Connection refused" in words
        assert "the next repeat would wait 4s, past the exchange's deadline" in words
    assert outage_of(failed.value) is not None  # tried again later, not failed


def test_no_repeat_is_made_once_the_exchange_has_no_time_left() -> None:
    """Even a repeat without back-off is not made once the exchange's time is spent; outside any
    exchange the repeats are urllib3's own."""
    retry = RetryWithin(total=3, connect=3, backoff_factor=0.5)
    refused = NewConnectionError(None, "Failed to establish a new connection: refused")
    assert retry.increment("GET", "/state", error=refused).connect == 2
    with exchange_deadline(0.0), pytest.raises(MaxRetryError, match="no time left"):
        retry.increment("GET", "/state", error=refused)


def test_a_service_name_lookup_is_given_up_at_the_exchange_deadline(
    held_lookups: tuple[threading.Event, list[str]],
) -> None:
    """The system resolver's own timeouts (seconds a server and try) came on top of the
    exchange's deadline: urllib3 looked the name up inside its connect, before any socket the
    watchdog could shut down. Given up at the deadline, the step's try is an outage, tried again
    later, like any other connection that failed."""
    release, _threads = held_lookups
    url = "http://storage.slow.example:9"
    storage = HttpStorage(
        url, 9501, timeout=10, session=service_session(retries=0, deadline=DEADLINE)
    )
    inventory = HttpInventory(
        url, timeout=10, session=service_session(retries=0, deadline=DEADLINE)
    )
    ezid = EzidMinter(
        url, "u", "p", timeout=10, session=service_session(retries=0, deadline=DEADLINE)
    )
    for call, error in (
        (lambda: storage.read_manifest(f"{url}/manifest/9501/ark"), StorageError),
        (lambda: inventory.primary_for_local_id("owner", "loc"), InventoryError),
        (lambda: ezid.mint("ark:/99999/fk4"), MintError),
    ):
        exc = _cut_off(call, error)
        assert not release.is_set()  # back while the lookup is still held
        assert "took longer than" in str(exc)  # the lookup's, or the deadline's, words
        assert outage_of(exc) is not None  # tried again later, not failed
    # The access requests' read: the same, "not permanent" (the token is tried again later).
    with pytest.raises(RequestError) as raised:
        read_merritt_request(url, "token", timeout=DEADLINE / 4)
    assert not release.is_set() and raised.value.permanent is False


def test_a_lookup_given_up_is_a_connection_error_the_session_repeats(
    held_lookups: tuple[threading.Event, list[str]],
) -> None:
    """Within a long deadline the lookup is given up at the connect timeout, as a requests
    ConnectionError (urllib3's NameResolutionError, a temporary failure): nothing reached the
    service, so the session's repeats try again, each lookup bounded the same way."""
    release, threads = held_lookups
    session = service_session(retries=2, backoff=0.01, deadline=60)
    with pytest.raises(requests.ConnectionError) as raised:
        session.get("http://inventory.slow.example:9/state", timeout=0.3)
    assert not release.is_set()
    assert "looking up host 'inventory.slow.example' took longer than 0.3s" in str(raised.value)
    assert not isinstance(raised.value, requests.Timeout)  # the deadline did not pass
    assert threads == ["name-lookup"] * 3  # the first try and two repeats


def test_a_service_named_by_host_name_is_reached_at_its_addresses_in_turn(
    held_lookups: tuple[threading.Event, list[str]],
) -> None:
    """A name that answers is looked up in a thread of its own (bounded), and its addresses are
    tried in turn: the first refuses, the second is the service. An address is not looked up
    in a thread."""
    _release, threads = held_lookups
    with running(StorageStandIn(nodes=(9501,))) as stand_in:
        port = stand_in.url.rsplit(":", 1)[1]
        session = service_session(retries=0, deadline=10)
        for base in (f"http://storage.two.example:{port}", f"http://localhost:{port}"):
            answer = session.get(f"{base}/state/9501/ark%3A%2F99999%2Ffk4none", timeout=10)
            assert answer.status_code == 404  # the stand-in's own answer for no such object
        assert threads == ["name-lookup", "name-lookup"]
        threads.clear()
        answer = session.get(f"{stand_in.url}/state/9501/ark%3A%2F99999%2Ffk4none", timeout=10)
        assert answer.status_code == 404 and threads == [threading.current_thread().name]
