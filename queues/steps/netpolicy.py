"""The one policy every outgoing HTTP(S) request goes through.

A depositor's URL can name anything: the console's own admin pages on loopback, a cloud
metadata address, an intranet host, a server that answers one byte every ten seconds or an
endless body. So every request made for a depositor (HEAD, GET, manifests, callbacks) is opened
here, under a :class:`FetchPolicy`:

- only ``http`` and ``https``;
- the host is resolved once, every address it resolves to is checked, and the connection goes
  to the checked address (the name is kept for the ``Host`` header and for TLS), so a DNS
  answer that changes between check and connect cannot send the request elsewhere;
- loopback, private, link-local, multicast, reserved and unspecified addresses, and every block
  IANA's special-purpose registries call not globally reachable (``special_addresses``), are
  refused unless ``allow`` names them (the tests and the one-machine demo allow loopback); an IPv6
  address that embeds an IPv4 one (IPv4-mapped, IPv4-compatible, NAT64, 6to4, Teredo) is
  judged by the IPv4 address it embeds as well, so ``2002:7f00:1::`` is loopback too;
- redirects are followed here, one hop at a time (at most ``max_redirects``), each hop checked
  like the first; a redirect that would carry the request's body (307, 308) is followed only to
  the same origin (scheme, host and port): a body is never handed to another host, whoever
  redirects it there. ``cross_origin_redirects=False`` (Merritt's ingest) follows no redirect to
  another origin at all;
- the whole response runs under a wall-clock ``deadline``: connecting and the TLS handshake
  (which Python's ssl module holds to the connect timeout as a whole), the response headers
  and the body. A watchdog shuts the socket down when it passes, because a server that sends
  one header byte every few seconds never trips the per-read ``timeout``;
- the response headers must arrive within one ``rate_window`` when a ``min_rate`` is set (a few
  hundred bytes that take a whole window are below any sensible rate), and the body must keep
  ``min_rate`` bytes per second over every ``rate_window`` seconds.
- an exchange repeated attempt by attempt (a depositor's download, a callback) opens every
  attempt with its first one's ``started``, so the ``deadline`` bounds them all, and waits its
  back-off only when the wait ends before the deadline (``FetchPolicy.repeats``): a repeat begun
  past it would only be cut off, an outage then looking like a server too slow.

Requests the system makes for itself (to Merritt's storage or inventory service on its own
network, Merritt's ingest, the alert webhook) use :data:`SYSTEM` or another policy with
``restrict`` False, which checks nothing about addresses but bounds the exchange the same way.
Those alone go through the HTTP proxy the environment names (``HTTP_PROXY``/``HTTPS_PROXY``,
``NO_PROXY``, as urllib reads them): an ``http`` request in absolute form, an ``https`` one
through a ``CONNECT`` tunnel, under the same deadline. A depositor's request never does: it goes
to the address that was checked.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import heapq
import ipaddress
import itertools
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, Self
from urllib.parse import SplitResult, unquote, urljoin, urlsplit
from urllib.request import getproxies, proxy_bypass

import certifi
import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    LocationParseError,
    MaxRetryError,
    NameResolutionError,
    NewConnectionError,
    ProtocolError,
    ResponseError,
    TimeoutError,
)
from urllib3.util import Url
from urllib3.util.connection import allowed_gai_family
from urllib3.util.retry import Retry

from queues.core.outside_text import url_shown
from queues.steps.special_addresses import not_globally_reachable

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

USER_AGENT = "merritt-queue-console"
# Servers that gzip on the fly would otherwise hand us bytes whose digest is not the file's.
BASE_HEADERS = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
REDIRECTS = frozenset({301, 302, 303, 307, 308})
DEFAULT_PORTS = {"http": 80, "https": 443}


class RequestBody(Protocol):
    """A request body sent in pieces (an upload too large to hold in memory): its length in
    bytes, and its bytes from the start, afresh on every call (a redirect to the same origin
    sends it again)."""

    @property
    def length(self) -> int: ...

    def chunks(self) -> Iterator[bytes]: ...


def _ascii_host(url: str, host: str) -> str:
    """The host as it goes on the wire (an international name in its IDNA form); FetchRefused
    for one with a control character or a space ("127.0.0.1\\x00.example" resolved to the text
    before the NUL and sent the NUL in the Host header) or one that is no name."""
    if any(not c.isprintable() or c.isspace() for c in host):
        raise FetchRefused(url, "the URL's host contains a control character or a space")
    if host.isascii():
        return host
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        raise FetchRefused(url, f"the URL's host {host!r} is no host name") from None


def origin(url: str) -> tuple[str, str, int | None]:
    """The scheme, host (lower case) and port of ``url``, the port the scheme's default when
    none is given: two URLs of one origin reach the same server."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port


class FetchRefused(Exception):
    """The policy will not make this request; ``reason`` is a sentence for a depositor."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"{url_shown(url)}: {reason}")


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
    """Why a depositor may not make us connect to ``ip`` as such, or None."""
    for test, words in (
        (ip.is_loopback, "a loopback address"),
        (ip.is_unspecified, "an unspecified address"),
        (ip.is_link_local, "a link-local address"),
        (ip.is_multicast, "a multicast address"),
        (ip.is_private, "a private address"),
        (ip.is_reserved, "a reserved address"),
    ):
        if test:
            return words
    # IANA's special-purpose registries, which Python's is_global lags behind (3fff::/20,
    # fec0::/10 and 192.88.99.0/24 pass it): queues/steps/special_addresses.py.
    block = not_globally_reachable(ip)
    if block is not None:
        return f"in {block.network} ({block.name}, {block.rfc}), not globally reachable"
    if not ip.is_global:
        return "not a public address"
    return None


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


@dataclass(frozen=True)
class Embedded:
    """An IPv4 address carried inside an IPv6 one."""

    form: str  # "an IPv4-mapped address", "a 6to4 address", ...
    ipv4: ipaddress.IPv4Address
    # True when the IPv6 prefix only says "reach this IPv4 address" (mapped, NAT64): the IPv4
    # address is then all there is to judge. False when the IPv6 address is routed as such
    # and a gateway on the way may hand it to the embedded address (6to4, Teredo, compatible).
    translated: bool


def embedded_ipv4(ip: IPAddress) -> list[Embedded]:
    """The IPv4 addresses ``ip`` embeds (RFC 4291, 6052, 3056, 4380); none for an IPv4 one."""
    if isinstance(ip, ipaddress.IPv4Address):
        return []
    found: list[Embedded] = []
    if ip.ipv4_mapped is not None:
        found.append(Embedded("an IPv4-mapped address", ip.ipv4_mapped, True))
    if ip in _NAT64:
        found.append(Embedded("a NAT64 address", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF), True))
    if ip.sixtofour is not None:
        found.append(Embedded("a 6to4 address", ip.sixtofour, False))
    if ip.teredo is not None:
        server, client = ip.teredo  # the client's address is stored inverted; this is undone
        found.append(Embedded("a Teredo address", client, False))
        found.append(Embedded("a Teredo address", server, False))
    # :: and ::1 are themselves, not the compatible forms of 0.0.0.0 and 0.0.0.1.
    if ip in _IPV4_COMPATIBLE and int(ip) > 1:
        found.append(Embedded("an IPv4-compatible address", ipaddress.IPv4Address(int(ip)), False))
    return found


def connect_key(ip: IPAddress) -> str:
    """One spelling per destination: an IPv4-mapped address and its IPv4 address are the same."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def _look_up(host: str, port: int, within: float | None) -> list[Any]:
    """``getaddrinfo`` of ``host``, given up on after ``within`` seconds (TransferFailed): the
    system resolver's own timeouts, several seconds a server and try, would otherwise come on
    top of a request's deadline, since no socket exists yet for the watchdog to shut down. A
    lookup given up on ends in its own thread with those timeouts. An address is not looked up,
    and a lookup bounded by nothing (``within`` None: a connection with neither a timeout nor an
    exchange's deadline) runs in the caller's thread.
    """
    try:
        ipaddress.ip_address(host)
    except ValueError:
        is_address = False
    else:
        is_address = True
    if is_address or within is None:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    answer: list[Any] = []
    done = threading.Event()

    def look() -> None:
        try:
            answer.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except BaseException as exc:  # handed to the caller, whatever it is
            answer.append(exc)
        done.set()

    threading.Thread(target=look, name="name-lookup", daemon=True).start()
    if not done.wait(within):
        raise TransferFailed(f"looking up host {host!r} took longer than {within:g}s")
    if isinstance(answer[0], BaseException):
        raise answer[0]
    return list(answer[0])


class _Alarm:
    """The time one request may run until, and the socket to shut down when it passes.

    The watchdog keeps a duplicate of the connection's socket: shutting that down ends the
    connection whoever is blocked reading it (plain or TLS), and the duplicate's descriptor
    is ours, so it can never be a number the process has since reused for something else.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._generation = 0  # a new arm or a disarm makes what the watchdog holds stale
        self._armed = False
        self._due = 0.0
        self.fired = False
        self.reason = ""

    def arm(self, due: float, reason: str) -> None:
        with self._lock:
            if self.fired:
                return  # the connection is down already, for the reason it went down
            self._generation += 1
            self._armed = True
            self._due = due
            self.reason = reason
            generation = self._generation
        _WATCHDOG.schedule(due, generation, self)

    def left(self) -> float | None:
        """Seconds until the alarm is due (0 once it fired); None when it is not armed."""
        with self._lock:
            if self.fired:
                return 0.0
            return max(0.0, self._due - time.monotonic()) if self._armed else None

    def disarm(self) -> None:
        with self._lock:
            self._generation += 1
            self._armed = False

    def watch(self, sock: socket.socket) -> None:
        """The connection's socket, plain or TLS: just connected, or taken again from a pool.
        Shut down at once if the time is up."""
        with self._lock:
            if not self._armed:
                return
            if self._sock is not None:  # a connection of an earlier try of this request
                self._sock.close()
            # Its descriptor duplicated: a TLS socket refuses dup() itself, and TLS inside a
            # proxy's TLS tunnel (urllib3's SSLTransport) is no socket, only the descriptor's
            # owner; the socket made of the duplicate reads its family from the descriptor.
            duplicate = os.dup(sock.fileno())
            try:
                self._sock = socket.socket(fileno=duplicate)
            except OSError:
                os.close(duplicate)
                raise
            if self.fired:
                self._shutdown()

    def is_current(self, generation: int) -> bool:
        # Read without the lock: a generation only grows, so a stale answer is never "current".
        return generation == self._generation

    def fire(self, generation: int) -> None:
        with self._lock:
            if generation != self._generation:
                return
            self.fired = True
            self._shutdown()

    def _shutdown(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            self._generation += 1
            self._armed = False
            if self._sock is not None:
                self._sock.close()
                self._sock = None


class _Watchdog:
    """One thread for the process that fires alarms when their time comes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, int, _Alarm]] = []
        self._order = itertools.count()
        self._live = 0
        self._thread: threading.Thread | None = None

    def schedule(self, due: float, generation: int, alarm: _Alarm) -> None:
        with self._cond:
            # Entries of requests long finished would otherwise wait out their deadline here
            # (hours): drop them whenever they outnumber the live ones.
            if len(self._due) > max(256, 2 * self._live):
                self._due = [entry for entry in self._due if entry[3].is_current(entry[2])]
                heapq.heapify(self._due)
                self._live = len(self._due)
            heapq.heappush(self._due, (due, next(self._order), generation, alarm))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="fetch-deadlines", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due or self._due[0][0] > time.monotonic():
                    wait = self._due[0][0] - time.monotonic() if self._due else None
                    self._cond.wait(wait)
                _due, _order, generation, alarm = heapq.heappop(self._due)
            # Outside the condition: a socket shutdown must not hold up scheduling.
            alarm.fire(generation)


_WATCHDOG = _Watchdog()


class _WatchedHTTP(HTTPConnection):
    def __init__(self, *args: Any, alarm: _Alarm, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.alarm = alarm

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        self.alarm.watch(sock)
        return sock


class _WatchedHTTPS(HTTPSConnection):
    def __init__(self, *args: Any, alarm: _Alarm, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.alarm = alarm

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        self.alarm.watch(sock)
        return sock


class _Pool(urllib3.HTTPConnectionPool):
    ConnectionCls = _WatchedHTTP


# One deadline for a whole exchange made through another client library's pools (requests'
# sessions for Merritt's services: ``merritt_wire.service_session``): the thread's alarm while
# ``exchange_deadline`` runs, watching every connection the exchange opens or takes again
# from the pool.
_exchange = threading.local()


@contextlib.contextmanager
def exchange_deadline(seconds: float) -> Iterator[_Alarm]:
    """Shut down the connection of any request this thread makes in the block (through
    ``EXCHANGE_POOLS``) once ``seconds`` have passed since the block began; a block inside
    another (a redirect followed) keeps the outer one's deadline."""
    current: _Alarm | None = getattr(_exchange, "alarm", None)
    if current is not None:
        yield current
        return
    alarm = _Alarm()
    alarm.arm(time.monotonic() + seconds, f"took longer than the limit of {seconds:g}s")
    _exchange.alarm = alarm
    try:
        yield alarm
    finally:
        _exchange.alarm = None
        alarm.close()


def watch_exchange(sock: socket.socket | None) -> None:
    """Hand ``sock`` to the alarm of the thread's ``exchange_deadline`` (if one runs): another
    client library's connection (an SMTP one) shut down at the same deadline."""
    alarm: _Alarm | None = getattr(_exchange, "alarm", None)
    if alarm is not None and sock is not None:
        alarm.watch(sock)


def exchange_left() -> float | None:
    """Seconds the thread's ``exchange_deadline`` has left (0 once it is spent); None outside
    one."""
    alarm: _Alarm | None = getattr(_exchange, "alarm", None)
    return None if alarm is None else alarm.left()


def past_deadline(wait: float, left: float | None) -> str | None:
    """Why a repeat is not made whose back-off is ``wait`` seconds while its exchange's deadline
    has ``left`` (None: no deadline): the wait would end at or past the deadline, or none of it
    is left. None when it may be made. A repeat begun past the deadline is cut off at once (or
    called too slow), so it could only turn an outage into something else."""
    if left is None or wait < left:
        return None
    if left <= 0:
        return "the exchange's deadline has no time left"
    return f"the next repeat would wait {wait:g}s, past the exchange's deadline ({left:.3g}s left)"


@dataclass
class Repeats:
    """The repeats of one exchange made attempt by attempt (a depositor's download, a callback):
    at most ``retries``, waiting ``backoff`` doubling before each, every wait inside the
    exchange's deadline ``due`` (a ``time.monotonic()``; None: none)."""

    retries: int
    backoff: float
    due: float | None = None
    made: int = 0  # repeats made so far

    @property
    def attempts(self) -> str:
        """The attempts made so far, in words."""
        count = self.made + 1
        return f"{count} attempt" + ("" if count == 1 else "s")

    @property
    def spent(self) -> bool:
        """No repeat is left."""
        return self.made >= self.retries

    def left(self) -> float | None:
        """Seconds until the deadline (0 once it has passed); None without one."""
        return None if self.due is None else max(0.0, self.due - time.monotonic())

    def wait(self) -> str | None:
        """Wait for the next repeat (one is left: ``spent`` is False) and None; or, when its wait
        would end at or past the deadline, why it is not made (``past_deadline``), having
        waited nothing."""
        wait = self.backoff * 2**self.made
        why = past_deadline(wait, self.left())
        if why is None:
            time.sleep(wait)
            self.made += 1
        return why


class RepeatsPastDeadline(MaxRetryError):
    """A repeat not made: its back-off would end past the exchange's deadline, or none of it is
    left. Raised where urllib3 raises for repeats spent, so it ends the exchange the same way:
    a status repeated comes back as the last answer, an error as requests' ConnectionError."""

    def __init__(self, pool: Any, url: str | None, reason: Exception, why: str) -> None:
        self.reason = reason
        # MaxRetryError's own words are "Max retries exceeded", which these are not.
        message = f"gave up repeating {url}: {why} (caused by {reason!r})"
        super(MaxRetryError, self).__init__(pool, url, message)


class RetryWithin(Retry):
    """urllib3's repeats held to the thread's exchange deadline (``exchange_deadline``).

    urllib3 sleeps its back-off between repeats whatever time the exchange has left, and the
    alarm can shut down a connection but not end a sleep: 1 s and 2 s of ``service_session``'s
    back-off slept past a deadline of 1 s. A repeat whose back-off would end at or past the
    deadline, or any once the deadline is spent, is not made (``RepeatsPastDeadline``); a
    back-off is never slept past what is left, nor a ``Retry-After`` inside an exchange (the
    job's wait, ``queues.core.retries``). Outside an exchange the repeats are urllib3's own."""

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: Any = None,
        error: Exception | None = None,
        _pool: Any = None,
        _stacktrace: TracebackType | None = None,
    ) -> Self:
        repeat = super().increment(method, url, response, error, _pool, _stacktrace)
        why = past_deadline(repeat.get_backoff_time(), exchange_left())
        if why is None:
            return repeat
        status = getattr(response, "status", None)
        reason = error or ResponseError(
            ResponseError.SPECIFIC_ERROR.format(status_code=status)
            if status
            else ResponseError.GENERIC_ERROR
        )
        raise RepeatsPastDeadline(_pool, url, reason, why) from reason

    def sleep(self, response: Any = None) -> None:
        left = exchange_left()
        if left is None:
            super().sleep(response)
        else:
            time.sleep(min(self.get_backoff_time(), left))


def time_left(timeout: Any) -> float | None:
    """Seconds a step of a connection (a name's lookup, one address's connect) may take: its
    ``timeout``, or what the thread's ``exchange_deadline`` has left when that is sooner (never
    0, which would make a socket non-blocking); None when neither bounds it."""
    left = exchange_left()
    bounds = [t for t in (timeout, left) if isinstance(t, int | float)]
    return max(0.01, min(bounds)) if bounds else None


def connect_in_time(
    host: str,
    port: int,
    timeout: Any,
    *,
    options: Any = (),
    source: Any = None,
    family: int = socket.AF_UNSPEC,
) -> socket.socket:
    """``socket.create_connection`` for a client library's connection (the services' sessions,
    mail), with ``host`` looked up by ``_look_up`` in ``time_left(timeout)``: inside the
    library's own connect the system resolver's timeouts came on top of the exchange's deadline,
    since no socket exists yet for the watchdog to shut down. The addresses (of ``family``, when
    given) are tried in turn, each connect bounded the same way. A lookup given up on is a
    ``socket.gaierror`` ``EAI_AGAIN`` (a temporary failure), as the resolver's own would be."""
    try:
        infos = _look_up(host, port, time_left(timeout))
    except TransferFailed as exc:
        raise socket.gaierror(socket.EAI_AGAIN, str(exc)) from exc
    error: OSError = OSError(f"no address of {host!r} to connect to")
    for info in infos:
        if family != socket.AF_UNSPEC and info[0] != family:
            continue  # an IPv6 address on a machine without IPv6, which urllib3 leaves out
        sock = socket.socket(info[0], info[1], info[2])
        try:
            for option in options or ():
                sock.setsockopt(*option)
            bound = time_left(timeout)
            if bound is not None:
                sock.settimeout(bound)
            if source:
                sock.bind(source)
            sock.connect(info[4])
        except OSError as exc:
            sock.close()
            error = exc
            continue
        return sock
    raise error


def _connect_in_time(conn: HTTPConnection) -> socket.socket:
    """urllib3's ``HTTPConnection._new_conn`` made by ``connect_in_time``. Only the socket is
    made here: urllib3 then sets TLS up on it for the connection's host name (sent as SNI, and
    the name the certificate is checked against), as before.

    The errors are urllib3's own, so requests raises its ConnectionError, which the services'
    clients take for an outage and urllib3's retries for a connect error: a lookup that fails,
    or is given up on, a ``NameResolutionError``; a connect that times out a
    ``ConnectTimeoutError``; one refused a ``NewConnectionError``."""
    dns_host = getattr(conn, "_dns_host", conn.host)  # the name as given (a trailing dot kept)
    host = dns_host[1:-1] if dns_host.startswith("[") else dns_host
    try:
        host.encode("idna")
        sock = connect_in_time(
            host,
            conn.port,
            conn.timeout,
            options=conn.socket_options,
            source=conn.source_address,
            family=allowed_gai_family(),
        )
    except UnicodeError:
        raise LocationParseError(f"'{host}', label empty or too long") from None
    except socket.gaierror as exc:
        raise NameResolutionError(conn.host, conn, exc) from exc
    except builtins.TimeoutError as exc:  # the builtin TimeoutError (urllib3's is imported here)
        raise ConnectTimeoutError(
            conn, f"Connection to {conn.host} timed out. (connect timeout={conn.timeout})"
        ) from exc
    except OSError as exc:
        raise NewConnectionError(conn, f"Failed to establish a new connection: {exc}") from exc
    sys.audit("http.client.connect", conn, conn.host, conn.port)
    return sock


class _ExchangeWatched:
    """A urllib3 connection (plain or TLS) whose socket the thread's exchange alarm watches,
    when it connects and whenever the pool hands it out again; its host name is looked up in
    the time the exchange has left (``_connect_in_time``)."""

    sock: Any

    def _new_conn(self) -> socket.socket:
        sock = _connect_in_time(self)  # type: ignore[arg-type]
        watch_exchange(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        # Connected already: a connection taken again from the pool, or a TLS one (urllib3
        # connects it before the request; the plain socket it was made from is detached then).
        if self.sock is not None:
            watch_exchange(self.sock)
        super().request(*args, **kwargs)  # type: ignore[misc]


class _ExchangeHTTP(_ExchangeWatched, HTTPConnection):
    pass


class _ExchangeHTTPS(_ExchangeWatched, HTTPSConnection):
    pass


class _ExchangePool(urllib3.HTTPConnectionPool):
    ConnectionCls = _ExchangeHTTP


class _ExchangeTLSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _ExchangeHTTPS


EXCHANGE_POOLS: dict[str, type[urllib3.HTTPConnectionPool]] = {
    "http": _ExchangePool,
    "https": _ExchangeTLSPool,
}


class _TLSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPS


@dataclass(frozen=True)
class EnvironmentProxy:
    """The HTTP proxy the environment names for a URL: its host and port, and the
    ``Proxy-Authorization`` its URL's user and password make (empty without them)."""

    host: str
    port: int
    authorization: str = ""

    @property
    def shown(self) -> str:
        """The proxy as messages name it (never its credentials)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def environment_proxy(url: str, scheme: str, host: str, port: int) -> EnvironmentProxy | None:
    """The proxy ``HTTP_PROXY`` or ``HTTPS_PROXY`` (lower case first) names for ``url``, None
    without one or when ``NO_PROXY`` names its host (urllib's ``getproxies`` and
    ``proxy_bypass``, which on Linux read the environment). A proxy spoken to over plain HTTP
    only: FetchRefused for another kind (``https://``, ``socks5://``) or a proxy URL that
    cannot be read."""
    proxies = getproxies()
    value = proxies.get(scheme, "").strip()
    if not value:
        return None
    netloc = f"[{host}]" if ":" in host else host
    if proxy_bypass(f"{netloc}:{port}"):
        return None
    variable = f"{scheme.upper()}_PROXY"
    if "://" not in value:
        value = "http://" + value  # "proxy:3128", as urllib reads it
    try:
        parts = urlsplit(value)
        proxy_port = parts.port or DEFAULT_PORTS["http"]
    except ValueError:
        raise FetchRefused(url, f"the proxy {variable} names cannot be read") from None
    if parts.scheme.lower() != "http" or not parts.hostname:
        raise FetchRefused(
            url, f"{variable} must name an http:// proxy (host and port), not {parts.scheme}://"
        )
    proxy_host = _ascii_host(url, parts.hostname)
    return EnvironmentProxy(proxy_host, proxy_port, basic_authorization(parts) or "")


def basic_authorization(parts: SplitResult) -> str | None:
    """The ``Basic`` credentials a URL's user-info makes (UTF-8, as RFC 7617 allows: urllib3's
    own encoding is Latin-1, and raises past it); None when it names no user."""
    if parts.username is None:
        return None
    credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return "Basic " + base64.b64encode(credentials.encode()).decode()


@dataclass(frozen=True)
class FetchPolicy:
    """What an outgoing request may reach and how long its body may take."""

    # False for the system's own requests: any address, as configured by the operator.
    restrict: bool = True
    allow: tuple[IPNetwork, ...] = ()
    max_redirects: int = 5
    # False: a redirect to another origin is refused even without a body (a service of the
    # operator's own, whose answer must come from itself).
    cross_origin_redirects: bool = True
    timeout: float = 30.0  # connect, and each read
    deadline: float | None = None  # seconds for one whole transfer, all attempts included
    min_rate: int = 0  # bytes per second, checked over each rate_window
    rate_window: float = 60.0
    # The certificate authorities TLS trusts: a bundle file. Empty: for the system's own
    # requests (``restrict`` False: Merritt's ingest, the alert webhook, storage's files) the
    # operator's bundle, REQUESTS_CA_BUNDLE, as the services' sessions read it through requests,
    # else certifi's; a depositor's server is held to certifi's (``trusted``).
    ca_certs: str = ""
    headers: Mapping[str, str] = field(default_factory=lambda: dict(BASE_HEADERS))

    def trusted(self) -> str:
        """The bundle file of the authorities TLS trusts under this policy (``ca_certs``)."""
        if self.ca_certs:
            return self.ca_certs
        operators = "" if self.restrict else os.environ.get("REQUESTS_CA_BUNDLE", "")
        return operators or certifi.where()

    # Addresses ----------------------------------------------------------------------------

    def _allowed(self, ip: IPAddress) -> bool:
        return any(ip in net for net in self.allow)

    def check_address(self, ip: IPAddress) -> str | None:
        """Why ``ip`` may not be fetched from under this policy, or None when it may."""
        if not self.restrict or self._allowed(ip):
            return None
        embedded = embedded_ipv4(ip)
        for inner in embedded:
            why = None if self._allowed(inner.ipv4) else _forbidden(inner.ipv4)
            if why:
                return f"{inner.form} embedding {inner.ipv4}, {why}"
        if embedded and all(inner.translated for inner in embedded):
            return None
        return _forbidden(ip)

    @staticmethod
    def target(url: str) -> tuple[str, str, int]:
        """The scheme, host (as it goes on the wire) and port of ``url``, nothing looked up;
        FetchRefused for a URL the policy never fetches."""
        try:
            parts = urlsplit(url)
        except ValueError:  # "http://[::1/x": an IPv6 address not closed
            raise FetchRefused(url, "the URL's host cannot be read") from None
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS:
            raise FetchRefused(url, f"only http and https URLs are fetched, not {scheme or 'this'}")
        try:
            port = parts.port or DEFAULT_PORTS[scheme]
        except ValueError:
            raise FetchRefused(url, "the URL has an invalid port") from None
        if not parts.hostname:
            raise FetchRefused(url, "the URL names no host")
        return scheme, _ascii_host(url, parts.hostname), port

    def proxy_for(self, url: str) -> EnvironmentProxy | None:
        """The environment's HTTP proxy for ``url`` under this policy: only the system's own
        requests (``restrict`` False) take one; a depositor's goes to the address it checked."""
        if self.restrict:
            return None
        scheme, host, port = self.target(url)
        return environment_proxy(url, scheme, host, port)

    def resolve(self, url: str, within: float | None = None) -> tuple[str, int, IPAddress]:
        """The host, port and checked address ``url`` is fetched from; FetchRefused otherwise.
        The name is looked up in ``within`` seconds at most (by default the policy's timeout):
        TransferFailed past it."""
        _scheme, host, port = self.target(url)
        try:
            infos = _look_up(host, port, self.timeout if within is None else within)
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
        body: bytes | RequestBody | None = None,
        content_type: str = "",
        headers: Mapping[str, str] | None = None,
        follow: bool = True,
    ) -> OpenResponse:
        """Send ``method`` to ``url`` following redirects under the policy (``follow`` False: a
        redirect is the answer); the body unread.

        A ``body`` (a callback's JSON, an upload) goes along with 307 and 308 redirects, which
        are followed only to the same origin: one to another host is refused (FetchRefused)
        before anything is sent there. A 303 (the receiver took the body; see the answer
        elsewhere) turns the request into a GET without it. A 301 or 302 of a request with a
        body is its answer, not followed: as a GET the body would reach no one, and a callback
        was counted delivered on the GET's 200. ``headers`` go with every hop.
        """
        started = time.monotonic() if started is None else started
        for _hop in range(self.max_redirects + 1):
            pool, response, alarm = self._send(url, method, started, body, content_type, headers)
            location = response.headers.get("Location")
            moved = body is not None and response.status in (301, 302)
            if response.status not in REDIRECTS or not location or moved or not follow:
                return OpenResponse(self, url, response, started, pool, alarm)
            status = response.status
            alarm.close()
            response.release_conn()
            pool.close()
            try:
                target = urljoin(url, location)
            except ValueError:
                raise FetchRefused(
                    location, f"{url_shown(url)} redirected to a URL whose host cannot be read"
                ) from None
            keeps_body = body is not None and status in (307, 308)
            if origin(target) != origin(url) and (keeps_body or not self.cross_origin_redirects):
                what = "the request and its body" if keeps_body else "the request"
                raise FetchRefused(
                    target,
                    f"{url_shown(url)} redirected {what} to another host (HTTP {status}); not "
                    "followed, nothing was sent there",
                )
            url = target
            if status in (301, 302, 303) and method not in ("GET", "HEAD"):
                method, body = "GET", None  # a body-less POST's 301 or 302, or a 303
        raise FetchRefused(url, f"more than {self.max_redirects} redirects")

    def _send(
        self,
        url: str,
        method: str,
        started: float,
        body: bytes | RequestBody | None,
        content_type: str,
        extra: Mapping[str, str] | None = None,
    ) -> tuple[urllib3.HTTPConnectionPool, urllib3.BaseHTTPResponse, _Alarm]:
        read_timeout = self._read_timeout(started)
        proxy = self.proxy_for(url)
        if proxy is None:
            host, port, ip = self.resolve(url, within=read_timeout)
        else:
            # The proxy looks the URL's host up; here only the proxy's own name is.
            _scheme, host, port = self.target(url)
            ip = self._resolve_proxy(proxy, within=read_timeout)
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        read_timeout = self._read_timeout(started)
        connect_timeout = min(self.timeout, read_timeout)
        timeout = urllib3.Timeout(connect=connect_timeout, read=read_timeout)
        alarm = _Alarm()
        netloc_host = f"[{host}]" if ":" in host else host
        host_header = netloc_host if port == DEFAULT_PORTS[scheme] else f"{netloc_host}:{port}"
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        proxy_headers = {}
        if proxy is not None and proxy.authorization:
            proxy_headers["Proxy-Authorization"] = proxy.authorization
        pool: urllib3.HTTPConnectionPool
        if scheme == "https":
            tunnel: dict[str, Any] = {}
            if proxy is not None:
                # A CONNECT tunnel to host:port through the proxy (at ``ip``), TLS inside it
                # with the URL's host; the one socket, to the proxy, is the alarm's.
                tunnel = {"_proxy": Url(scheme="http", host=str(ip), port=proxy.port)}
                tunnel["_proxy_headers"] = proxy_headers
            pool = _TLSPool(
                host if proxy is not None else str(ip),
                port,
                timeout=timeout,
                retries=False,
                maxsize=1,
                server_hostname=host,
                assert_hostname=host,
                cert_reqs="CERT_REQUIRED",
                ca_certs=self.trusted(),
                alarm=alarm,
                **tunnel,
            )
        else:
            # To the proxy, the request in absolute form (forwarded), or to the checked address.
            to_port = port if proxy is None else proxy.port
            pool = _Pool(str(ip), to_port, timeout=timeout, retries=False, maxsize=1, alarm=alarm)
            if proxy is not None:
                target = f"http://{host_header}{target}"
        headers = {**self.headers, **(extra or {})}
        headers["Host"] = host_header
        if proxy is not None and scheme == "http":
            headers.update(proxy_headers)
        authorization = basic_authorization(parts)
        if authorization:
            headers["Authorization"] = authorization
        if content_type:
            headers["Content-Type"] = content_type
        data: bytes | Iterator[bytes] | None
        if body is None or isinstance(body, bytes):
            data = body
        else:
            # Sent as it is read, with its length: no chunked encoding, nothing held in memory.
            headers["Content-Length"] = str(body.length)
            data = body.chunks()
        if proxy is not None:
            shown = proxy.shown if proxy.host == str(ip) else f"{proxy.shown} ({ip})"
            where = f"the proxy {shown} for {netloc_host}:{port}"
        elif host == str(ip):
            where = f"{netloc_host}:{port}"
        else:
            where = f"{netloc_host}:{port} ({ip})"
        self._arm_for_headers(alarm, started)
        try:
            response = pool.urlopen(
                method,
                target,
                body=data,
                headers=headers,
                redirect=False,
                retries=False,
                preload_content=False,
                # The bytes as sent: "identity" was asked for, and a body a server encodes
                # anyway is kept as it came (its digest says whether it is the file), never
                # inflated (1.8 KB of gzip wrote 1 GiB).
                decode_content=False,
                assert_same_host=False,
            )
        except BaseException as exc:
            alarm.close()
            pool.close()
            if alarm.fired:
                raise TooSlow(alarm.reason) from None
            if isinstance(exc, NewConnectionError):
                # urllib3 files this under timeouts; the reason is the OSError beneath it.
                cause = exc.__cause__
                if isinstance(cause, ConnectionRefusedError):
                    raise TransferFailed(f"connection refused by {where}") from None
                raise TransferFailed(
                    f"cannot connect to {where} ({short_error(cause or exc)})"
                ) from None
            if isinstance(exc, ConnectTimeoutError):
                raise TransferFailed(
                    f"connecting to {where} timed out after {connect_timeout:g}s"
                ) from None
            if isinstance(exc, TimeoutError):
                raise TransferFailed(
                    f"no answer from {where}, timed out after {read_timeout:g}s"
                ) from None
            if isinstance(exc, HTTPError):
                raise TransferFailed(f"connection to {where} failed ({short_error(exc)})") from None
            raise
        if alarm.fired:
            # http.client takes the end of the connection for the end of the headers, so a
            # response cut off in its headers comes back as if it were whole.
            response.release_conn()
            alarm.close()
            pool.close()
            raise TooSlow(alarm.reason)
        if self.deadline is None:
            alarm.disarm()
        else:
            alarm.arm(started + self.deadline, self._deadline_words())
        return pool, response, alarm

    @staticmethod
    def _resolve_proxy(proxy: EnvironmentProxy, within: float) -> IPAddress:
        """The address of the environment's proxy, looked up in ``within`` seconds at most
        (TransferFailed past it, or when it has none): the operator's own, not checked."""
        try:
            infos = _look_up(proxy.host, proxy.port, within)
        except (socket.gaierror, UnicodeError) as exc:
            raise TransferFailed(f"cannot resolve the proxy {proxy.host!r} ({exc})") from None
        if not infos:
            raise TransferFailed(f"the proxy {proxy.host!r} has no address")
        return ipaddress.ip_address(infos[0][4][0])

    def repeats(self, retries: int, backoff: float, started: float) -> Repeats:
        """The repeats of an exchange begun at ``started`` (its attempts opened with that
        ``started``), waiting inside this policy's deadline."""
        return Repeats(retries, backoff, None if self.deadline is None else started + self.deadline)

    def _deadline_words(self) -> str:
        return f"took longer than the limit of {self.deadline:g}s"

    def _arm_for_headers(self, alarm: _Alarm, started: float) -> None:
        """Until the response headers are in: the deadline, and one rate window at most."""
        limits: list[tuple[float, str]] = []
        if self.deadline is not None:
            limits.append((started + self.deadline, self._deadline_words()))
        if self.min_rate:
            limits.append(
                (
                    time.monotonic() + self.rate_window,
                    f"sent no complete response headers within {self.rate_window:g}s, "
                    f"below the minimum of {self.min_rate} bytes/s",
                )
            )
        if limits:
            alarm.arm(*min(limits))

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
    alarm: _Alarm  # the deadline, shutting the connection down when it passes

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
            except (ProtocolError, HTTPError, OSError) as exc:
                if self.alarm.fired:
                    raise TooSlow(self.alarm.reason) from None
                if isinstance(exc, TimeoutError):
                    raise TransferFailed(f"timed out after {policy.timeout:g}s") from None
                raise TransferFailed(f"connection broke off ({short_error(exc)})") from None
            if not chunk:
                # A body that ends with the connection ends early when the watchdog cut it.
                if self.alarm.fired:
                    raise TooSlow(self.alarm.reason)
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
        self.alarm.close()
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


# The system's own requests: any address, and the downloads' default bounds on the whole
# exchange (MRT_DOWNLOAD_DEADLINE, MRT_DOWNLOAD_MIN_RATE, MRT_DOWNLOAD_RATE_WINDOW; the daemons
# take the settings: ``queues.services.depositors.system_policy``). Without them a server that
# drips its answer a byte at a time, within every read's timeout, held the request for ever.
SYSTEM = FetchPolicy(restrict=False, deadline=6 * 3600.0, min_rate=1024, rate_window=60.0)
