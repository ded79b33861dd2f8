"""What a breaker's probe asks, and of whom: only the root of the server the held service
names, under the depositor policy for a depositor's or callback receiver's server.

The probe's URL is kept in the hold node (``/mrt-console/holds/services/...``), which any client
of the ensemble may write; and a depositor's root is the depositor's to answer as it likes. A
probe that followed a redirect, or asked whatever URL the node named, was a request into the
machine's own network that the depositor policy forbids (and its answer released the hold).

A storage node, inventory and EZID release their hold only on their own answer to the probe
(the node's state, inventory's service state, EZID's login line): any page a wrong URL's server
answered 200 with released it, and every job met the wrong answer again.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from queues.chaos.standins import (
    Answer,
    EzidStandIn,
    InventoryStandIn,
    StandIn,
    StorageStandIn,
    running,
)
from queues.daemons import breakers as breaker_module
from queues.daemons.breakers import _answers, probe_url
from queues.zk.maintenance import node_holds, service_holds


class Counted(ThreadingHTTPServer):
    """A loopback server answering every GET with ``status`` (and ``location``, ``body``),
    counting the requests it took."""

    def __init__(
        self, status: int, location: str = "", body: bytes = b"", content_type: str = ""
    ) -> None:
        self.status, self.location, self.asked = status, location, 0
        self.authorization: list[str] = []  # each request's Authorization header, if any
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.asked += 1
                outer.authorization.append(self.headers.get("Authorization", ""))
                self.send_response(outer.status)
                if outer.location:
                    self.send_header("Location", outer.location)
                if content_type:
                    self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/"
        self.name = f"127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.fixture
def internal() -> Iterator[Counted]:
    server = Counted(200)
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def redirecting(internal: Counted) -> Iterator[Counted]:
    server = Counted(302, internal.url + "internal-admin")
    yield server
    server.shutdown()
    server.server_close()


def test_the_probe_is_the_root_of_the_server_the_service_names_and_nothing_else() -> None:
    name = "depositor example.org:443"
    assert probe_url(name, "https://example.org/") == "https://example.org/"
    assert probe_url(name, "https://example.org:443/") == "https://example.org:443/"
    assert probe_url(name, "https://example.org/admin") == ""  # not its root
    assert probe_url(name, "http://127.0.0.1:8080/") == ""  # another server
    assert probe_url(name, "https://example.org:8443/") == ""  # another port
    assert probe_url(name, "file:///etc/passwd") == ""
    assert probe_url("callback hooks.example.org:8443", "https://hooks.example.org:8443/") != ""
    assert probe_url(name, "") == ""


def test_a_depositors_redirect_is_its_answer_and_is_not_followed(
    redirecting: Counted, internal: Counted
) -> None:
    assert _answers(f"depositor {redirecting.name}", redirecting.url)
    assert redirecting.asked == 1
    assert internal.asked == 0  # the address it pointed to was never asked


def test_a_depositor_server_at_a_forbidden_address_is_not_asked(
    redirecting: Counted, settings: Any
) -> None:
    settings.MRT_FETCH_ALLOW = ""  # loopback is the machine's own network again
    assert not _answers(f"depositor {redirecting.name}", redirecting.url)
    assert redirecting.asked == 0


NODE_STATE = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b'<nod:nodeState xmlns:nod="http://uc3.cdlib.org/ontology/mrt/store/node">'
    b"<nod:identifier>9501</nod:identifier><nod:name>s3 node</nod:name></nod:nodeState>"
)
INV_SERVICE_STATE = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b'<invsv:invServiceState xmlns:invsv="http://uc3.cdlib.org/ontology/mrt/inv/service">'
    b"<invsv:name>inventory</invsv:name><invsv:systemStatus>running</invsv:systemStatus>"
    b"</invsv:invServiceState>"
)
HTML = b"<html><head><title>Welcome to nginx!</title></head><body>It works</body></html>"
OBJECT_STATE = (
    b'<obj:objectState xmlns:obj="http://uc3.cdlib.org/ontology/mrt/store/object">'
    b"<obj:numVersions>1</obj:numVersions></obj:objectState>"
)
EXCEPTION = (
    b'<exc:tException.REQUESTED_ITEM_NOT_FOUND xmlns:exc="http://uc3.cdlib.org/ontology/mrt/'
    b'core/exc"><exc:error>Node not found: 9501</exc:error>'
    b"</exc:tException.REQUESTED_ITEM_NOT_FOUND>"
)


@pytest.mark.parametrize(
    ("service", "status", "body", "up"),
    [
        ("storage node 9501", 200, NODE_STATE, True),
        ("storage node 9501", 200, HTML, False),
        ("storage node 9501", 200, b"", False),
        ("storage node 9501", 200, b'{"ok": true}', False),
        ("storage node 9501", 200, OBJECT_STATE, False),  # another of storage's documents
        ("storage node 9501", 200, INV_SERVICE_STATE, False),  # inventory's, not a node's
        ("storage node 9501", 404, EXCEPTION, False),  # storage knows no such node
        ("storage node 9501", 302, NODE_STATE, False),  # no 2xx
        ("inventory", 200, INV_SERVICE_STATE, True),
        ("inventory", 200, HTML, False),
        ("inventory", 200, NODE_STATE, False),
        ("ezid", 200, b"success: session cookie returned\n", True),
        ("ezid", 200, HTML, False),
        ("ezid", 200, b"success: EZID is up\n", False),  # /status, which asks no credentials
    ],
)
def test_a_merritt_service_answers_its_probe_only_with_its_own_answer(
    service: str, status: int, body: bytes, up: bool, settings: Any
) -> None:
    """A server at a wrong MRT_STORAGE_URL, MRT_INVENTORY_URL or MRT_EZID_URL answering 200
    with a page of its own was taken for the service answering again."""
    server = Counted(status, body=body, content_type="text/html" if body == HTML else "text/xml")
    try:
        base = server.url.rstrip("/")
        settings.MRT_STORAGE_URL = settings.MRT_INVENTORY_URL = settings.MRT_EZID_URL = base
        settings.MRT_EZID_USER, settings.MRT_EZID_PASSWORD = "apitest", "s3cret"
        assert _answers(service, probe_url(service)) is up
        assert server.asked == 1
    finally:
        server.shutdown()
        server.server_close()


def _held(zk: Any, service: str) -> bool:
    if service.startswith("storage node "):
        return 9501 in node_holds(zk)
    return service in service_holds(zk)


@pytest.mark.django_db
@pytest.mark.zookeeper
@pytest.mark.parametrize("service", ["storage node 9501", "inventory", "ezid"])
def test_a_page_at_the_probe_keeps_the_breakers_hold_and_the_services_answer_releases_it(
    service: str, zk: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hold the breaker placed for an answer about the console stays while the probe's URL
    answers 200 with a page (the cycle: release, every job meets the page, hold again, until
    the jobs' retry policies are spent), and goes once the stand-in answers as the service."""
    monkeypatch.setattr(breaker_module, "_breakers", breaker_module.Breakers())
    stand_ins: dict[str, StandIn] = {
        "storage node 9501": StorageStandIn(nodes=(9501,)),
        "inventory": InventoryStandIn(),
        "ezid": EzidStandIn("apitest", "s3cret"),
    }
    with running(stand_ins[service]) as stand_in:
        settings.MRT_STORAGE_URL = settings.MRT_INVENTORY_URL = settings.MRT_EZID_URL = ""
        setting = {"storage node 9501": "STORAGE", "inventory": "INVENTORY", "ezid": "EZID"}
        setattr(settings, f"MRT_{setting[service]}_URL", stand_in.url)
        settings.MRT_EZID_USER, settings.MRT_EZID_PASSWORD = "apitest", "s3cret"
        for _ in range(20):
            stand_in.refuse_next(Answer(200, HTML, "text/html"), "GET")
        breakers = breaker_module.breakers()
        assert breakers.failed(zk, service, "HTTP 200 without its answer", ours=True)
        start = time.monotonic()
        assert breakers.probe(zk, now=start) == []  # the first probe is 5 s away
        assert breakers.probe(zk, now=start + 6) == []
        assert len(stand_in.seen("GET")) == 1 and _held(zk, service)

        stand_in.stop_refusing()
        assert breakers.probe(zk, now=start + 17) == [service]
        assert len(stand_in.seen("GET")) == 2 and not _held(zk, service)


@pytest.mark.django_db
@pytest.mark.zookeeper
def test_a_breakers_hold_keeps_its_probe_without_the_services_password(
    zk: Any, settings: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """MRT_INVENTORY_URL may carry user:password: the hold (read by anyone with the ensemble,
    shown by zkdump) and the probe's log line name it with the password as ***, and the probe
    still asks with the password of the setting."""
    monkeypatch.setattr(breaker_module, "_breakers", breaker_module.Breakers())
    server = Counted(200, body=HTML, content_type="text/html")
    try:
        settings.MRT_INVENTORY_URL = server.url.replace("http://", "http://merritt:s3cret@")
        breakers = breaker_module.breakers()
        assert breakers.failed(zk, "inventory", "HTTP 200 without its answer", ours=True)
        assert service_holds(zk)["inventory"].probe == (
            f"http://merritt:***@{server.name}/state?t=xml"
        )
        start = time.monotonic()
        with caplog.at_level(logging.INFO, logger=breaker_module.log.name):
            assert breakers.probe(zk, now=start) == []
            assert breakers.probe(zk, now=start + 6) == []
        assert server.authorization == ["Basic " + base64.b64encode(b"merritt:s3cret").decode()]
        assert f"its probe http://merritt:***@{server.name}/state" in caplog.text
        assert "s3cret" not in caplog.text
    finally:
        server.shutdown()
        server.server_close()
