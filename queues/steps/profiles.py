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
    }
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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


def load_profile(name: str, *, directory: Path | None = None) -> Profile:
    validate_name(name)
    path = (directory or profiles_dir()) / f"{name}.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileNotFound(f"no profile named {name!r}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"profile {name!r} unreadable: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ProfileError(f"profile {name!r} is not valid JSON: {exc}") from None
    return _from_json(name, data)


def all_profiles(*, directory: Path | None = None) -> list[Profile]:
    """Every profile in the folder, by name; a malformed file raises ProfileError."""
    folder = directory or profiles_dir()
    if not folder.is_dir():
        return []
    names = sorted(p.stem for p in folder.glob("*.json") if NAME.match(p.stem))
    return [load_profile(name, directory=folder) for name in names]


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
    return Profile(
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
