"""Minting ARKs: through EZID in production, from a ZooKeeper counter on one machine."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol
from urllib.parse import quote, unquote

import requests

from queues.core.outside_text import url_shown
from queues.core.retries import outage_of, unavailable
from queues.steps.merritt_wire import (
    answered_ok,
    is_ark_answer,
    java_urlencode,
    service_session,
    unavailable_answer,
)

EZID = "ezid"  # the service's name for its retry policy (queues.core.retries)
# EZID's answers about the console to a mint: our credentials (401), our account not allowed the
# profile's shoulder (403). EZID API v2: "error: unauthorized" 401, "error: forbidden" 403.
EZID_MINT_REFUSES_US = frozenset({401, 403})

# NOID's "betanumeric" digits: no vowels (no accidental words) and no "l" (looks like 1).
XDIGITS = "0123456789bcdfghjkmnpqrstvwxz"


class MintError(Exception):
    pass


def _none(_content: bytes) -> bool:
    return False


class EzidRefused(MintError):
    """EZID answered ``error: ...``: it understood the request and said no."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Minter(Protocol):
    def mint(self, shoulder: str) -> str: ...


def noid_check_char(identifier: str) -> str:
    """NOID's check character: sum of position * digit value over the whole id, mod 29.

    Characters outside XDIGITS (such as "/" and ":") count as 0, so the check also covers the
    NAAN and shoulder. It catches any single-character error and any transposition of two.
    """
    total = sum(
        position * (XDIGITS.index(char) if char in XDIGITS else 0)
        for position, char in enumerate(identifier, start=1)
    )
    return XDIGITS[total % len(XDIGITS)]


def to_base29(number: int, *, width: int = 4) -> str:
    if number < 0:
        raise ValueError("identifier counter must not be negative")
    digits = []
    while True:
        number, rest = divmod(number, len(XDIGITS))
        digits.append(XDIGITS[rest])
        if number == 0:
            break
    return "".join(reversed(digits)).rjust(width, XDIGITS[0])


class LocalMinter:
    """Mints ``{shoulder}{base-29 counter, at least 4 digits}{NOID check char}``.

    ``next_number(shoulder)`` must return a number never returned before for that shoulder
    (the ZooKeeper module provides one); the same number always gives the same ARK.
    """

    def __init__(self, next_number: Callable[[str], int], *, width: int = 4) -> None:
        self._next_number = next_number
        self._width = width

    def mint(self, shoulder: str) -> str:
        if not shoulder.startswith("ark:/"):
            raise MintError(f"shoulder {shoulder!r} is not an ARK shoulder")
        stem = shoulder + to_base29(self._next_number(shoulder), width=self._width)
        return stem + noid_check_char(stem.removeprefix("ark:/"))


def _anvl_escape(text: str, *, key: bool = False) -> str:
    # EZID's ANVL: %, newlines (and ":" in keys) are percent-encoded.
    text = text.replace("%", "%25").replace("\n", "%0A").replace("\r", "%0D")
    return text.replace(":", "%3A") if key else text


def anvl(metadata: Mapping[str, str]) -> str:
    return "".join(f"{_anvl_escape(k, key=True)}: {_anvl_escape(v)}\n" for k, v in metadata.items())


def erc_record(
    *,
    who: str | None = None,
    what: str | None = None,
    when: str | None = None,
    ark: str | None = None,
    local_id: str | None = None,
) -> str:
    """The ERC record Merritt's ingest sends EZID as the value of its ``erc`` element:
    ``who``/``what``/``when`` lines, then ``where`` lines for the ARK and the local id, each
    present only when known (the ARK is not, at mint time)."""
    lines = [
        f"{label}: {value}"
        for label, value in (
            ("who", who),
            ("what", what),
            ("when", when),
            ("where", ark),
            ("where", local_id),
        )
        if value and value.strip()
    ]
    return "".join(line + "\n" for line in lines)


def merritt_target(base_url: str, ark: str) -> str:
    """``{merritt}/m/{ark}`` with the ARK URL-encoded twice, as Merritt's ingest sets EZID's
    ``_target`` (EZID percent-decodes the value once, leaving the path segment encoded)."""
    return f"{base_url.rstrip('/')}/m/{java_urlencode(java_urlencode(ark))}"


def ezid_metadata(
    *,
    erc: str | None = None,
    target: str | None = None,
    owner: str | None = None,
    creator_context: str | None = None,
    depositor_erc: str | None = None,
) -> dict[str, str]:
    """EZID metadata as Merritt's ingest sends it: ``erc`` (the record above),
    ``mrt.creator`` (the profile's Context), ``_target`` and ``_owner`` (the profile's EZID
    co-owner), each only when there is a value. A depositor's own ERC (the ``erc`` field of
    the submission) takes the place of the record, as in Merritt's ``MintUtil.getMetadata``."""
    given = depositor_metadata(depositor_erc) if depositor_erc else {}
    pairs = (
        ("erc", None if given else erc),
        ("mrt.creator", creator_context),
        ("_target", target),
        ("_owner", owner),
    )
    return {**given, **{key: value for key, value in pairs if value}}


def depositor_metadata(text: str) -> dict[str, str]:
    """A depositor's ERC text as EZID metadata elements.

    Merritt's ingest sends the text as the first lines of its ANVL request body; EZID reads
    ``name: value`` lines (a line starting with white space continues the one before, and
    ``%XX`` escapes stand for ``%``, line breaks and ``:``). Text that is not in that form is
    one ``erc`` element. A depositor cannot set the elements the console sets itself
    (``_target``, ``_owner``, ...): names starting with ``_`` are EZID's reserved ones.
    """
    lines: list[str] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if line[:1] in (" ", "\t") and lines:
            lines[-1] += " " + line.strip()
        elif line.strip():
            lines.append(line)
    elements: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        name = unquote(name.strip())
        if not colon or not name or any(c.isspace() for c in name):
            return {"erc": text.strip()}
        if not name.startswith("_"):
            elements[name] = unquote(value.strip())
    return elements


def ark_metadata(
    ark: str | None,
    *,
    who: str | None = None,
    what: str | None = None,
    when: str | None = None,
    local_id: str | None = None,
    target_base: str = "",
    owner: str | None = None,
    creator_context: str | None = None,
    depositor_erc: str | None = None,
    retain_target: bool = False,
) -> dict[str, str]:
    """What EZID is sent for an object: its ERC record (naming the ARK once it is known), or
    the depositor's own ERC; ``_target`` = Merritt's object page unless the depositor asked to
    keep the target EZID has (``retainTargetURL``) or the ARK is not known yet."""
    target = (
        None if retain_target or not ark or not target_base else merritt_target(target_base, ark)
    )
    return ezid_metadata(
        erc=erc_record(who=who, what=what, when=when, ark=ark, local_id=local_id),
        target=target,
        owner=owner,
        creator_context=creator_context,
        depositor_erc=depositor_erc,
    )


class EzidMinter:
    """Mints and describes ARKs through EZID's API, as Merritt's ingest does.

    * ``mint``: ``POST {base}/shoulder/{shoulder}`` with ANVL metadata (``text/plain``).
    * ``update``: ``POST {base}/id/{identifier}`` with ANVL metadata; ingest sends the ERC,
      ``_target`` and ``_owner`` this way once the ARK exists.
    * ``describe``: ``update``, and when EZID refuses it (an ARK it does not hold, e.g. one the
      depositor brought), ``PUT {base}/id/{identifier}?update_if_exists=yes``, which creates the
      identifier, as Merritt's ingest does for every object it has not minted itself.

    EZID answers ``success: ark:/...`` (possibly followed by `` | shadow``) or ``error: reason``
    (with 400 for a bad request, 401 for bad credentials, ...); the latter, any non-2xx status
    and transport errors raise MintError, from an outage (the job waits) for 408, 429, 5xx and
    a transport error, and from one about the console (its breaker opens at once) for our
    credentials refused (401, and 403 to a mint), no endpoint there (404, 405) or an answer
    that is none of EZID's API. Requests are retried only when the connection could
    not be made at all: a mint repeated after a lost reply would burn a second ARK.
    """

    def __init__(
        self,
        base_url: str,
        username: str,
        password: str,
        timeout: float = 30.0,
        *,
        session: requests.Session | None = None,
        retries: int = 3,
    ):
        self.base_url = base_url.rstrip("/")
        self._auth = (username, password)
        self.timeout = timeout
        self.session = session or service_session(retries=retries)

    def _post(
        self,
        url: str,
        metadata: Mapping[str, str] | None,
        what: str,
        *,
        method: str = "POST",
        params: Mapping[str, str] | None = None,
        mint: bool = False,
    ) -> str:
        try:
            response = self.session.request(
                method,
                url,
                params=params,
                data=anvl(metadata or {}).encode("utf-8"),
                auth=self._auth,
                timeout=self.timeout,
                headers={"Content-Type": "text/plain; charset=UTF-8"},
            )
        except requests.RequestException as exc:
            raise MintError(
                f"EZID at {url_shown(self.base_url)} unreachable: {exc}"
            ) from unavailable(EZID, exc)
        body = response.content.decode("utf-8", "replace").strip()
        first = body.splitlines()[0] if body else ""
        # 401 is our credentials refused; 403 ("authenticated but not authorized") is about
        # the console only for a mint, whose shoulder is the profile's: for an identifier it
        # is that identifier's (one another account owns). EZID answers an identifier it does
        # not hold 400, so a 404 or 405 names no endpoint of its API: the configured URL's.
        refuses_us = EZID_MINT_REFUSES_US if mint else {401}
        cause = unavailable_answer(EZID, response, refuses_us=refuses_us, own_answer=_none)
        if first.startswith("error:"):
            reason = first.removeprefix("error:").strip()
            raise EzidRefused(
                f"EZID refused to {what}: {reason} (HTTP {response.status_code})",
                response.status_code,
            ) from cause
        if not answered_ok(response):
            raise MintError(f"EZID answered HTTP {response.status_code} to {what}") from cause
        if not first.startswith("success:"):
            # No answer of EZID's API (each begins "success:" or "error:"): a page of whatever
            # stands at the configured URL, which every request would meet.
            why = f"EZID answered something unexpected to {what}: {first[:200]!r}"
            raise MintError(why) from unavailable(EZID, why, ours=True)
        return first.removeprefix("success:").split("|", 1)[0].strip()

    def mint(self, shoulder: str, metadata: Mapping[str, str] | None = None) -> str:
        url = f"{self.base_url}/shoulder/{quote(shoulder, safe=':/')}"
        identifier = self._post(url, metadata, f"mint on {shoulder}", mint=True)
        if not is_ark_answer(identifier):
            raise MintError(f"EZID minted {identifier[:200]!r}, which is no ARK")
        if not identifier.startswith(shoulder) or identifier.rstrip("/") == shoulder.rstrip("/"):
            raise MintError(f"EZID minted {identifier!r}, which is not on shoulder {shoulder}")
        return identifier

    def update(self, identifier: str, metadata: Mapping[str, str]) -> None:
        url = f"{self.base_url}/id/{quote(identifier, safe=':/')}"
        answered = self._post(url, metadata, f"update {identifier}")
        if answered and answered != identifier:
            raise MintError(f"EZID answered the update of {identifier} for {answered!r}")

    def describe(self, identifier: str, metadata: Mapping[str, str]) -> None:
        """Update an identifier EZID may not hold yet; create it if EZID refuses the update.
        An unreachable EZID, or one refusing the console (bad credentials, 401), is not worth a
        create: MintError."""
        try:
            self.update(identifier, metadata)
            return
        except EzidRefused as exc:
            if outage_of(exc) is not None:
                raise  # EZID away, or refusing the console: a create would meet the same
        url = f"{self.base_url}/id/{quote(identifier, safe=':/')}"
        answered = self._post(
            url,
            metadata,
            f"create {identifier}",
            method="PUT",
            params={"update_if_exists": "yes"},
        )
        if answered and answered != identifier:
            raise MintError(f"EZID answered the creation of {identifier} for {answered!r}")
