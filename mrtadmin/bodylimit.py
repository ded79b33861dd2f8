"""The largest request body, decided from the headers before a byte of the body is kept.

Under daphne the whole body of a request reaches the disk before the application is called:
Twisted writes every body of 100,000 bytes or more (or of unknown length) to a temporary file
as it arrives, and only then does daphne hand the request on; Django's ASGI handler then copies
it into a spooled file of its own. An anonymous 400 MB POST to any URL was written out whole
before any check could run. So the limit is applied twice, by the same rule:

* in daphne, by the request class this module puts in place of daphne's (``install_in_daphne``,
  called by ``mrtadmin.asgi`` when daphne serves it): the declared ``Content-Length`` is judged
  as soon as the headers are in, a chunked body is counted as it arrives, and a body over the
  limit is answered 413 at once and never written anywhere;
* in front of the ASGI application (``BodyLimit``), for any other ASGI server.

The rule: a request that proves no user may send ``MRT_MAX_ANONYMOUS_REQUEST_BYTES`` (login
forms and API JSON are small); a signed-in user (session, SSO header from a trusted proxy, API
token) ``MRT_MAX_REQUEST_BYTES``; ``/poster/`` takes up to ``MRT_POSTER_MAX_BYTES`` (and room for
the form fields) from a depositor who presents an API token whose user may submit batches (the
role that door asks for), and no session is enough there: any other token gets the anonymous
limit there, as the door refuses it anyway. Credentials are checked (in a thread: sessions and
tokens are database rows) only when the body may be larger than an anonymous one; meanwhile the
connection is not read. Paths are judged as Django routes them: under a URL prefix (daphne's
``--root-path``, its ``Daphne-Root-Path`` header, or ``FORCE_SCRIPT_NAME``) without the prefix.

Every request also has one deadline for the whole of it, request line, headers and body:
``MRT_REQUEST_SECONDS`` from its first line, or ``MRT_POSTER_UPLOAD_SECONDS`` for a
depositor's upload to ``/poster/``. A client still sending when it passes is answered 408 and
the connection closed; the application never sees the request. (Twisted's own idle timeout
resets at every byte, so one byte every few seconds used to keep a connection for ever.)

When daphne serves the console, ``install_in_daphne`` also keeps secrets out of its access log:
the values of the query parameters in ``SECRET_QUERY_NAMES`` (an access request's ``?token=``)
are written as ``REDACTED``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from http import HTTPStatus
from io import BytesIO
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import Error as DatabaseError
from django.db import close_old_connections
from django.http import HttpRequest

log = logging.getLogger("mrtadmin.bodylimit")

POSTER_PREFIX = "/poster/"
# Room for the fields around a poster upload (the door itself refuses more than this above
# MRT_POSTER_MAX_BYTES).
POSTER_FIELDS_BYTES = 1024**2
# After a 413 the connection stays open this long for reading (and dropping) what the client
# is still sending, so that a client that writes its whole body before reading gets the answer
# instead of a reset connection.
LINGER_SECONDS = 2.0
# What may wait in memory while a sender's credentials are checked: the connection is not read
# meanwhile, but what came in the same reads as the headers (Twisted reads 64 KiB at a time)
# is already there.
HELD_BYTES = 1024**2
# Query parameters whose values are credentials (downloads' ``?token=``): never logged.
SECRET_QUERY_NAMES = frozenset({"token", "access_token", "key", "api_key"})
REDACTED = "REDACTED"

# What a request's credentials allow it to send.
ANONYMOUS = "anonymous"
SIGNED_IN = "signed-in"
DEPOSITOR = "depositor"  # an API token whose user may submit, on /poster/

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]


def anonymous_limit() -> int:
    return int(settings.MRT_MAX_ANONYMOUS_REQUEST_BYTES)


def limit_for(allowance: str) -> int:
    if allowance == DEPOSITOR:
        return max(int(settings.MRT_POSTER_MAX_BYTES) + POSTER_FIELDS_BYTES, anonymous_limit())
    if allowance == SIGNED_IN:
        return max(int(settings.MRT_MAX_REQUEST_BYTES), anonymous_limit())
    return anonymous_limit()


def seconds_for(allowance: str) -> float:
    """The deadline for the whole request (line, headers, body) of a sender so allowed."""
    if allowance == DEPOSITOR:
        return max(float(settings.MRT_POSTER_UPLOAD_SECONDS), request_seconds())
    return request_seconds()


def request_seconds() -> float:
    return float(settings.MRT_REQUEST_SECONDS)


def routed_path(path: str, root_path: str) -> str:
    """``path`` as Django routes it: without the URL prefix the server was given
    (``FORCE_SCRIPT_NAME`` first, as Django's ASGI handler takes it)."""
    from django.core.handlers.asgi import get_script_prefix

    prefix = get_script_prefix({"root_path": root_path})
    return path.removeprefix(prefix) if prefix else path


def redact_query(target: str) -> str:
    """A request target (path and query) with the values of secret query parameters replaced,
    for logs; the rest as it was sent."""
    path, mark, query = target.partition("?")
    if not mark:
        return target
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(name.lower() in SECRET_QUERY_NAMES for name, _value in pairs):
        return target
    kept = [
        (name, REDACTED if name.lower() in SECRET_QUERY_NAMES else value) for name, value in pairs
    ]
    return f"{path}?{urlencode(kept, safe='/:')}"


def may_be_signed_in(headers: dict[str, str]) -> bool:
    """Whether the request carries anything that could prove a user (no database asked)."""
    if "authorization" in headers:
        return True
    if settings.MRT_SSO_HEADER and settings.MRT_SSO_HEADER.lower() in headers:
        return True
    return f"{settings.SESSION_COOKIE_NAME}=" in headers.get("cookie", "")


def _request(path: str, headers: dict[str, str], client: str) -> HttpRequest:
    """A Django request with just the headers, for the console's own credential checks."""
    from django.http.cookie import parse_cookie

    request = HttpRequest()
    request.path = request.path_info = path
    request.META["REMOTE_ADDR"] = client
    for name, value in headers.items():
        if "_" in name:
            continue  # as Django's ASGI request: an underscore name could pose as another
        request.META["HTTP_" + name.upper().replace("-", "_")] = value
    request.COOKIES = parse_cookie(headers.get("cookie", ""))
    return request


def allowance_of(path: str, headers: dict[str, str], client: str) -> str:
    """What the headers prove at the door at ``path`` (routed, without the URL prefix):
    ``DEPOSITOR``, ``SIGNED_IN`` or ``ANONYMOUS`` (database reads)."""
    from importlib import import_module

    from django.contrib import auth

    from queues.operator.auth import may, trusted_username
    from queues.views.poster import depositor_token

    close_old_connections()
    try:
        request = _request(path, headers, client)
        if path.startswith(POSTER_PREFIX):
            # Only a token whose user may submit: the door refuses any other.
            token = depositor_token(request)
            ok = token is not None and may(token.user, "batch", "submit")
            return DEPOSITOR if ok else ANONYMOUS
        if depositor_token(request) is not None or trusted_username(request):
            return SIGNED_IN
        key = request.COOKIES.get(settings.SESSION_COOKIE_NAME)
        if not key:
            return ANONYMOUS
        request.session = import_module(settings.SESSION_ENGINE).SessionStore(key)
        user = auth.get_user(request)
        return SIGNED_IN if user.is_authenticated and user.is_active else ANONYMOUS
    finally:
        close_old_connections()


def refusal_text(limit: int) -> str:
    return (
        f"413 Request Entity Too Large: this request may send at most {limit} bytes; larger "
        "uploads are taken only from a signed-in user (on /poster/, with the API token of a "
        "user who may submit).\n"
    )


def too_slow_text(seconds: float) -> str:
    return (
        f"408 Request Timeout: a request (its headers and whole body) must arrive within "
        f"{seconds:g} seconds; this one had not.\n"
    )


# When the database that holds sessions and tokens cannot be asked: an outage, not a refusal.
UNAVAILABLE_TEXT = (
    "503 Service Unavailable: the console's database cannot be reached to check who sends "
    "this request; try again shortly.\n"
)


def raw_answer(status: HTTPStatus, text: str, *, retry_after: int | None = None) -> bytes:
    """A whole plain-text HTTP/1.1 answer that closes the connection."""
    body = text.encode()
    head = [
        f"HTTP/1.1 {status.value} {status.phrase}",
        "Content-Type: text/plain; charset=utf-8",
        "Connection: close",
        f"Content-Length: {len(body)}",
    ]
    if retry_after is not None:
        head.append(f"Retry-After: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _note(method: str, path: str, client: str, size: str, limit: int) -> None:
    log.info("413 %s %s from %s: %s bytes, at most %d here", method, path, client, size, limit)


# In daphne ---------------------------------------------------------------------------------


def install_in_daphne() -> None:
    """Make daphne's HTTP server build its requests from ``bounded(daphne's WebRequest)``, and
    its access log leave secrets out (``redacting``).

    daphne's factory looks its request class up by name at every connection, so replacing the
    name reaches every server in this process; its server hands every access-log line to
    ``Server.log_action``, which is wrapped here before any server exists (``mrtadmin.asgi`` is
    imported before daphne builds its server). Nothing else of daphne changes.
    """
    import daphne.http_protocol as daphne_http
    import daphne.server as daphne_server

    if not getattr(daphne_http.WebRequest, "bounded", False):
        daphne_http.WebRequest = bounded(daphne_http.WebRequest)
    if not getattr(daphne_http.HTTPFactory.buildProtocol, "bounded", False):
        daphne_http.HTTPFactory.buildProtocol = line_bounded(daphne_http.HTTPFactory.buildProtocol)
    if not getattr(daphne_server.Server.log_action, "redacting", False):
        daphne_server.Server.log_action = redacting(daphne_server.Server.log_action)


# Twisted's HTTPChannel keeps "a request line is awaited" in a name-mangled attribute.
_AWAITS_LINE = "_HTTPChannel__first_line"


def _awaits_line(channel: Any) -> bool:
    return bool(getattr(channel, _AWAITS_LINE, False))


def _part_of_a_line(channel: Any) -> bool:
    """Whether bytes of a request line that is not whole yet are in (LineReceiver's buffer):
    awaiting a line with nothing buffered is a kept-alive connection between two requests."""
    return _awaits_line(channel) and bool(getattr(channel, "_buffer", b""))


def line_bounded(build: Callable[..., Any]) -> Callable[..., Any]:
    """daphne's ``HTTPFactory.buildProtocol`` whose channels give a request line the request's
    deadline too: Twisted makes the request (and so starts its clock) only once the whole first
    line is in, and its idle timeout starts again at every byte, so a line sent a byte at a time
    was held with no end. The clock starts at the line's first byte; the request made from the
    line goes on with it (``BoundedRequest``); a line not whole in time is answered 408."""

    def build_protocol(factory: Any, addr: Any) -> Any:
        protocol = build(factory, addr)
        # Twisted hands out a proxy that negotiates the protocol; the HTTP/1.1 channel is its
        # ``_channel``, whose own dataReceived the proxy calls.
        channel = getattr(protocol, "_channel", protocol)
        if channel is None:
            return protocol
        received = channel.dataReceived
        timer: list[Any] = []

        def too_slow() -> None:
            timer.clear()
            transport = channel.transport
            gone = transport is None or getattr(transport, "disconnected", False)
            if gone or not _part_of_a_line(channel):
                return
            seconds = request_seconds()
            log.info("408 a request line not whole after %gs", seconds)
            transport.write(raw_answer(HTTPStatus.REQUEST_TIMEOUT, too_slow_text(seconds)))
            transport.loseConnection()

        def data_received(data: bytes) -> None:
            if not timer and _awaits_line(channel):
                channel._mrt_line_began = time.monotonic()
                timer.append(channel.callLater(request_seconds(), too_slow))
            received(data)
            if timer and not _part_of_a_line(channel):
                # The line is in: its request has taken the clock over (or, a request without
                # a body, has been handed on whole: between two requests no clock runs).
                call = timer.pop()
                if call.active():
                    call.cancel()
                channel._mrt_line_began = None

        channel.dataReceived = data_received
        return protocol

    build_protocol.bounded = True  # type: ignore[attr-defined]
    return build_protocol


def redacting(log_action: Callable[..., None]) -> Callable[..., None]:
    """daphne's ``Server.log_action`` with the request target's secrets redacted."""

    def logged(server: Any, protocol: str, action: str, details: dict[str, Any]) -> None:
        path = details.get("path")
        if isinstance(path, str):
            details = {**details, "path": redact_query(path)}
        log_action(server, protocol, action, details)

    logged.redacting = True  # type: ignore[attr-defined]
    return logged


def bounded(base: type[Any]) -> type[Any]:
    """``base`` (daphne's Twisted request) judging its body before keeping it, and giving the
    whole request one deadline."""
    from twisted.internet import threads

    class BoundedRequest(base):  # type: ignore[misc, valid-type]
        bounded = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            # Made when the request line has arrived; the clock started at its first byte
            # (``line_bounded``), or here.
            began = getattr(args[0] if args else kwargs.get("channel"), "_mrt_line_began", None)
            self._begun = began if isinstance(began, float) else time.monotonic()
            self._received = 0
            self._held: list[bytes] | None = None  # a list while the credentials are checked
            self._complete: tuple[bytes, bytes, bytes] | None = None
            self._refused = False
            self._whole = False  # the whole request is in (daphne has it)
            self._limit = anonymous_limit()
            self._seconds = request_seconds()
            self._path = self._client = self._method = ""
            self._timer: Any = None
            super().__init__(*args, **kwargs)
            self._set_deadline(self._seconds)

        # The deadline for the whole request ------------------------------------------------

        def _set_deadline(self, seconds: float) -> None:
            self._seconds = seconds
            if self._timer is not None and self._timer.active():
                self._timer.cancel()
            left = max(0.0, self._begun + seconds - time.monotonic())
            # The channel's clock (Twisted's reactor, which tests may replace).
            self._timer = self.channel.callLater(left, self._too_slow)

        def _stop_deadline(self) -> None:
            if self._timer is not None and self._timer.active():
                self._timer.cancel()
            self._timer = None

        def _too_slow(self) -> None:
            self._timer = None
            if self._refused or self._whole or self.channel is None:
                return
            log.info(
                "408 %s %s from %s: not whole after %gs",
                self._method or "?",
                self._path or "?",
                self._client or getattr(self.getClientAddress(), "host", ""),
                self._seconds,
            )
            self._close_with(raw_answer(HTTPStatus.REQUEST_TIMEOUT, too_slow_text(self._seconds)))

        def connectionLost(self, reason: Any) -> None:
            self._stop_deadline()
            super().connectionLost(reason)

        # The body's size ------------------------------------------------------------------

        def gotLength(self, length: int | None) -> None:
            if self._refused:
                # Too slow already: the rest of the headers came after the answer.
                self.requestHeaders.removeHeader(b"expect")
                return
            # The channel has the request line; the request learns it only with the body.
            self._method = self.channel._command.decode("latin-1")
            self._client = getattr(self.getClientAddress(), "host", "")
            headers = {
                name.decode("latin-1").lower(): b", ".join(values).decode("latin-1")
                for name, values in self.requestHeaders.getAllRawHeaders()
            }
            root = self.server.root_path
            if "daphne-root-path" in headers:  # as daphne reads it
                root = unquote(headers["daphne-root-path"])
            raw = urlsplit(self.channel._path.decode("latin-1")).path
            self._path = routed_path(unquote(raw), root)
            if length is not None and length <= self._limit:
                super().gotLength(length)
                return
            if not may_be_signed_in(headers):
                self._judge(length, ANONYMOUS)
                return
            # Not a byte more is read until the credentials are checked; what came with the
            # headers waits in memory.
            self._held = []
            self.channel._networkProducer.pauseProducing()
            checked = threads.deferToThread(allowance_of, self._path, headers, self._client)
            checked.addCallbacks(lambda allowed: self._checked(length, allowed), self._check_failed)
            checked.addErrback(lambda failure: log.error("%s", failure.getTraceback()))

        def _check_failed(self, failure: Any) -> None:
            if self.channel is None or self._refused:
                return
            if failure.check(DatabaseError):
                log.warning("could not check a large request's sender: %s", failure.value)
                self._close_with(
                    raw_answer(HTTPStatus.SERVICE_UNAVAILABLE, UNAVAILABLE_TEXT, retry_after=10)
                )
                return
            log.error("checking a large request's sender failed: %s", failure.getTraceback())
            status = HTTPStatus.INTERNAL_SERVER_ERROR
            self._close_with(raw_answer(status, f"{status.value} {status.phrase}\n"))

        def _checked(self, length: int | None, allowance: str) -> None:
            if self.channel is None or self._refused:
                return  # the client went away, or sent too much, or too slowly, meanwhile
            held, self._held = self._held or [], None
            self._received = 0
            self.channel._networkProducer.resumeProducing()
            if not self._judge(length, allowance):
                return
            for data in held:
                self.handleContentChunk(data)
            if self._complete is not None and not self._refused:
                self._whole = True
                self._stop_deadline()
                super().requestReceived(*self._complete)

        def _judge(self, length: int | None, allowance: str) -> bool:
            self._limit = limit_for(allowance)
            if seconds_for(allowance) != self._seconds:
                self._set_deadline(seconds_for(allowance))
            if length is not None and length > self._limit:
                self._refuse(str(length))
                return False
            super().gotLength(length)
            return True

        def handleContentChunk(self, data: bytes) -> None:
            if self._refused:
                return
            self._received += len(data)
            if self._held is not None:
                self._held.append(data)
                if self._received > max(anonymous_limit(), HELD_BYTES):
                    self._refuse(f"over {self._received}")
                return
            if self._received > self._limit:
                self._refuse(f"over {self._received}")
                return
            super().handleContentChunk(data)

        def _refuse(self, size: str) -> None:
            _note(self._method, self._path, self._client, size, self._limit)
            refusal = raw_answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, refusal_text(self._limit))
            self._close_with(refusal)

        def _close_with(self, answer: bytes) -> None:
            """Answer, keep nothing of the body, and close once the client had time to read."""
            self._refused = True
            self._stop_deadline()
            self._held = None
            self.content = BytesIO()
            # Twisted answers "Expect: 100-continue" right after gotLength: not to this one.
            self.requestHeaders.removeHeader(b"expect")
            transport = self.channel.transport
            transport.write(answer)
            self.channel._networkProducer.resumeProducing()
            lose_write = getattr(transport, "loseWriteConnection", None)
            if lose_write is not None:
                lose_write()
            self.channel.callLater(LINGER_SECONDS, transport.loseConnection)

        def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
            if self._refused:
                return
            if self._held is not None:
                # The whole (small, chunked) body came before the credentials were checked.
                self._complete = (command, path, version)
                return
            self._whole = True
            self._stop_deadline()
            super().requestReceived(command, path, version)

    return BoundedRequest


# In front of the ASGI application ----------------------------------------------------------


class BodyLimit:
    """The same limits for ASGI servers that stream the body to the application: its size,
    and its deadline (from the moment the application is called: such a server has read the
    headers by then)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope.get("headers", ()))
        path = routed_path(scope.get("path", ""), scope.get("root_path", ""))
        client = (scope.get("client") or ("", 0))[0]
        length = _declared_length(headers)
        allowance = ANONYMOUS
        if (length is None or length > anonymous_limit()) and may_be_signed_in(headers):
            try:
                allowance = await sync_to_async(allowance_of, thread_sensitive=False)(
                    path, headers, client
                )
            except DatabaseError as exc:
                log.warning("could not check a large request's sender: %s", exc)
                unavailable = HTTPStatus.SERVICE_UNAVAILABLE
                await _send_text(send, unavailable, UNAVAILABLE_TEXT, retry_after=10)
                return
        limit = limit_for(allowance)
        if length is not None and length > limit:
            _note(scope.get("method", "?"), path, client, str(length), limit)
            await _send_text(send, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, refusal_text(limit))
            return
        counted = _Counted(receive, limit, seconds_for(allowance))
        started = False

        async def noting(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted, noting)
        if started:
            return
        if counted.over:
            _note(scope.get("method", "?"), path, client, f"over {counted.received}", limit)
            await _send_text(send, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, refusal_text(limit))
        elif counted.too_slow:
            log.info(
                "408 %s %s from %s: not whole after %gs",
                scope.get("method", "?"),
                path,
                client,
                counted.seconds,
            )
            await _send_text(send, HTTPStatus.REQUEST_TIMEOUT, too_slow_text(counted.seconds))


class _Counted:
    """``receive`` that stops the application at the limit or the deadline: past either, the
    application is told the client left (Django then answers nothing) and the wrapper answers
    413 or 408. Once the body is whole, ``receive`` is the server's own again (Django listens
    on it for the client leaving while it answers)."""

    def __init__(self, receive: Receive, limit: int, seconds: float) -> None:
        self.receive = receive
        self.limit = limit
        self.seconds = seconds
        self.due = time.monotonic() + seconds
        self.received = 0
        self.over = False
        self.too_slow = False
        self.whole = False

    async def __call__(self) -> Message:
        if self.over or self.too_slow:
            return {"type": "http.disconnect"}
        if self.whole:
            return await self.receive()
        try:
            message = await asyncio.wait_for(self.receive(), max(0.0, self.due - time.monotonic()))
        except TimeoutError:
            self.too_slow = True
            return {"type": "http.disconnect"}
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                self.over = True
                return {"type": "http.disconnect"}
            self.whole = not message.get("more_body", False)
        return message


def _declared_length(headers: dict[str, str]) -> int | None:
    """The body's size as the headers give it; None when it is unknown until it has arrived
    (chunked, or a length that does not parse). No length and no transfer coding is an empty
    body, as HTTP/1.1 says: every GET, which must not cost a database look-up."""
    if "content-length" in headers:
        try:
            return int(headers["content-length"])
        except ValueError:
            return None
    return None if "transfer-encoding" in headers else 0


def _headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in raw:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return headers


async def _send_text(
    send: Send, status: HTTPStatus, text: str, *, retry_after: int | None = None
) -> None:
    body = text.encode()
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"connection", b"close"),
        (b"content-length", str(len(body)).encode()),
    ]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status.value, "headers": headers})
    await send({"type": "http.response.body", "body": body})
