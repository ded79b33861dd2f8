"""The alert webhook through the HTTP proxy the environment names (``HTTP_PROXY``/``HTTPS_PROXY``,
``NO_PROXY``), against a real loopback proxy (tests/steps/test_service_proxies.py's) and real
loopback receivers: a site whose only way to Slack is its proxy gets its alerts. Only the
system's own requests take the proxy; a depositor's server is still reached at the address that
was checked, proxy or not.

The policy connected to the address it had checked for every request, the webhook's included,
so the webhook never went through a proxy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from queues.daemons.alerting import Undelivered, deliver_due, send_webhook
from queues.models import AlertMessage
from queues.services.depositors import depositor_policy
from queues.steps.netpolicy import SYSTEM, TooSlow
from queues.steps.notify import post_callback
from tests.steps.slow_servers import HeaderTrickle, refused_port
from tests.steps.test_service_proxies import Proxy
from tests.steps.tls_servers import localhost_certificate, server_context, tls_server

from .conftest import WEBHOOK_PATH, Webhook
from .test_delivery import fire

PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return localhost_certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Proxy]:
    """A plain HTTP proxy on loopback, named for both schemes as an operator names it."""
    server = Proxy()
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", server.url)
    monkeypatch.setenv("HTTPS_PROXY", server.url)
    try:
        yield server
    finally:
        server.close()


@pytest.mark.django_db
def test_an_alert_reaches_the_webhook_through_the_proxy(
    zk: Any, proxy: Proxy, webhook: Webhook, evaluator: Any
) -> None:
    t = fire(zk, evaluator)
    assert deliver_due(now=t) == 1
    [post] = webhook.posts
    # Forwarded: the request in absolute form, to the proxy (which passes it on as it came).
    assert proxy.seen == [f"POST {webhook.url} HTTP/1.1"]
    assert post["path"] == webhook.url and "ALERT" in post["json"]["text"]
    assert AlertMessage.objects.get(channel="webhook").sent is not None


def test_an_https_webhook_is_reached_through_a_connect_tunnel(
    proxy: Proxy, certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """TLS inside the tunnel is with the webhook's host, checked against the operator's bundle
    (REQUESTS_CA_BUNDLE), as without a proxy."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certificate[0]))
    with tls_server(server_context(*certificate)) as server:
        url = f"https://localhost:{server.port}{WEBHOOK_PATH}"
        with override_settings(MRT_ALERT_WEBHOOK_URL=url, MRT_ALERT_WEBHOOK_FORMAT="slack"):
            send_webhook({"text": "ALERT through the proxy"})
        assert server.posted == [(WEBHOOK_PATH, b'{"text": "ALERT through the proxy"}')]
        assert server.names == ["localhost"]
    assert proxy.seen == [f"CONNECT localhost:{server.port} HTTP/1.0"]


def test_no_proxy_sends_the_webhook_straight_to_its_host(
    proxy: Proxy, webhook: Webhook, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NO_PROXY", "example.org,127.0.0.1")
    send_webhook({"text": "ALERT"})
    assert [post["json"] for post in webhook.posts] == [{"text": "ALERT"}]
    assert proxy.seen == []


@pytest.mark.django_db
def test_a_depositors_callback_ignores_the_proxy(proxy: Proxy, webhook: Webhook) -> None:
    """The depositor's policy connects to the address it checked, proxy or not."""
    status = post_callback(webhook.url, {"jobID": "jid"}, retries=0, policy=depositor_policy())
    assert status == 200
    assert [post["json"] for post in webhook.posts] == [{"jobID": "jid"}]
    assert proxy.seen == []


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_receiver_trickling_behind_the_proxy_is_cut_off_at_the_deadline(
    proxy: Proxy, certificate: tuple[Path, Path], scheme: str
) -> None:
    """The proxy's connection (CONNECT and TLS through it included) is the exchange's: a
    receiver answering a byte every 0.05 s is cut off at the policy's one deadline."""
    trickle = HeaderTrickle(tls=server_context(*certificate) if scheme == "https" else None)
    policy = replace(SYSTEM, timeout=10, deadline=1.0, min_rate=0, ca_certs=str(certificate[0]))
    try:
        with pytest.raises(TooSlow, match=r"took longer than the limit of 1s"):
            policy.open(trickle.url + "/hook", method="POST", body=b"{}")
        [line] = proxy.seen
        assert line.split(" ")[0] == ("CONNECT" if scheme == "https" else "POST")
        assert trickle.counts()[2] == 0  # never sent in full
    finally:
        trickle.close()


def test_a_proxy_that_is_not_http_is_named_in_the_webhooks_error(
    webhook: Webhook, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "socks5://127.0.0.1:1080")
    with pytest.raises(Undelivered, match=r"HTTP_PROXY must name an http:// proxy") as raised:
        send_webhook({"text": "ALERT"})
    assert "secret-token" not in str(raised.value)
    assert webhook.posts == []


def test_a_proxy_with_a_password_that_refuses_is_named_without_it(
    webhook: Webhook, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY=http://user:password@proxy: the webhook's error names the proxy by host and
    port, never its password (a guard)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with refused_port() as port:
        monkeypatch.setenv("HTTP_PROXY", f"http://proxyuser:pr0xy@127.0.0.1:{port}")
        with pytest.raises(Undelivered, match=f"the proxy 127.0.0.1:{port} for") as raised:
            send_webhook({"text": "ALERT"})
    assert "pr0xy" not in str(raised.value) and "secret-token" not in str(raised.value)
    assert webhook.posts == []
