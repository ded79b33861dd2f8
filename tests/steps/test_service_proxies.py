"""The services' sessions through an HTTP proxy (``HTTP_PROXY``/``HTTPS_PROXY``, which requests
reads), against a real loopback proxy, spoken to plainly or over TLS (an ``https://`` proxy
URL): forwarding for ``http``, a CONNECT tunnel for ``https``.

Through a proxy requests opens its connections in a proxy manager of its own, whose pools were
not the watched ones (``EXCHANGE_POOLS``): a service trickling its answer behind the proxy held
the exchange past its deadline, and the proxy's name was looked up with the resolver's own
timeouts. The proxy manager now gets the same pools (a SOCKS proxy's are left as they are), and
the watchdog takes the TLS of a tunnel inside a TLS proxy connection too.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from queues.core.retries import outage_of
from queues.steps.merritt_wire import service_session
from queues.steps.storage import HttpStorage, StorageError
from tests.steps.slow_servers import HeaderTrickle
from tests.steps.tls_servers import localhost_certificate, server_context, tls_server


class Proxy:
    """A loopback HTTP proxy: a request in absolute form is passed to its server, a CONNECT
    opens a tunnel; then bytes are copied both ways. ``seen`` holds each request line."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.seen: list[str] = []
        self.tls = tls
        self.listener = socket.create_server(("127.0.0.1", 0))
        port = self.listener.getsockname()[1]
        self.url = f"https://localhost:{port}" if tls else f"http://127.0.0.1:{port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _peer = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError), client:
            if self.tls is not None:
                client = self.tls.wrap_socket(client, server_side=True)
            head = b""
            while b"\r\n\r\n" not in head:
                data = client.recv(4096)
                if not data:
                    return
                head += data
            line = head.split(b"\r\n", 1)[0].decode()
            self.seen.append(line)
            method, target, _version = line.split(" ")
            if method == "CONNECT":
                host, port = target.rsplit(":", 1)
            else:
                parts = urlsplit(target)
                host, port = parts.hostname or "", str(parts.port or 80)
            with socket.create_connection((host, int(port)), timeout=30) as server:
                if method == "CONNECT":
                    client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                else:
                    server.sendall(head)
                threading.Thread(target=self._copy, args=(server, client), daemon=True).start()
                self._copy(client, server)

    @staticmethod
    def _copy(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return localhost_certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture(params=["plain", "tls"])
def proxy(
    request: pytest.FixtureRequest,
    certificate: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Proxy]:
    """The proxy, spoken to plainly or over TLS, named for both schemes as an operator names
    it (the lower-case names, which win over these, and NO_PROXY taken away); its certificate
    and the services' trusted through REQUESTS_CA_BUNDLE."""
    server = Proxy(tls=server_context(*certificate) if request.param == "tls" else None)
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", server.url)
    monkeypatch.setenv("HTTPS_PROXY", server.url)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certificate[0]))
    try:
        yield server
    finally:
        server.close()


def test_a_service_is_reached_through_the_proxy(
    proxy: Proxy, certificate: tuple[Path, Path]
) -> None:
    with tls_server(server_context(*certificate)) as server:
        session = service_session(retries=0, deadline=10)
        for _ in range(2):  # the second through the tunnel kept open
            answer = session.get(f"https://localhost:{server.port}/state", timeout=10)
            assert (answer.status_code, answer.text) == (200, "ok")
        assert proxy.seen == [f"CONNECT localhost:{server.port} HTTP/1.0"]
        assert server.names == ["localhost"]  # TLS with the service, for its name


# requests does not check an https:// proxy's certificate for an http:// URL (its own doing,
# with or without this console's pools), and urllib3 warns of it.
@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_service_trickling_behind_the_proxy_is_cut_off_at_the_deadline(
    proxy: Proxy, certificate: tuple[Path, Path], scheme: str
) -> None:
    """Its answer a byte every 0.05 s, within every read's timeout: cut off at the exchange's
    deadline, an outage, as without a proxy. It was read whole, half a minute later."""
    tls = server_context(*certificate) if scheme == "https" else None
    trickle = HeaderTrickle(tls=tls)
    try:
        storage = HttpStorage(
            trickle.url, 9501, timeout=10, session=service_session(retries=0, deadline=1.0)
        )
        with pytest.raises(StorageError, match=r"took longer than the limit of 1s") as raised:
            storage.read_manifest(trickle.url + "/manifest/9501/ark")
        assert outage_of(raised.value) is not None
        [line] = proxy.seen
        assert line.split(" ")[0] == ("CONNECT" if scheme == "https" else "GET")
        assert trickle.counts()[2] == 0  # never sent in full
    finally:
        trickle.close()


def test_the_proxys_name_is_looked_up_within_the_deadline(
    proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
    held_lookups: tuple[threading.Event, list[str]],
) -> None:
    """A proxy whose name the resolver holds: given up at the exchange's deadline, an outage,
    as for the service's own name without a proxy."""
    release, _threads = held_lookups
    parts = urlsplit(proxy.url)
    monkeypatch.setenv("HTTP_PROXY", f"{parts.scheme}://proxy.slow.example:{parts.port}")
    storage = HttpStorage(
        "http://127.0.0.1:9", 9501, timeout=10, session=service_session(retries=0, deadline=1)
    )
    with pytest.raises(StorageError) as raised:
        storage.read_manifest("http://127.0.0.1:9/manifest/9501/ark")
    assert outage_of(raised.value) is not None
    assert not release.is_set() and proxy.seen == []  # back while the lookup is still held
