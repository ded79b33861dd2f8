"""A password in the URL of one of Merritt's services (``MRT_STORAGE_URL``,
``MRT_INVENTORY_URL``, ``MRT_EZID_URL``, ``MRT_ACCESS_REQUESTS_URL``: ``https://user:password@
host/``, which requests sends as HTTP Basic authentication) is shown as ``***`` in every word
said about an exchange with it: those words become a job's status message in ZooKeeper (read
by Merritt's services), a breaker's reason in its hold, log lines, pages and mails.

Each client named the URL whole when the service was away or answered something else, so the
password went everywhere a job's status goes.
"""

from __future__ import annotations

import pytest

from queues.core.retries import outage_of
from queues.steps.access import RequestError, read_merritt_request
from queues.steps.inventory import HttpInventory, InventoryError
from queues.steps.merritt_wire import service_session
from queues.steps.minting import EzidMinter, MintError
from queues.steps.storage import HttpStorage, StorageError
from tests.steps.conftest import Loopback, Reply
from tests.steps.slow_servers import refused_port

ARK = "ark:/99999/fk4x"
HTML = b"<html><body><numVersions>3</numVersions></body></html>"


def _with_password(url: str) -> str:
    return url.replace("http://", "http://merritt:s3cret@")


def _words(raised: pytest.ExceptionInfo[BaseException]) -> list[str]:
    """What is said about the failure: its message and the outage's reason, if any."""
    outage = outage_of(raised.value)
    return [str(raised.value)] + ([str(outage)] if outage is not None else [])


def test_storage_away_is_said_without_its_password() -> None:
    with refused_port() as port:
        base = f"http://merritt:s3cret@127.0.0.1:{port}"
        storage = HttpStorage(base, 9501, timeout=5, session=service_session(retries=0))
        with pytest.raises(StorageError) as raised:
            storage.latest_version(ARK)
    assert f"unreachable at http://merritt:***@127.0.0.1:{port}/state/9501/" in str(raised.value)
    assert all("s3cret" not in said for said in _words(raised))


def test_a_page_where_storage_should_answer_is_said_without_its_password(
    http_server: Loopback,
) -> None:
    # This reason is an outage's too: the breaker keeps it in the storage node's hold.
    http_server.add(
        "GET",
        f"/state/9501/{ARK.replace(':', '%3A').replace('/', '%2F')}?t=xml",
        Reply(200, HTML, {"Content-Type": "text/html"}),
    )
    storage = HttpStorage(_with_password(http_server.url), 9501, timeout=5)
    with pytest.raises(StorageError) as raised:
        storage.latest_version(ARK)
    assert "storage answered http://merritt:***@127.0.0.1:" in str(raised.value)
    assert all("s3cret" not in said for said in _words(raised))
    [request] = http_server.requests
    assert request.headers["Authorization"].startswith("Basic ")  # the password still went


def test_inventory_away_is_said_without_its_password() -> None:
    with refused_port() as port:
        base = f"http://merritt:s3cret@127.0.0.1:{port}"
        inventory = HttpInventory(base, timeout=5, session=service_session(retries=0))
        with pytest.raises(InventoryError) as raised:
            inventory.record(ark=ARK, version=1, manifest_url="http://storage.example.org/m")
    assert f"unreachable at http://merritt:***@127.0.0.1:{port}/add" in str(raised.value)
    assert all("s3cret" not in said for said in _words(raised))


def test_ezid_away_is_said_without_its_password() -> None:
    with refused_port() as port:
        base = f"http://merritt:s3cret@127.0.0.1:{port}"
        ezid = EzidMinter(
            base, "apitest", "ezid-pw", timeout=5, session=service_session(retries=0), retries=0
        )
        with pytest.raises(MintError) as raised:
            ezid.mint("ark:/99999/fk4", {})
    assert f"EZID at http://merritt:***@127.0.0.1:{port} unreachable" in str(raised.value)
    for said in _words(raised):
        assert "s3cret" not in said and "ezid-pw" not in said


@pytest.mark.parametrize("reply", [Reply(404), Reply(500), Reply(200, b"<html/>")])
def test_an_assembly_request_not_read_is_said_without_the_password(
    http_server: Loopback, reply: Reply
) -> None:
    http_server.add("GET", "/requests/tok1/status", reply)
    with pytest.raises(RequestError) as raised:
        read_merritt_request(_with_password(http_server.url) + "/requests", "tok1", timeout=5)
    assert "http://merritt:***@127.0.0.1:" in str(raised.value)
    assert "s3cret" not in str(raised.value)


def test_a_proxy_with_a_password_that_refuses_is_said_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTP_PROXY=http://user:password@proxy: requests' words about a proxy it could not reach
    name its host and port only (a guard: they always did)."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with refused_port() as port:
        monkeypatch.setenv("HTTP_PROXY", f"http://proxyuser:pr0xy@127.0.0.1:{port}")
        storage = HttpStorage(
            "http://storage.example.org", 9501, timeout=5, session=service_session(retries=0)
        )
        with pytest.raises(StorageError) as raised:
            storage.latest_version(ARK)
    assert "Unable to connect to proxy" in str(raised.value)
    assert all("pr0xy" not in said for said in _words(raised))
