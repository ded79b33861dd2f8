"""Minting ARKs: through EZID in production, from a ZooKeeper counter on one machine."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol
from urllib.parse import quote

import requests

# NOID's "betanumeric" digits: no vowels (no accidental words) and no "l" (looks like 1).
XDIGITS = "0123456789bcdfghjkmnpqrstvwxz"


class MintError(Exception):
    pass


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


class EzidMinter:
    """Mints through EZID's API: ``POST {base}/shoulder/{shoulder}``.

    EZID answers ``success: ark:/...`` (possibly followed by `` | shadow``) or
    ``error: reason``; the latter, any non-2xx status and transport errors raise MintError.
    Minting is not retried: a retry after a lost response would burn a second ARK, and the job's
    resume does the same more visibly.
    """

    def __init__(self, base_url: str, username: str, password: str, timeout: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self._auth = (username, password)
        self.timeout = timeout

    def mint(self, shoulder: str, metadata: Mapping[str, str] | None = None) -> str:
        url = f"{self.base_url}/shoulder/{quote(shoulder, safe=':/')}"
        try:
            response = requests.post(
                url,
                data=anvl(metadata or {}).encode("utf-8"),
                auth=self._auth,
                timeout=self.timeout,
                headers={"Content-Type": "text/plain; charset=UTF-8"},
            )
        except requests.RequestException as exc:
            raise MintError(f"EZID at {self.base_url} unreachable: {exc}") from None
        body = response.content.decode("utf-8", "replace").strip()
        first = body.splitlines()[0] if body else ""
        if first.startswith("error:"):
            reason = first.removeprefix("error:").strip()
            raise MintError(f"EZID refused to mint on {shoulder}: {reason}")
        if not response.ok:
            raise MintError(f"EZID answered HTTP {response.status_code} for {shoulder}")
        if not first.startswith("success:"):
            raise MintError(f"EZID answered something unexpected: {first[:200]!r}")
        identifier = first.removeprefix("success:").split("|", 1)[0].strip()
        if not identifier.startswith(shoulder):
            raise MintError(f"EZID minted {identifier!r}, which is not on shoulder {shoulder}")
        return identifier
