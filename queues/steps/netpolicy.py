"""The one policy every outgoing HTTP(S) request goes through.

A depositor's URL can name anything: the console's own admin pages on loopback, a cloud
metadata address, an intranet host, a server that answers one byte every ten seconds or an
endless body. So every request made for a depositor (HEAD, GET, manifests, callbacks) is opened
here, under a :class:`FetchPolicy`:

- only ``http`` and ``https``;
- the host is resolved once, every address it resolves to is checked, and the connection goes
  to the checked address (the name is kept for the ``Host`` header and for TLS), so a DNS
  answer that changes between check and connect cannot send the request elsewhere;
- loopback, private, link-local, multicast, reserved and unspecified addresses are refused
  unless ``allow`` names them (the tests and the one-machine demo allow loopback);
- redirects are followed here, one hop at a time (at most ``max_redirects``), each hop checked
  like the first;
- a body is read under a wall-clock ``deadline`` and a minimum throughput (``min_rate`` bytes
  per second over every ``rate_window`` seconds), besides the per-read ``timeout``.

Requests the system makes for itself (to Merritt's storage or inventory service on its own
network) use :data:`SYSTEM`, which checks nothing about addresses but reads bodies the same way.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urljoin, urlsplit

import certifi
import urllib3
from urllib3.exceptions import HTTPError, ProtocolError, TimeoutError

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

USER_AGENT = "merritt-queue-console"
# Servers that gzip on the fly would otherwise hand us bytes whose digest is not the file's.
BASE_HEADERS = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
REDIRECTS = frozenset({301, 302, 303, 307, 308})
DEFAULT_PORTS = {"http": 80, "https": 443}


class FetchRefused(Exception):
    """The policy will not make this request; ``reason`` is a sentence for a depositor."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"{url}: {reason}")


class TransferFailed(Exception):
    """Transport trouble: the connection failed, timed out or broke off. Another try may help."""


class TooSlow(Exception):
    """The body came slower than the policy allows; ``reason`` says which limit."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def parse_networks(text: str) -> tuple[IPNetwork, ...]:
    """``"127.0.0.0/8, ::1"`` -> networks; ValueError naming the entry that is not one."""
    networks = []
    for entry in text.replace(";", ",").split(","):
        entry = entry.strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not an IP address or network") from None
    return tuple(networks)


def _forbidden(ip: IPAddress) -> str | None:
    """Why a depositor may not make us connect to ``ip``, or None."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for test, words in (
        (ip.is_loopback, "a loopback address"),
        (ip.is_unspecified, "an unspecified address"),
        (ip.is_link_local, "a link-local address"),
        (ip.is_multicast, "a multicast address"),
        (ip.is_private, "a private address"),
        (ip.is_reserved, "a reserved address"),
        (not ip.is_global, "not a public address"),
    ):
        if test:
            return words
    return None


@dataclass(frozen=True)
class FetchPolicy:
    """What an outgoing request may reach and how long its body may take."""

    # False for the system's own requests: any address, as configured by the operator.
    restrict: bool = True
    allow: tuple[IPNetwork, ...] = ()
    max_redirects: int = 5
    timeout: float = 30.0  # connect, and each read
    deadline: float | None = None  # seconds for one whole transfer, all attempts included
    min_rate: int = 0  # bytes per second, checked over each rate_window
    rate_window: float = 60.0
    headers: Mapping[str, str] = field(default_factory=lambda: dict(BASE_HEADERS))

    # Addresses ----------------------------------------------------------------------------

    def check_address(self, ip: IPAddress) -> str | None:
        if not self.restrict or any(ip in net for net in self.allow):
            return None
        return _forbidden(ip)

    def resolve(self, url: str) -> tuple[str, int, IPAddress]:
        """The host, port and checked address ``url`` is fetched from; FetchRefused otherwise."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS:
            raise FetchRefused(url, f"only http and https URLs are fetched, not {scheme or 'this'}")
        try:
            port = parts.port or DEFAULT_PORTS[scheme]
        except ValueError:
            raise FetchRefused(url, "the URL has an invalid port") from None
        host = parts.hostname
        if not host:
            raise FetchRefused(url, "the URL names no host")
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise TransferFailed(f"cannot resolve host {host!r} ({exc})") from None
        addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))
        for ip in addresses:
            why = self.check_address(ip)
            if why:
                raise FetchRefused(
                    url, f"host {host} resolves to {ip}, {why}, which is not fetched for depositors"
                )
        if not addresses:
            raise TransferFailed(f"host {host!r} has no address")
        return host, port, addresses[0]

    def check_url(self, url: str) -> None:
        """FetchRefused when the policy would refuse ``url`` outright (scheme, address).

        A host that cannot be resolved now is not refused: the daemons will try again later.
        """
        with contextlib.suppress(TransferFailed):
            self.resolve(url)

    # Requests -----------------------------------------------------------------------------

    def open(
        self,
        url: str,
        *,
        method: str = "GET",
        started: float | None = None,
        body: bytes | None = None,
        content_type: str = "",
    ) -> OpenResponse:
        """Send ``method`` to ``url`` following redirects under the policy; the body unread.

        A ``body`` (a callback's JSON) goes along with 307 and 308 redirects; 301, 302 and 303
        turn the request into a GET without it, as browsers do.
        """
        started = time.monotonic() if started is None else started
        for _hop in range(self.max_redirects + 1):
            pool, response = self._send(url, method, started, body, content_type)
            location = response.headers.get("Location")
            if response.status not in REDIRECTS or not location:
                return OpenResponse(self, url, response, started, pool)
            response.release_conn()
            pool.close()
            url = urljoin(url, location)
            if response.status in (301, 302, 303) and method not in ("GET", "HEAD"):
                method, body = "GET", None
        raise FetchRefused(url, f"more than {self.max_redirects} redirects")

    def _send(
        self, url: str, method: str, started: float, body: bytes | None, content_type: str
    ) -> tuple[urllib3.HTTPConnectionPool, urllib3.BaseHTTPResponse]:
        host, port, ip = self.resolve(url)
        parts = urlsplit(url)
        read_timeout = self._read_timeout(started)
        timeout = urllib3.Timeout(connect=min(self.timeout, read_timeout), read=read_timeout)
        pool: urllib3.HTTPConnectionPool
        if parts.scheme.lower() == "https":
            pool = urllib3.HTTPSConnectionPool(
                str(ip),
                port,
                timeout=timeout,
                retries=False,
                maxsize=1,
                server_hostname=host,
                assert_hostname=host,
                cert_reqs="CERT_REQUIRED",
                ca_certs=certifi.where(),
            )
        else:
            pool = urllib3.HTTPConnectionPool(
                str(ip), port, timeout=timeout, retries=False, maxsize=1
            )
        netloc_host = f"[{host}]" if ":" in host else host
        headers = dict(self.headers)
        headers["Host"] = (
            netloc_host if port == DEFAULT_PORTS[parts.scheme.lower()] else f"{netloc_host}:{port}"
        )
        if parts.username is not None:
            credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            headers["Authorization"] = urllib3.make_headers(basic_auth=credentials)["authorization"]
        if content_type:
            headers["Content-Type"] = content_type
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        try:
            return pool, pool.urlopen(
                method,
                target,
                body=body,
                headers=headers,
                redirect=False,
                retries=False,
                preload_content=False,
                assert_same_host=False,
            )
        except TimeoutError:
            pool.close()
            raise TransferFailed(f"timed out after {read_timeout:g}s") from None
        except HTTPError as exc:
            pool.close()
            raise TransferFailed(f"connection failed ({short_error(exc)})") from None

    def _read_timeout(self, started: float) -> float:
        if self.deadline is None:
            return self.timeout
        left = self.deadline - (time.monotonic() - started)
        if left <= 0:
            raise TooSlow(f"took longer than the limit of {self.deadline:g}s")
        return max(0.1, min(self.timeout, left))


@dataclass
class OpenResponse:
    """A response whose body is read under the policy's deadline and minimum rate."""

    policy: FetchPolicy
    url: str  # after redirects
    raw: urllib3.BaseHTTPResponse
    started: float
    pool: urllib3.HTTPConnectionPool

    @property
    def status(self) -> int:
        return self.raw.status

    @property
    def reason(self) -> str:
        return self.raw.reason or ""

    def header(self, name: str) -> str:
        return self.raw.headers.get(name, "")

    def chunks(self, size: int) -> Iterator[bytes]:
        policy = self.policy
        window_start = time.monotonic()
        window_bytes = 0
        while True:
            try:
                # read1: whatever has arrived, so a trickle is seen as one, not waited out.
                chunk = self.raw.read1(size)
            except TimeoutError:
                raise TransferFailed(f"timed out after {policy.timeout:g}s") from None
            except (ProtocolError, HTTPError, OSError) as exc:
                raise TransferFailed(f"connection broke off ({short_error(exc)})") from None
            if not chunk:
                return
            yield chunk
            window_bytes += len(chunk)
            now = time.monotonic()
            if policy.deadline is not None and now - self.started > policy.deadline:
                raise TooSlow(f"took longer than the limit of {policy.deadline:g}s")
            if now - window_start >= policy.rate_window:
                rate = window_bytes / (now - window_start)
                if policy.min_rate and rate < policy.min_rate:
                    raise TooSlow(
                        f"sent {rate:.0f} bytes/s over {now - window_start:.0f}s, below the "
                        f"minimum of {policy.min_rate} bytes/s"
                    )
                window_start, window_bytes = now, 0

    def close(self) -> None:
        self.raw.release_conn()
        self.raw.close()
        self.pool.close()

    def __enter__(self) -> OpenResponse:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def short_error(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


SYSTEM = FetchPolicy(restrict=False)
