"""Folder listings for a walk over the whole tree in bounded memory (the consistency check).

A folder of a million children listed by kazoo's ``get_children`` becomes a million Python
strings (about 70 MB) before anything looks at them. These helpers take the listing's answer as
bytes (``kazoo_private.list_children_raw``, as the read index does) and keep what a walk needs:
job and batch IDs as numbers in an ``array`` (8 bytes each), state folder entries as packed
(priority, number) keys, and other names one at a time from the bytes. Several folders are
asked for at once (one round trip) and their answers parsed one by one.
"""

from __future__ import annotations

import re
import struct
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import cast

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from . import kazoo_private
from .packed import NUM_BITS, NUM_MASK

_INT = struct.Struct("!i")
# A child named "jid"/"bid"/"qid" and ten digits: its length (13), then the name. No name holds
# a NUL byte, so a match can only start at a length.
_ID_NAME = {
    prefix: re.compile(_INT.pack(13) + prefix.encode() + rb"([0-9]{10})")
    for prefix in ("jid", "bid")
}
# A job state folder's entry: length 16, "PP-jid" and ten digits.
_ENTRY_NAME = re.compile(_INT.pack(16) + rb"([0-9]{2})-jid([0-9]{10})")


@dataclass
class Listing:
    """One folder's children as numbers (sorted), and the names that are not of that form."""

    exists: bool = True
    numbers: array[int] = field(default_factory=lambda: array("q"))
    others: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.numbers) + len(self.others)


def _count(raw: bytes) -> int:
    return int(_INT.unpack_from(raw, 0)[0]) if len(raw) >= 4 else 0


def names(raw: bytes) -> Iterator[str]:
    """Every child name in a listing's answer, decoded one at a time."""
    offset = 4
    for _ in range(_count(raw)):
        (size,) = _INT.unpack_from(raw, offset)
        offset += 4
        yield raw[offset : offset + size].decode("utf-8", "replace")
        offset += size


def _others(raw: bytes, form: re.Pattern[bytes], found: int) -> list[str]:
    """The names that are not of ``form``: only looked for when the counts say there are some."""
    if found == _count(raw):
        return []
    name = re.compile(form.pattern[4:])  # the pattern without the length
    return [n for n in names(raw) if not name.fullmatch(n.encode())]


def start(zk: KazooClient, folders: Sequence[str]) -> list[tuple[str, object]]:
    """Ask for every folder's listing now (one round trip); ``collect`` each answer later."""
    return [(path, kazoo_private.list_children_raw(zk, path)) for path in folders]


def collect(pending: object) -> bytes | None:
    """A listing's answer (bytes), or None when the folder does not exist."""
    try:
        return cast("bytes", pending.get())  # type: ignore[attr-defined]
    except NoNodeError:
        return None


def id_listing(raw: bytes | None, prefix: str) -> Listing:
    """A folder of ``<prefix>NNNNNNNNNN`` children (``/jobs``, ``/batches``, a batch's index
    folder) as sorted numbers, with any other names beside them."""
    if raw is None:
        return Listing(exists=False)
    form = _ID_NAME[prefix]
    numbers = array("q", sorted(int(m[1]) for m in form.finditer(raw)))
    return Listing(numbers=numbers, others=_others(raw, form, len(numbers)))


def entry_listing(raw: bytes | None) -> Listing:
    """A job state folder as sorted keys ``priority << NUM_BITS | number`` (``entry_key``)."""
    if raw is None:
        return Listing(exists=False)
    keys = array("q", sorted(int(m[1]) << NUM_BITS | int(m[2]) for m in _ENTRY_NAME.finditer(raw)))
    return Listing(numbers=keys, others=_others(raw, _ENTRY_NAME, len(keys)))


def entry_key(key: int) -> tuple[int, int]:
    """(priority, job number) of a state folder entry's key."""
    return key >> NUM_BITS, key & NUM_MASK


def list_ids(zk: KazooClient, folder: str, prefix: str) -> Listing:
    return id_listing(collect(kazoo_private.list_children_raw(zk, folder)), prefix)


def list_names(zk: KazooClient, folder: str) -> Iterator[str]:
    """A folder's child names one at a time, from the answer's bytes (none when it is gone)."""
    raw = collect(kazoo_private.list_children_raw(zk, folder))
    return names(raw) if raw is not None else iter(())
