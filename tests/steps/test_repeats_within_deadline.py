"""The repeats of a depositor's download and of a callback wait inside the exchange's one deadline.

Both loops (``fetch._retrying``, ``notify.post_callback``) slept their back-off whatever the
policy's deadline had left: a download's next attempt then began past it and was called too slow
(a DownloadError with no outage beneath it: the job failed for a server that was only away), and
a callback's attempts each had a deadline of their own. Real loopback servers: one answering 503
every time, a refused port, one that goes silent, one trickling its headers. A short deadline and
a long back-off; what is checked is what the servers saw, the words and the classification.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from queues.core.retries import outage_of
from queues.steps.fetch import DownloadError, download, fetch_bytes
from queues.steps.netpolicy import FetchPolicy
from queues.steps.notify import CallbackError, post_callback
from tests.steps.conftest import Loopback, Reply
from tests.steps.slow_servers import HeaderTrickle, refused_port

# The first repeat would wait 4 s, and the exchange has 2 s in all: no repeat fits.
DEADLINE = 2.0
LONG_BACKOFF = 4.0
PAST = "the next repeat would wait 4s, past the exchange's deadline"


def _policy(deadline: float = DEADLINE) -> FetchPolicy:
    return FetchPolicy(restrict=False, deadline=deadline, timeout=10.0)


@pytest.fixture
def trickle() -> Iterator[HeaderTrickle]:
    server = HeaderTrickle()
    yield server
    server.close()


def _connections(server: HeaderTrickle) -> int:
    """The connections the server took, once it has seen each client go (or finished)."""
    for _ in range(200):
        connections, hung_up, finished = server.counts()
        if hung_up + finished >= connections > 0:
            break
        time.sleep(0.05)
    return server.counts()[0]


# Downloads ---------------------------------------------------------------------------------


def test_a_download_answered_503_gives_up_before_its_deadline_as_an_outage(
    http_server: Loopback, tmp_path: Path
) -> None:
    http_server.add("GET", "/a", Reply(503, b"busy"))

    with pytest.raises(DownloadError) as raised:
        download(http_server.url + "/a", tmp_path / "a", policy=_policy(), retries=3, backoff=4.0)

    assert raised.value.reason.startswith("HTTP 503 Service Unavailable (gave up after 1 attempt: ")
    assert PAST in raised.value.reason
    assert "took longer than" not in raised.value.reason  # ended before the deadline cut it
    outage = outage_of(raised.value)  # the job waits and tries again; it does not fail
    assert outage is not None and "HTTP 503" in outage.reason
    assert len(http_server.seen("GET", "/a")) == 1  # the repeats past the deadline not made
    assert list(tmp_path.iterdir()) == []


def test_a_refused_download_gives_up_before_its_deadline_as_an_outage(tmp_path: Path) -> None:
    with refused_port() as port, pytest.raises(DownloadError) as raised:
        fetch_bytes(f"http://127.0.0.1:{port}/m", policy=_policy(), retries=2, backoff=4.0)

    assert f"connection refused by 127.0.0.1:{port} (gave up after 1 attempt: " in str(raised.value)
    assert PAST in str(raised.value)
    outage = outage_of(raised.value)
    assert outage is not None and "connection refused" in outage.reason


def test_a_deadline_spent_in_the_repeat_of_an_outage_is_that_outage(
    http_server: Loopback, tmp_path: Path
) -> None:
    """503, then the repeat's answer held past the deadline: the deadline ends the repeat of an
    outage, and the download is that outage still, not a server too slow to fail for. The
    deadline leaves the first answer seconds in hand on a loaded machine (1 s did not, in a
    quick tier run beside the whole suite); the held answer is far past it."""
    http_server.add("GET", "/a", Reply(503, b"busy"), Reply(200, b"late", delay=20.0))

    with pytest.raises(DownloadError) as raised:
        download(
            http_server.url + "/a",
            tmp_path / "a",
            policy=_policy(4.0),
            retries=3,
            backoff=0.05,
        )

    assert raised.value.reason == (
        "HTTP 503 Service Unavailable, then took longer than the limit of 4s "
        "(gave up after 2 attempts)"
    )
    outage = outage_of(raised.value)
    assert outage is not None and outage.reason.startswith("HTTP 503 Service Unavailable")
    assert len(http_server.seen("GET", "/a")) == 2


def test_a_download_too_slow_at_its_first_attempt_still_fails(
    trickle: HeaderTrickle, tmp_path: Path
) -> None:
    """No outage before it: a server too slow for the deadline is the depositor's to fix."""
    with pytest.raises(DownloadError) as raised:
        download(trickle.url + "/a", tmp_path / "a", policy=_policy(1.0), retries=2, backoff=0.01)

    assert raised.value.reason == "took longer than the limit of 1s"
    assert outage_of(raised.value) is None
    assert _connections(trickle) == 1


# Callbacks ---------------------------------------------------------------------------------


def test_a_callback_answered_503_gives_up_before_its_deadline_as_an_outage(
    http_server: Loopback,
) -> None:
    http_server.add("POST", "/cb", Reply(503, b"busy"))

    with pytest.raises(CallbackError) as raised:
        post_callback(http_server.url + "/cb", {}, policy=_policy(), retries=2, backoff=4.0)

    assert str(raised.value).startswith(f"callback {http_server.url}/cb: HTTP 503 (")
    assert PAST in str(raised.value)
    assert raised.value.status == 503
    outage = outage_of(raised.value)  # the notify step waits and tries again
    assert outage is not None and outage.reason.startswith("HTTP 503")
    assert len(http_server.seen("POST", "/cb")) == 1


def test_a_refused_callback_gives_up_before_its_deadline_as_an_outage() -> None:
    with refused_port() as port, pytest.raises(CallbackError) as raised:
        post_callback(f"http://127.0.0.1:{port}/cb", {}, policy=_policy(), retries=2, backoff=4.0)

    assert "connection refused" in str(raised.value) and PAST in str(raised.value)
    assert outage_of(raised.value) is not None


def test_a_callbacks_attempts_share_one_deadline(trickle: HeaderTrickle) -> None:
    """The policy's deadline is the whole callback's, every attempt included: a receiver that
    trickles its answer is given it once, not once an attempt."""
    with pytest.raises(CallbackError) as raised:
        post_callback(trickle.url + "/cb", {}, policy=_policy(1.0), retries=2, backoff=0.01)

    assert "took longer than the limit of 1s" in str(raised.value)
    assert outage_of(raised.value) is not None  # unreachable for now: tried again later
    assert _connections(trickle) == 1
