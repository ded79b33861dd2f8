"""The services' sessions (storage, inventory, EZID, access requests) over TLS, against a real
loopback HTTPS server with a certificate of its own for ``localhost`` (tests/steps/tls_servers.py).

Every HTTPS request of these sessions failed before it was sent ("Bad file descriptor", an
outage tried again for ever): the exchange's watchdog duplicated the plain socket the TLS one
had been made from, which the TLS socket had taken over. The host name is still what TLS sends
(SNI) and checks the certificate against. The depositors' fetch policy, which makes its own
connections, is held to the same over TLS (it had no test over TLS before).
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import certifi
import pytest
import requests
from django.test import override_settings

from queues.core.retries import outage_of
from queues.services.depositors import depositor_policy, system_policy
from queues.steps.merritt_wire import service_session
from queues.steps.netpolicy import FetchPolicy, TooSlow, TransferFailed
from queues.steps.notify import CallbackError, post_callback
from queues.steps.storage import HttpStorage, StorageError
from tests.steps.slow_servers import HeaderTrickle
from tests.steps.tls_servers import localhost_certificate, server_context, tls_server


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return localhost_certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def context(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    return server_context(*certificate)


@pytest.fixture
def tls_trickle(context: ssl.SSLContext) -> Iterator[HeaderTrickle]:
    """A server that answers over TLS a byte at a time, each well inside a read's timeout."""
    trickle = HeaderTrickle(tls=context)
    try:
        yield trickle
    finally:
        trickle.close()


def test_a_service_session_speaks_tls_for_the_host_name_it_was_given(
    certificate: tuple[Path, Path], context: ssl.SSLContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The authority the sessions trust, named as an operator names one (requests reads it).
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certificate[0]))
    with tls_server(context) as server:
        session = service_session(retries=0, deadline=10)
        for _ in range(2):  # the second on the pooled connection, watched again
            answer = session.get(f"https://localhost:{server.port}/state", timeout=10)
            assert (answer.status_code, answer.text) == (200, "ok")
        assert server.names == ["localhost"]  # one connection, which sent the name (SNI)

        # The certificate names localhost only: the same server as 127.0.0.1 fails the check.
        with pytest.raises(requests.exceptions.SSLError, match=r"not valid for .127\.0\.0\.1"):
            session.get(f"https://127.0.0.1:{server.port}/state", timeout=10)
        # And a certificate no authority it trusts vouches for is refused.
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", certifi.where())
        with pytest.raises(requests.exceptions.SSLError, match="certificate verify failed"):
            service_session(retries=0, deadline=10).get(
                f"https://localhost:{server.port}/state", timeout=10
            )


def test_a_tls_exchange_is_cut_off_at_its_deadline(
    certificate: tuple[Path, Path],
    tls_trickle: HeaderTrickle,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server that trickles its answer over TLS, each byte well inside the per-read timeout,
    is cut off at the exchange's deadline: an outage, tried again later."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certificate[0]))
    session = service_session(retries=0, deadline=1.0)
    storage = HttpStorage(tls_trickle.url, 9501, timeout=10, session=session)
    with pytest.raises(StorageError, match=r"took longer than the limit of 1s") as raised:
        storage.read_manifest(tls_trickle.url + "/manifest/9501/ark")
    assert outage_of(raised.value) is not None
    assert tls_trickle.counts()[2] == 0  # never sent in full


def test_the_fetch_policy_speaks_tls_for_the_host_name_in_the_url(
    certificate: tuple[Path, Path], context: ssl.SSLContext
) -> None:
    """The depositors' fetches (payloads, manifests, callbacks) connect to the address they
    checked and speak TLS for the URL's host name: sent (SNI) and checked against."""
    policy = FetchPolicy(restrict=False, ca_certs=str(certificate[0]), timeout=10, deadline=10)
    with tls_server(context) as server:
        with policy.open(f"https://localhost:{server.port}/payload") as answer:
            assert answer.status == 200
            assert b"".join(answer.chunks(1024)) == b"ok"
        assert server.names == ["localhost"]
        with pytest.raises(TransferFailed, match=r"'127\.0\.0\.1' doesn't match 'localhost'"):
            policy.open(f"https://127.0.0.1:{server.port}/payload")
        untrusted = FetchPolicy(restrict=False, timeout=10, deadline=10)  # certifi's authorities
        with pytest.raises(TransferFailed, match="certificate verify failed"):
            untrusted.open(f"https://localhost:{server.port}/payload")


def test_a_tls_fetch_is_cut_off_at_its_deadline(
    certificate: tuple[Path, Path], tls_trickle: HeaderTrickle
) -> None:
    """An answer trickled over TLS, each byte inside the per-read timeout: the watchdog shuts
    the connection at the deadline (the socket it watches is the one TLS was set up on)."""
    policy = FetchPolicy(restrict=False, ca_certs=str(certificate[0]), timeout=10, deadline=1)
    with pytest.raises(TooSlow):
        policy.open(tls_trickle.url + "/payload")
    assert tls_trickle.counts()[2] == 0  # never sent in full


def test_the_alert_webhook_speaks_tls_trusting_the_operators_authority(
    certificate: tuple[Path, Path], context: ssl.SSLContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The webhook is the operator's own setting (an internal chat server, behind the site's
    own authority as often as not): it trusts the bundle ``REQUESTS_CA_BUNDLE`` names, as the
    services' sessions and Merritt's ingest door do. It trusted certifi's only, whatever the
    operator set, so such a webhook could not be reached at all."""
    from queues.daemons.alerting import Undelivered, send_webhook

    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    with tls_server(context) as server:
        url = f"https://localhost:{server.port}/hooks/secret"
        with override_settings(MRT_ALERT_WEBHOOK_URL=url):
            with pytest.raises(Undelivered, match="certificate verify failed") as refused:
                send_webhook({"text": "one"})
            assert "secret" not in str(refused.value)
            assert server.posted == []

            monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certificate[0]))
            send_webhook({"text": "two"})
        assert [(path, json.loads(body)) for path, body in server.posted] == [
            ("/hooks/secret", {"text": "two"})
        ]
        assert server.names[-1] == "localhost"


def test_a_depositors_callback_over_tls_trusts_the_public_authorities_only(
    certificate: tuple[Path, Path], context: ssl.SSLContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A depositor's callback goes out under the depositor policy: over TLS it is posted whole
    for the URL's host name, and its server's certificate is checked against certifi's
    authorities, never the operator's bundle (``REQUESTS_CA_BUNDLE`` is for the operator's own
    services, and a bundle of the site's authority alone would make every public server fail)."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certificate[0]))
    with (
        override_settings(MRT_FETCH_ALLOW="127.0.0.0/8, ::1"),
        tls_server(context) as server,
    ):
        url = f"https://localhost:{server.port}/cb/mc/jid1"
        with pytest.raises(CallbackError, match="certificate verify failed"):
            post_callback(url, {"jid": "jid1"}, retries=0, policy=depositor_policy())
        assert server.posted == []
        trusting = replace(depositor_policy(), ca_certs=str(certificate[0]))
        assert post_callback(url, {"jid": "jid1"}, retries=0, policy=trusting) == 200
        assert [(path, json.loads(body)) for path, body in server.posted] == [
            ("/cb/mc/jid1", {"jid": "jid1"})
        ]
        assert server.names[-1] == "localhost"


def test_a_tls_callback_is_cut_off_at_its_deadline(
    certificate: tuple[Path, Path], tls_trickle: HeaderTrickle
) -> None:
    """A receiver that trickles its answer over TLS: the POST is cut off at the policy's
    deadline, an outage (the notify step is tried again later)."""
    policy = FetchPolicy(restrict=False, ca_certs=str(certificate[0]), timeout=10, deadline=1)
    with pytest.raises(CallbackError, match="took longer than the limit of 1s") as raised:
        post_callback(tls_trickle.url + "/cb", {"jid": "jid1"}, retries=0, policy=policy)
    assert outage_of(raised.value) is not None
    assert tls_trickle.counts()[2] == 0  # never sent in full


def test_the_systems_own_fetches_trust_the_operators_authority(
    certificate: tuple[Path, Path], context: ssl.SSLContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An access request's files are fetched from storage's URLs under the system's policy:
    storage behind the site's own authority, whose manifest the storage session read trusting
    ``REQUESTS_CA_BUNDLE``, had its files refused under certifi's."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certificate[0]))
    with (
        tls_server(context) as server,
        system_policy().open(f"https://localhost:{server.port}/content/9501/ark/1/file") as answer,
    ):
        assert (answer.status, b"".join(answer.chunks(1024))) == (200, b"ok")
