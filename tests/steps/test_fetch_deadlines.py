"""The fetch policy's limits on the whole response, and what its failures are called.

Real loopback servers below HTTP (tests/steps/slow_servers.py): one trickles its status line and
headers a byte at a time, one never answers, and a port that refuses. Assertions are on what the
server saw (connections, clients hanging up before it finished) and on the messages.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from queues.steps.fetch import DownloadError, download, head_size
from queues.steps.netpolicy import FetchPolicy, FetchRefused, parse_networks
from tests.steps.conftest import Loopback
from tests.steps.slow_servers import HeaderTrickle, Silent, refused_port


@pytest.fixture
def trickle() -> Iterator[HeaderTrickle]:
    server = HeaderTrickle()
    yield server
    server.close()


def _cut_off(server: HeaderTrickle) -> tuple[int, int, int]:
    """The server's counts once it has noticed the client is gone (or finished after all)."""
    for _ in range(200):
        connections, hung_up, finished = server.counts()
        if hung_up + finished >= connections > 0:
            break
        time.sleep(0.05)
    return server.counts()


def test_trickled_headers_are_cut_off_at_the_deadline(
    trickle: HeaderTrickle, tmp_path: Path
) -> None:
    policy = FetchPolicy(restrict=False, deadline=1.0, timeout=10.0)

    with pytest.raises(DownloadError, match=r"took longer than the limit of 1s$"):
        download(trickle.url + "/a", tmp_path / "a", policy=policy, retries=2, backoff=0.01)

    assert _cut_off(trickle) == (1, 1, 0), "one connection, abandoned, never asked again"
    assert list(tmp_path.iterdir()) == []


def test_headers_slower_than_the_minimum_rate_fail_after_one_window(
    trickle: HeaderTrickle, tmp_path: Path
) -> None:
    policy = FetchPolicy(restrict=False, deadline=None, min_rate=1000, rate_window=1.0)

    with pytest.raises(
        DownloadError,
        match=r"sent no complete response headers within 1s, below the minimum of 1000 bytes/s",
    ):
        download(trickle.url + "/a", tmp_path / "a", policy=policy, retries=0)

    assert _cut_off(trickle) == (1, 1, 0)


def test_a_size_question_gets_its_timeout_for_the_whole_answer(trickle: HeaderTrickle) -> None:
    # The depositor policy's deadline is hours, made for downloads; estimating's HEAD may not
    # take that long just because each header byte comes within the per-read timeout.
    policy = FetchPolicy(restrict=False, deadline=6 * 3600.0, timeout=10.0)

    assert head_size(trickle.url + "/a", timeout=1.0, policy=policy) is None

    assert _cut_off(trickle) == (1, 1, 0)


def test_a_refused_connection_is_called_refused(tmp_path: Path) -> None:
    with refused_port() as port, pytest.raises(DownloadError) as caught:
        download(f"http://127.0.0.1:{port}/a", tmp_path / "a", retries=0, timeout=5.0)

    assert caught.value.reason == (
        f"connection refused by 127.0.0.1:{port} (gave up after attempt)"
    )


def test_a_refused_connection_names_the_host_as_written_and_its_address(tmp_path: Path) -> None:
    with refused_port() as port, pytest.raises(DownloadError) as caught:
        download(f"http://127.1:{port}/a", tmp_path / "a", retries=0, timeout=5.0)

    assert f"connection refused by 127.1:{port} (127.0.0.1)" in caught.value.reason


def test_a_server_that_never_answers_is_a_timeout_naming_it(tmp_path: Path) -> None:
    silent = Silent()
    try:
        with pytest.raises(DownloadError) as caught:
            download(silent.url + "/a", tmp_path / "a", retries=0, timeout=0.5)
    finally:
        silent.close()

    assert caught.value.reason == (
        f"no answer from 127.0.0.1:{silent.port}, timed out after 0.5s (gave up after attempt)"
    )


# IPv6 addresses that carry an IPv4 one ----------------------------------------------------

LOOPBACK_INSIDE = {
    "2002:7f00:1::": "a 6to4 address embedding 127.0.0.1, a loopback address",
    "2002:a00:1::5": "a 6to4 address embedding 10.0.0.1, a private address",
    "64:ff9b::7f00:1": "a NAT64 address embedding 127.0.0.1, a loopback address",
    "64:ff9b::a9fe:a9fe": "a NAT64 address embedding 169.254.169.254, a link-local address",
    "::ffff:7f00:1": "an IPv4-mapped address embedding 127.0.0.1, a loopback address",
    "::7f00:1": "an IPv4-compatible address embedding 127.0.0.1, a loopback address",
    # Teredo stores the client's address inverted: 0x80fffffe is 127.0.0.1.
    "2001:0:4136:e378:8000:63bf:80ff:fffe": (
        "a Teredo address embedding 127.0.0.1, a loopback address"
    ),
}


@pytest.mark.parametrize(("address", "why"), list(LOOPBACK_INSIDE.items()))
def test_an_ipv6_address_is_judged_by_the_ipv4_address_it_embeds(address: str, why: str) -> None:
    policy = FetchPolicy(restrict=True)
    url = f"http://[{address}]:8080/a"

    with pytest.raises(FetchRefused) as caught:
        policy.resolve(url)

    assert caught.value.reason == (
        f"host {address} resolves to {ipaddress.ip_address(address)}, {why}, "
        "which is not fetched for depositors"
    )


def test_a_translated_address_of_a_public_ipv4_one_is_fetched() -> None:
    # What DNS64 hands an IPv6-only host for a depositor with IPv4 only.
    policy = FetchPolicy(restrict=True)

    assert policy.check_address(ipaddress.ip_address("64:ff9b::808:808")) is None
    assert policy.check_address(ipaddress.ip_address("::ffff:8.8.8.8")) is None


def test_an_allowed_network_covers_its_addresses_in_ipv6_dress(
    http_server: Loopback, tmp_path: Path
) -> None:
    policy = FetchPolicy(restrict=True, allow=parse_networks("127.0.0.0/8"))
    url = http_server.file("/a", b"mapped").replace("127.0.0.1", "[::ffff:127.0.0.1]")

    assert download(url, tmp_path / "a", policy=policy).size == len(b"mapped")
    assert http_server.seen("GET", "/a")


# IANA's special-purpose registries, not Python's is_global alone ---------------------------

# One address from each block found passing (Python 3.11's is_global takes them for public
# ones; 5f00::/16 and 100:0:0:1::/64, also missing from its list, are refused as reserved).
NOT_GLOBALLY_REACHABLE = {
    "fec0::1": "fec0::/10 (Deprecated site-local, RFC 3879)",
    "3fff::1": "3fff::/20 (Documentation, RFC 9637)",
    "192.88.99.1": "192.88.99.0/24 (Deprecated (6to4 Relay Anycast), RFC 7526)",
}


@pytest.mark.parametrize(("address", "block"), list(NOT_GLOBALLY_REACHABLE.items()))
def test_a_block_the_iana_registry_calls_not_globally_reachable_is_refused(
    address: str, block: str
) -> None:
    policy = FetchPolicy(restrict=True)
    host = f"[{address}]" if ":" in address else address

    with pytest.raises(FetchRefused) as caught:
        policy.resolve(f"http://{host}:8080/a")

    assert caught.value.reason == (
        f"host {address} resolves to {address}, in {block}, not globally reachable, "
        "which is not fetched for depositors"
    )


def test_the_registry_tables_decide_by_the_most_specific_block() -> None:
    from queues.steps.special_addresses import not_globally_reachable, special_block

    # Inside "IETF Protocol Assignments" (not reachable), PCP anycast is reachable.
    assert not_globally_reachable(ipaddress.ip_address("192.0.0.9")) is None
    assert not_globally_reachable(ipaddress.ip_address("192.0.0.1")) is not None
    # Teredo and 6to4 are N/A in the registry: judged by the IPv4 address they embed.
    assert special_block(ipaddress.ip_address("2002:808:808::1")).globally_reachable is None
    assert FetchPolicy(restrict=True).check_address(ipaddress.ip_address("8.8.8.8")) is None
    assert FetchPolicy(restrict=True).check_address(ipaddress.ip_address("2606:4700::1")) is None


def test_the_depositor_policy_follows_its_settings(settings: Any) -> None:
    """Made once for the same settings (the downloading loop asks for it for every job), and
    made again when one of them changes."""
    from queues.services.depositors import depositor_policy

    settings.MRT_FETCH_ALLOW = "10.1.0.0/16"
    settings.MRT_DOWNLOAD_DEADLINE = 0
    first = depositor_policy()
    assert depositor_policy() is first
    assert first.allow == (ipaddress.ip_network("10.1.0.0/16"),) and first.deadline is None
    settings.MRT_FETCH_ALLOW = "10.2.0.0/16"
    settings.MRT_DOWNLOAD_DEADLINE = 600
    again = depositor_policy()
    assert again.allow == (ipaddress.ip_network("10.2.0.0/16"),) and again.deadline == 600
    assert depositor_policy(timeout=3).timeout == 3
    assert depositor_policy().timeout == settings.MRT_HTTP_TIMEOUT


def test_the_systems_own_requests_are_cut_off_at_the_downloads_deadline(
    trickle: HeaderTrickle, tmp_path: Path, settings: Any
) -> None:
    """Local storage's and the local inventory's manifests (URLs from a job's ``store`` and
    ``inventory`` nodes, which other clients write) are fetched under the system's policy made
    from the settings: a server that trickles its answer within every read's timeout is cut off
    at MRT_DOWNLOAD_DEADLINE, where before it held the step's thread for ever."""
    from queues.daemons import clients
    from queues.steps.inventory import InventoryError
    from queues.steps.storage import StorageError

    settings.MRT_DOWNLOAD_DEADLINE = 1.0
    settings.MRT_HTTP_TIMEOUT = 10.0
    settings.MRT_STORAGE_URL = ""
    settings.MRT_INVENTORY_URL = ""
    settings.MRT_STORAGE_ROOT = str(tmp_path / "storage")

    with pytest.raises(StorageError, match=r"took longer than the limit of 1s"):
        clients.storage().read_manifest(trickle.url + "/manifest")
    assert _cut_off(trickle) == (1, 1, 0)

    with pytest.raises(InventoryError, match=r"took longer than the limit of 1s"):
        clients.inventory().record(
            ark="ark:/99999/fk4test", version=1, manifest_url=trickle.url + "/manifest"
        )
    assert _cut_off(trickle) == (2, 2, 0)


def test_a_request_made_without_a_policy_is_bounded_as_the_systems_own() -> None:
    from queues.steps.fetch import _policy
    from queues.steps.netpolicy import SYSTEM

    assert SYSTEM.deadline is not None and SYSTEM.min_rate > 0 and not SYSTEM.restrict
    made = _policy(None, 5.0)
    assert (made.timeout, made.deadline, made.min_rate) == (5.0, SYSTEM.deadline, SYSTEM.min_rate)


def test_a_name_lookup_slower_than_the_request_may_take_is_given_up_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The system resolver's timeouts (seconds a server and try) came on top of a request's
    deadline: no socket exists yet for the watchdog. The one stand-in of this suite for a part
    outside it: the resolver cannot be pointed at a loopback server for one process, so the
    lookup of this one name waits until the test lets it go."""
    import socket

    from queues.steps.netpolicy import TransferFailed

    real = socket.getaddrinfo
    held = threading.Event()

    def lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "slow.example":
            held.wait(60)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    policy = FetchPolicy(restrict=False, deadline=1.0, timeout=10.0)
    try:
        with pytest.raises(TransferFailed, match=r"looking up host 'slow.example' took longer"):
            policy.open("http://slow.example/")
        with pytest.raises(TransferFailed, match=r"took longer than 0.5s"):
            FetchPolicy(restrict=False, timeout=0.5).resolve("http://slow.example/")
    finally:
        held.set()
    # An address is not looked up in a thread of its own, and a name that answers is taken.
    assert FetchPolicy(restrict=False).resolve("http://127.0.0.1:9/")[2] == ipaddress.ip_address(
        "127.0.0.1"
    )
    assert FetchPolicy(restrict=False).resolve("http://localhost:9/")[0] == "localhost"
