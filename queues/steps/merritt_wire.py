"""What the HTTP clients of Merritt's services share: pooled sessions and Merritt's error documents.

See docs/merritt-services.md for the facts behind this module and their sources.

Merritt's Java services (storage, inventory) answer a refusal with an exception document: the
service's ``TException`` formatted in the response form asked for (XML unless told otherwise),
under an HTTP status taken from the exception (400 for a bad request, 404 for an unknown item,
500/503 for a failure). In XML its root element is named after the exception class,
``exc:tException.REQUEST_INVALID`` say, in the namespace
``http://uc3.cdlib.org/ontology/mrt/core/exc``, and its children carry the reason (``error``,
``description``) and the status name. In JSON the same document is one object keyed by the root
name.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any
from urllib.parse import quote_plus
from xml.etree import ElementTree

import requests
import urllib3
from requests.adapters import HTTPAdapter

from queues.core.retries import REASON_MAX, ServiceUnavailable, http_unavailable
from queues.steps.netpolicy import EXCHANGE_POOLS, RetryWithin, exchange_deadline, origin

EXC_NAMESPACE = "http://uc3.cdlib.org/ontology/mrt/core/exc"
# Replies worth asking again for: the service, or a proxy in front of it, is briefly away.
RETRY_STATUSES = (502, 503, 504)
# The deadline of one whole exchange with a Merritt service, unless its client is told another
# (MRT_SERVICE_DEADLINE; a storage add, which reads every file of a version, gets
# MRT_STORAGE_ADD_DEADLINE).
DEFAULT_DEADLINE = 300.0
# The longest answer a client reads from a Merritt service (their documents are a few KB; a
# storage manifest of a large object a few MB). A longer one is the exchange's failure, not a
# process's memory: it was read whole before.
ANSWER_MAX = 64 * 1024 * 1024
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


# Answers about the console, not the job (docs/merritt-services.md, "Answers about the
# console"). Merritt's storage and inventory authenticate no one (each is one Jersey servlet on
# ``/*``, no security constraint in its web.xml), so a 401 or 403 comes from whatever stands in
# front of them refusing our credentials; and a request a resource of theirs took is refused
# with their exception document, so a 404 or 405 without one names no endpoint of theirs: the
# configured URL is wrong. Every job would meet either alike.
REFUSES_US = frozenset({401, 403})
NO_ENDPOINT = frozenset({404, 405})


def is_exception_document(content: bytes) -> bool:
    """Whether ``content`` is Merritt's exception document (XML or JSON), of any kind."""
    root = parse_xml(content[:20000])
    if root is not None:
        return _EXCEPTION_ROOT.match(local_name(root.tag)) is not None
    parsed = state_fields(content[:20000])
    return parsed is not None and _EXCEPTION_ROOT.match(parsed[0]) is not None


def console_refused(
    service: str,
    response: requests.Response,
    *,
    refuses_us: Collection[int] = REFUSES_US,
    own_answer: Callable[[bytes], bool] = is_exception_document,
) -> ServiceUnavailable | None:
    """The marker (``ours``) for an answer about the console rather than the job: a status of
    ``refuses_us`` (our credentials refused), or a 404 or 405 whose body is not the service's
    own answer (``own_answer``: the configured URL names no endpoint of the service). None for
    any other answer."""
    status = response.status_code
    if status in refuses_us:
        why = "the service refuses the console's credentials"
    elif status in NO_ENDPOINT and not own_answer(response.content):
        why = "no endpoint of the service answers there: is its configured URL right?"
    else:
        return None
    said = " ".join((response.reason or "").split())
    reason = f"HTTP {status} {said}".rstrip() + f" ({why})"
    return ServiceUnavailable(service, reason[:REASON_MAX], ours=True)


def unavailable_answer(
    service: str,
    response: requests.Response,
    *,
    refusals: Mapping[str, Collection[str]] | None = None,
    refuses_us: Collection[int] = REFUSES_US,
    own_answer: Callable[[bytes], bool] = is_exception_document,
) -> ServiceUnavailable | None:
    """What a client raises its refusal from when the answer means "not now" (408, 429, 5xx;
    ``queues.core.retries``) or is about the console (``console_refused``): the job is tried
    again later instead of failing. None otherwise.

    ``refusals``: the kinds of Merritt's exception document (mrt-core2 ``TExceptionEnum``) a
    service answers with a 5xx that no wait cures (a wrong request, wrong data), each with the
    words its reason must hold to be one (none: any reason); such an answer is no outage."""
    ours = console_refused(service, response, refuses_us=refuses_us, own_answer=own_answer)
    if ours is not None:
        return ours
    if refusals and response.status_code >= 500:
        words = refusals.get(exception_kind(response.content) or "")
        if words is not None:
            reason = merritt_error(response).lower()
            if not words or any(word in reason for word in words):
                return None
    return http_unavailable(
        service,
        response.status_code,
        response.reason or "",
        response.headers.get("Retry-After"),
        now=time.time(),
    )


def service_session(
    *,
    retries: int = 3,
    backoff: float = 0.5,
    retry_posts: bool = False,
    statuses: Collection[int] = RETRY_STATUSES,
    pool: int = 16,
    deadline: float = DEFAULT_DEADLINE,
) -> requests.Session:
    """A pooled session for one remote service.

    Connection errors (nothing reached the service) are retried for every method. A lost
    reply or a 502/503/504 is retried only for methods that are safe to repeat, and for POST
    only when ``retry_posts`` says the service's POSTs are idempotent: a second storage add
    would make a second version, a second mint a second ARK. The repeats wait their own short
    back-off (none before the first, then ``backoff`` doubling: 0, 1 and 2 s by default), never a
    ``Retry-After``: urllib3 would sleep what the service asks, up to six hours, inside the
    exchange's one deadline and past it, and raise on a value it cannot read. A service's
    ``Retry-After`` is the job's wait (``queues.core.retries``). The back-off is held to the
    exchange's deadline too (``netpolicy.RetryWithin``): a repeat whose wait would end at or past
    it is not made, and the exchange ends with its last answer (a 503 and its ``Retry-After``) or
    its last error (requests' ConnectionError saying so), an outage either way.
    """
    methods = _SAFE_METHODS | ({"POST"} if retry_posts else set())
    retry = RetryWithin(
        total=retries,
        connect=retries,
        read=retries,
        status=retries,
        other=0,
        allowed_methods=methods,
        status_forcelist=tuple(statuses),
        backoff_factor=backoff,
        raise_on_status=False,
        respect_retry_after_header=False,
    )
    adapter = WithinAdapter(max_retries=retry, pool_connections=4, pool_maxsize=pool)
    adapter.poolmanager.pool_classes_by_scheme = EXCHANGE_POOLS
    session = DeadlineSession(deadline)
    # A body as the service sends it, never inflated from gzip: 200 KB inflated to 200 MB.
    session.headers["Accept-Encoding"] = "identity"
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


# The redirects a service's GET follows (requests' own default is 30).
MAX_REDIRECTS = 5
_hops = threading.local()  # the origin a thread's request was first sent to, while it runs


class DeadlineSession(requests.Session):
    """A session whose every request, its repeats, redirects and reading of the answer
    included, has one deadline (``netpolicy.exchange_deadline``): past it the connection is
    shut down and the request raises ``requests.Timeout`` saying so.

    Only a GET or a HEAD follows a redirect, at most MAX_REDIRECTS of them, each to the scheme,
    host and port the request was first sent to (or the same host over https, an http URL
    moved there): one anywhere else raises ``requests.exceptions.InvalidURL`` before anything
    is sent there, as one whose target cannot be read does (a ValueError and a UnicodeDecodeError
    came out of requests' own redirect code). A POST's comes back as its answer (a 3xx, which no
    client takes for success): requests turned a 302 into a GET without the add, the mint or
    the record, and sent a 307's form on to another host."""

    def __init__(self, deadline: float) -> None:
        super().__init__()
        self.deadline = deadline
        self.max_redirects = MAX_REDIRECTS

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        if request.method not in ("GET", "HEAD"):
            kwargs["allow_redirects"] = False
        # requests sends each redirect's hop through here again, inside the first request's send.
        first = getattr(_hops, "origin", None)
        try:
            here = origin(request.url or "")
        except ValueError as exc:
            raise requests.exceptions.InvalidURL(f"{request.url}: {exc}") from exc
        if first is None:
            _hops.origin = here
            try:
                return self._send(request, **kwargs)
            finally:
                _hops.origin = None
        upgraded = first[0] == "http" and here[0] == "https" and here[1] == first[1]
        if here != first and not upgraded:
            raise requests.exceptions.InvalidURL(
                f"{request.url}: redirected from {first[0]}://{first[1]}:{first[2]} to "
                "another server, not followed"
            )
        return self._send(request, **kwargs)

    def _send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        with exchange_deadline(self.deadline) as alarm:
            try:
                response = super().send(request, **kwargs)
            except requests.RequestException as exc:
                if alarm.fired:
                    raise requests.Timeout(f"{request.url}: {alarm.reason}") from exc
                raise
            except (ValueError, UnicodeError) as exc:
                raise requests.exceptions.InvalidURL(f"{request.url}: {exc}") from exc
            if alarm.fired:
                # Cut off inside the headers or the body, the answer may still look whole
                # (http.client takes an early end of the headers for their end).
                response.close()
                raise requests.Timeout(f"{request.url}: {alarm.reason}")
            return response


class WithinAdapter(HTTPAdapter):
    """An adapter that reads each answer's body itself, at most ``answer_max`` of it, where
    requests would read it whole (a redirect's body too, read whole to free its connection)."""

    answer_max = ANSWER_MAX

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        """requests' manager for an HTTP proxy (``HTTP_PROXY``/``HTTPS_PROXY``), with the pools
        of the adapter's own (``EXCHANGE_POOLS`` in ``service_session``): a service behind the
        proxy was held past the exchange's deadline, and the proxy's name looked up with the
        resolver's own timeouts. A SOCKS proxy's manager, pools of its own, is left as it is."""
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if isinstance(manager, urllib3.ProxyManager):
            manager.pool_classes_by_scheme = self.poolmanager.pool_classes_by_scheme
        return manager

    def send(  # type: ignore[override]
        self, request: requests.PreparedRequest, stream: bool = False, **kwargs: Any
    ) -> requests.Response:
        response = super().send(request, stream=stream, **kwargs)
        if not stream or response.is_redirect:
            read_within(response, self.answer_max)
        return response


class AnswerTooLarge(requests.RequestException):
    """An answer longer than its client reads."""


def read_within(response: requests.Response, most: int) -> None:
    """Read ``response``'s body into it (``response.content``), or close it and raise
    AnswerTooLarge once it is longer than ``most`` bytes."""
    chunks = []
    total = 0
    for chunk in response.iter_content(64 * 1024):
        total += len(chunk)
        if total > most:
            response.close()
            raise AnswerTooLarge(
                f"{response.url}: the answer is longer than {most:,} bytes", response=response
            )
        chunks.append(chunk)
    response._content = b"".join(chunks)


def local_name(tag: str) -> str:
    """``{namespace}name`` or ``prefix:name`` -> ``name``."""
    return tag.rsplit("}", 1)[-1].rsplit(":", 1)[-1]


def parse_xml(text: str | bytes) -> ElementTree.Element | None:
    """The root element, or None when the text is not XML. Merritt's documents carry no
    document type declaration; one that does is refused, so no entity is ever expanded."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    if b"<!DOCTYPE" in data.upper() or b"<!ENTITY" in data.upper():
        return None
    try:
        return ElementTree.fromstring(data)  # noqa: S314 - no DTD, so no entities (above)
    except (ElementTree.ParseError, LookupError, ValueError):  # LookupError: encoding="bogus"
        return None


def json_document(data: str | bytes) -> Any:
    """The JSON value of an answer's body; None when it is no JSON, or nested deeper than the
    parser goes (100,000 levels raised RecursionError)."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def answered_ok(response: requests.Response) -> bool:
    """A 2xx. ``response.ok`` is any status below 400, and 600 and up: a 302 not followed, a
    304 or a 999 read as success (a recorded version, a minted ARK)."""
    return 200 <= response.status_code < 300


# An ARK as a service's answer may give one: "ark:/", the authority, then printable ASCII
# without spaces (a name with a space, a line break or a NUL was returned as the ARK).
_ARK_ANSWER = re.compile(r"ark:/[0-9A-Za-z]+/[!-~]{1,256}")


def is_ark_answer(text: str) -> bool:
    """Whether ``text`` can be an ARK an answer gives (and names no "." or ".." part)."""
    return bool(_ARK_ANSWER.fullmatch(text)) and not {".", ".."} & set(text.split("/"))


def child_text(element: ElementTree.Element, *names: str) -> str | None:
    """Text of the first direct child whose local name is one of ``names`` (in that order)."""
    for name in names:
        for child in element:
            if local_name(child.tag) == name and (child.text or "").strip():
                return (child.text or "").strip()
    return None


def state_fields(body: str | bytes) -> tuple[str, dict[str, str]] | None:
    """One of Merritt's state documents (``obj:objectState``, ``ver:versionState``,
    ``fil:fileState``, ...) as its root's local name and its leaf children by local name, from
    XML or from the JSON form (one object keyed by the root's name); None when it is neither.
    Booleans read as ``true``/``false``, as in the XML."""
    root = parse_xml(body)
    if root is not None:
        leaves = {local_name(c.tag): (c.text or "").strip() for c in root if len(c) == 0}
        return local_name(root.tag), leaves
    parsed = json_document(body)
    if not isinstance(parsed, dict) or len(parsed) != 1:
        return None
    [(key, inner)] = parsed.items()
    if not isinstance(inner, dict):
        return None
    fields = {
        local_name(k): str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in inner.items()
        if isinstance(v, str | int | float | bool) and not k.startswith("xmlns")
    }
    return local_name(key), fields


_EXCEPTION_ROOT = re.compile(r"^tException(?:\.(?P<kind>[A-Z_]+))?$", re.I)


def merritt_error(response: requests.Response) -> str:
    """A one-line reason from a refusal: Merritt's exception document when the body is one,
    else the HTTP status and the start of the body."""
    return merritt_error_text(response.status_code, response.content)


def merritt_error_text(status_code: int, content: bytes) -> str:
    """:func:`merritt_error` of an answer read some other way (``netpolicy``): its status and
    body."""
    status = f"HTTP {status_code}"
    body = content[:20000]
    root = parse_xml(body)
    if root is not None:
        match = _EXCEPTION_ROOT.match(local_name(root.tag))
        if match:
            kind = match.group("kind") or child_text(root, "statusName", "status")
            reason = child_text(root, "error", "description", "statusDescription")
            return _reason(status, kind, reason)
    data = json_document(body)
    if isinstance(data, dict) and len(data) == 1:
        [(key, inner)] = data.items()
        match = _EXCEPTION_ROOT.match(local_name(key))
        if match and isinstance(inner, dict):
            values = {local_name(k): v for k, v in inner.items() if isinstance(v, str | int)}
            named = match.group("kind") or values.get("statusName")
            said = values.get("error") or values.get("description")
            return _reason(status, str(named) if named else None, str(said) if said else None)
    text = " ".join(body.decode("utf-8", "replace").split())
    return f"{status} {text[:300]}".rstrip()


def exception_kind(content: bytes) -> str | None:
    """The kind of Merritt's exception document (``REQUEST_INVALID``, ...), XML or JSON; None
    when the body is not one or names none."""
    root = parse_xml(content[:20000])
    if root is not None:
        match = _EXCEPTION_ROOT.match(local_name(root.tag))
        if not match:
            return None
        kind = match.group("kind") or child_text(root, "statusName", "status")
    else:
        parsed = state_fields(content[:20000])
        match = _EXCEPTION_ROOT.match(parsed[0]) if parsed else None
        if not parsed or not match:
            return None
        kind = match.group("kind") or parsed[1].get("statusName")
    return kind.upper() if kind and re.fullmatch(r"[A-Za-z_]+", kind) else None


def _reason(status: str, kind: str | None, reason: str | None) -> str:
    head = f"{status} {kind}" if kind else status
    return f"{head}: {reason}" if reason else head


def java_urlencode(text: str) -> str:
    """``java.net.URLEncoder.encode(text, "UTF-8")``: what Merritt's Java code puts in URLs.

    Letters, digits and ``.-*_`` stay, a space becomes ``+``, everything else is %XX of its
    UTF-8 bytes (so ``ark:/13030/m5x`` -> ``ark%3A%2F13030%2Fm5x``).
    """
    return quote_plus(text, safe="*").replace("~", "%7E")


def merritt_urlencode(text: str) -> str:
    """Merritt's own ``org.cdlib.mrt.utility.URLEncoder.encode(text, "utf-8")`` (mrt-core2): Java's
    encoding with each ``+`` (a space) then written ``%20``, so that a path segment, which JAX-RS
    decodes without turning ``+`` into a space, reads back as the text. Ingest's
    ``LocalIDUtil`` encodes the owner and local id of inventory's ``primary/...`` paths with it
    (``scan 0042`` -> ``scan%200042``)."""
    return java_urlencode(text).replace("+", "%20")
