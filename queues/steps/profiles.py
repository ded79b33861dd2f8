"""Ingest profiles: one JSON file per collection in the profiles folder.

A profile file ``<name>.json``::

    {
      "collection": "ark:/13030/m5demo",        collection ARK (required)
      "ark_shoulder": "ark:/99999/fk4",         shoulder new object ARKs are minted on (required)
      "contacts": ["someone@example.org"],      batch summary recipients (required, may be [])
      "storage_node": "9501",                   storage node id (required)
      "priority": 5,                            job priority 0..99, lower runs first (default 5)
      "callback_url": "https://...",            POSTed when a job completes (optional)
      "queued_mail": true,                      mail the depositor and contacts the list of
                                                jobs once a batch is queued (default false)
      "description": "..."                      shown on the console (optional)
      "owner": "ark:/13030/j2..."               owner ARK, written to mrt-owner.txt (optional)
    }

Merritt's own profiles are read too: ANVL text files ``<name>.txt`` (or ``<name>`` without an
extension), read as Java properties the way Merritt's ingest reads them (``ProfileUtil``)::

    ProfileID: merritt_demo_content
    ProfileDescription: Demo collection
    Identifier-scheme: ARK
    Identifier-namespace: 99999
    Collection.1: ark:/13030/m5demo01            collection (the first one is "the" collection)
    Type: MRT-curatorial                          object type and role, for mrt-mom.txt
    Role: MRT-content
    Aggregate:
    Owner: ark:/13030/j2owner                     owner ARK, for mrt-owner.txt
    Notification.1: curator@example.org           contacts
    StorageService: http://store.example.org:35121
    StorageNode: 9501
    ObjectMinterURL: https://ezid.cdlib.org/shoulder/ark:/99999/fk4   the shoulder is its end
    CallbackURL: https://example.org/callback     (optional)
    NotificationFormat: xml                       (optional)
    Priority: 5                                   (optional, 0..99)
    Handler.1: org.cdlib.mrt.ingest.handlers...   (and other keys: read, not used here)

A JSON profile wins over a text one of the same name.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from queues.core.words import digits

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
DEFAULT_PRIORITY = 5
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "profiles"


class ProfileError(ValueError):
    pass


class ProfileNotFound(ProfileError):
    pass


@dataclass(frozen=True)
class Profile:
    name: str
    collection: str
    ark_shoulder: str
    contacts: tuple[str, ...]
    storage_node: str
    priority: int = DEFAULT_PRIORITY
    callback_url: str | None = None
    description: str = ""
    queued_mail: bool = False
    # Merritt's profile keys (an ANVL profile has them; a JSON one may have an owner).
    owner: str | None = None
    collections: tuple[str, ...] = ()
    storage_service: str | None = None
    minter_url: str | None = None
    notification_format: str | None = None
    object_type: str | None = None
    object_role: str | None = None
    aggregate: str | None = None
    # Sent to EZID with a mint as mrt.creator and _owner (ANVL Context, EZID_co-owner).
    context: str | None = None
    ezid_coowner: str | None = None
    source: str = "json"  # "json" | "anvl"

    @property
    def all_collections(self) -> tuple[str, ...]:
        return self.collections or (self.collection,)


def profiles_dir() -> Path:
    """Setting MRT_PROFILES_DIR, or ``<repo>/profiles`` when Django is not configured."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        return Path(getattr(settings, "MRT_PROFILES_DIR", DEFAULT_DIR))
    except (ImproperlyConfigured, ImportError):
        return DEFAULT_DIR


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.match(name) or name in (".", ".."):
        raise ProfileError(f"invalid profile name {name!r}")
    return name


def _stat(path: Path, name: str) -> os.stat_result | None:
    try:
        found = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise ProfileError(f"profile {name!r} unreadable: {exc}") from None
    return None if stat.S_ISDIR(found.st_mode) else found


def _read(path: Path, name: str) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError):
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"profile {name!r} unreadable: {exc}") from None


# Each file's profile as last read, with what identified that version of the file (inode,
# size, modification time). The notify step looks its job's profile up twice a job, thousands
# of jobs a second in a batched loop: a stat a candidate file rather than a read and a parse.
_read_before: dict[Path, tuple[tuple[int, int, int], Profile]] = {}
_READ_BEFORE_MOST = 4096
_SETTLED_NS = 2_000_000_000


def _parsed(
    path: Path, found: os.stat_result, name: str, parse: Callable[[str, str], Profile]
) -> Profile:
    version = (found.st_ino, found.st_size, found.st_mtime_ns)
    before = _read_before.get(path)
    if before is not None and before[0] == version:
        return before[1]
    text = _read(path, name)
    if text is None:  # gone since the stat: the next candidate, as if never there
        raise FileNotFoundError(path)
    profile = parse(name, text)
    if time.time_ns() - found.st_mtime_ns < _SETTLED_NS:
        # Written within the clock's grain of now: a rewrite of the same size could still keep
        # this modification time, so the file is read again until it has settled.
        return profile
    if len(_read_before) >= _READ_BEFORE_MOST:
        _read_before.clear()
    _read_before[path] = (version, profile)
    return profile


def _anvl_profile(name: str, text: str) -> Profile:
    return _from_anvl(name, parse_properties(text))


def _json_profile(name: str, text: str) -> Profile:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ProfileError(f"profile {name!r} is not valid JSON: {exc}") from None
    return _from_json(name, data)


def load_profile(name: str, *, directory: Path | None = None) -> Profile:
    """The profile ``name``: ``<name>.json``, else Merritt's ``<name>.txt`` or ``<name>``. A file
    unchanged since it was last read gives the same profile without being read again."""
    validate_name(name)
    folder = directory or profiles_dir()
    for suffix in (".json", ".txt", ""):
        path = folder / f"{name}{suffix}"
        found = _stat(path, name)
        if found is None:
            continue
        try:
            return _parsed(path, found, name, _json_profile if suffix == ".json" else _anvl_profile)
        except FileNotFoundError:
            continue
    raise ProfileNotFound(f"no profile named {name!r}")


def _is_anvl_profile(path: Path) -> bool:
    try:
        return "ProfileID" in parse_properties(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return False


def all_profiles(*, directory: Path | None = None) -> list[Profile]:
    """Every profile in the folder, by name; a malformed file raises ProfileError.

    Text files count only when they say ``ProfileID`` (the folder may hold other text)."""
    folder = directory or profiles_dir()
    if not folder.is_dir():
        return []
    names = {p.stem for p in folder.glob("*.json") if NAME.match(p.stem)}
    names |= {p.stem for p in folder.glob("*.txt") if NAME.match(p.stem) and _is_anvl_profile(p)}
    return [load_profile(name, directory=folder) for name in sorted(names)]


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    out = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2 : i + 6]):
                out.append(chr(int(text[i + 2 : i + 6], 16)))
                i += 6
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


def parse_properties(text: str) -> dict[str, str]:
    """Key/value pairs of a Java properties text, as ``java.util.Properties.load`` reads them:
    ``#``/``!`` comments, ``key: value``, ``key=value`` or ``key value``, a trailing backslash
    continues a line, backslash escapes. A repeated key keeps its last value."""
    result: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].lstrip(" \t\f")
        i += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line) and i < len(lines):
            line = line[:-1] + lines[i].lstrip(" \t\f")
            i += 1
        if _continues(line):
            line = line[:-1]
        key_end = 0
        while key_end < len(line):
            char = line[key_end]
            if char == "\\":
                key_end += 2
                continue
            if char in ":= \t\f":
                break
            key_end += 1
        key, rest = line[:key_end], line[key_end:]
        rest = rest.lstrip(" \t\f")
        if rest[:1] in (":", "="):
            rest = rest[1:].lstrip(" \t\f")
        result[_unescape(key)] = _unescape(rest)
    return result


def _continues(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


_SHOULDER_IN_URL = re.compile(r"(ark:/[0-9]+/[0-9a-z]*)/?$")


def _numbered(props: dict[str, str], prefix: str) -> list[str]:
    found = []
    for key, value in props.items():
        if key.startswith(prefix) and value.strip():
            suffix = key[len(prefix) :]
            number = digits(suffix)
            found.append((10**9 if number is None else number, key, value.strip()))
    return [value for _n, _k, value in sorted(found)]


def _from_anvl(name: str, props: dict[str, str]) -> Profile:
    """A Merritt ANVL profile as a Profile; ProfileError for what the console cannot use."""

    def fail(problem: str) -> ProfileError:
        return ProfileError(f"profile {name!r}: {problem}")

    def text(key: str) -> str | None:
        value = props.get(key, "").strip()
        return value or None

    collections = tuple(_numbered(props, "Collection."))
    if not collections:
        raise fail("no Collection.N line")
    for collection in collections:
        if not collection.startswith("ark:/"):
            raise fail(f"collection must be an ARK, got {collection!r}")
    minter_url = text("ObjectMinterURL")
    match = _SHOULDER_IN_URL.search(unquote(urlsplit(minter_url or "").path))
    if not match:
        raise fail(f"ObjectMinterURL must end in an ARK shoulder, got {minter_url!r}")
    contacts = tuple(_numbered(props, "Notification."))
    bad = [c for c in contacts if not EMAIL.match(c)]
    if bad:
        raise fail(f"Notification must be e-mail addresses, got {bad[0]!r}")
    node = text("StorageNode")
    if node is None or digits(node) is None:
        raise fail(f"StorageNode must be a node number, got {node!r}")
    priority_text = text("Priority")
    priority = DEFAULT_PRIORITY
    if priority_text is not None:
        number = digits(priority_text)
        if number is None or not 0 <= number <= 99:
            raise fail(f"Priority must be a whole number 0..99, got {priority_text!r}")
        priority = number
    callback = text("CallbackURL")
    if callback is not None and urlsplit(callback).scheme not in ("http", "https"):
        raise fail(f"CallbackURL must be an http(s) URL, got {callback!r}")
    storage = text("StorageService")
    if storage is not None and urlsplit(storage).scheme not in ("http", "https"):
        raise fail(f"StorageService must be an http(s) URL, got {storage!r}")
    owner = text("Owner")
    if owner is not None and not owner.startswith("ark:/"):
        raise fail(f"Owner must be an ARK, got {owner!r}")
    return Profile(
        name=name,
        collection=collections[0],
        ark_shoulder=match.group(1),
        contacts=contacts,
        storage_node=node,
        priority=priority,
        callback_url=callback,
        description=text("ProfileDescription") or "",
        owner=owner,
        collections=collections,
        storage_service=storage,
        minter_url=minter_url,
        notification_format=text("NotificationFormat"),
        object_type=text("Type"),
        object_role=text("Role"),
        aggregate=text("Aggregate"),
        context=text("Context"),
        ezid_coowner=text("EZID_co-owner"),
        source="anvl",
    )


def _from_json(name: str, data: Any) -> Profile:
    def fail(problem: str) -> ProfileError:
        return ProfileError(f"profile {name!r}: {problem}")

    if not isinstance(data, dict):
        raise fail("must be a JSON object")
    for key in ("collection", "ark_shoulder", "contacts", "storage_node"):
        if key not in data:
            raise fail(f"missing {key!r}")
    collection = data["collection"]
    if not isinstance(collection, str) or not collection.startswith("ark:/"):
        raise fail(f"collection must be an ARK, got {collection!r}")
    shoulder = data["ark_shoulder"]
    if not isinstance(shoulder, str) or not re.match(r"^ark:/[0-9]+/[0-9a-z]*$", shoulder):
        raise fail(f"ark_shoulder must look like ark:/99999/fk4, got {shoulder!r}")
    contacts = data["contacts"]
    if not isinstance(contacts, list) or not all(
        isinstance(c, str) and EMAIL.match(c) for c in contacts
    ):
        raise fail("contacts must be a list of e-mail addresses")
    node = data["storage_node"]
    if isinstance(node, bool) or not isinstance(node, str | int) or not str(node).strip():
        raise fail("storage_node must be a node id")
    priority = data.get("priority", DEFAULT_PRIORITY)
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 99:
        raise fail(f"priority must be a whole number 0..99, got {priority!r}")
    callback = data.get("callback_url") or None
    if callback is not None and (
        not isinstance(callback, str) or urlsplit(callback).scheme not in ("http", "https")
    ):
        raise fail(f"callback_url must be an http(s) URL, got {callback!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise fail("description must be text")
    queued_mail = data.get("queued_mail", False)
    if not isinstance(queued_mail, bool):
        raise fail(f"queued_mail must be true or false, got {queued_mail!r}")
    owner = data.get("owner") or None
    if owner is not None and (not isinstance(owner, str) or not owner.startswith("ark:/")):
        raise fail(f"owner must be an ARK, got {owner!r}")
    return Profile(
        owner=owner,
        name=name,
        collection=collection,
        ark_shoulder=shoulder,
        contacts=tuple(contacts),
        storage_node=str(node).strip(),
        priority=priority,
        callback_url=callback,
        description=description,
        queued_mail=queued_mail,
    )
