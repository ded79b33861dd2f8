"""What this console writes and reads the way Merritt's own services do.

Each fact here was read in Merritt's public source; ``docs/merritt-ingest-formats.md`` names the
repository, file and method of each one.

* Submission type names: Merritt's ingest calls its package types ``file``, ``container``,
  ``manifest``, ``batchManifestFile``, ``batchManifestContainer`` and ``batchManifest``; the
  console (and Merritt's inventory) use ``object-manifest`` and the hyphenated batch names.
  Both are accepted wherever a type is given; :func:`canonical_type` gives the console's name,
  :func:`merritt_type` Merritt's.
* The ``store`` and ``inventory`` job nodes that Processing writes for Merritt's storage and
  inventory services (:func:`store_node`, :func:`inventory_node`), and how Merritt's storage
  consumer reads ``store.mode`` back (:func:`parse_store_mode`).
* URL-encoding the way Java's ``URLEncoder`` does it (:func:`java_urlencode`), and the date
  texts of ``submissionDate``: a batch's ``java.util.Date`` text (:func:`java_date_text`), a
  job's ISO 8601 ``DateState`` text (:func:`iso_date_text`), both read back by
  :func:`parse_submission_date`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from urllib.parse import quote_plus, unquote_plus

from queues.core.moments import aware, inside
from queues.core.outside_text import url_without_credentials

# The console's name -> Merritt ingest's package type name.
MERRITT_TYPES: dict[str, str] = {
    "file": "file",
    "container": "container",
    "object-manifest": "manifest",
    "single-file-batch-manifest": "batchManifestFile",
    "container-batch-manifest": "batchManifestContainer",
    "batch-manifest": "batchManifest",
}
# Every other accepted spelling -> the console's name. ``object_manifest`` is how earlier
# configurations spelled it.
TYPE_ALIASES: dict[str, str] = {
    **{merritt: ours for ours, merritt in MERRITT_TYPES.items() if merritt != ours},
    "object_manifest": "object-manifest",
}

STORE_ACTIONS = ("add", "update")

# Merritt ingest's ``digestType`` (its door's form field, a batch's or job's configuration) is
# upper-cased and looked up among its DigestEnum's values (``MD5``, ``SHA-1``, ``SHA-256``,
# ``SHA-512``, ...; ``JobState.setHashAlgorithm``): the console's ``sha256`` names none of them.
# Its door then refuses the form; its consumers read no algorithm and fail the package's digest
# check (docs/merritt-services.md, "Digest names").
_SHA_DIGITS = re.compile(r"^sha(\d)")


def merritt_digest_type(alg: str) -> str:
    """The ``digestType`` form field Merritt's ingest knows for a digest algorithm as the console
    names it: ``md5`` -> ``md5``, ``sha256`` -> ``sha-256``."""
    return _SHA_DIGITS.sub(r"sha-\1", alg.strip().lower())


def merritt_digest_name(alg: str) -> str:
    """A digest algorithm, in the console's spelling or Merritt's, as Merritt's ingest writes it
    in a batch's or job's ``digestType``: its DigestEnum value (``md5`` -> ``MD5``, ``sha256``
    and ``sha-256`` -> ``SHA-256``)."""
    return merritt_digest_type(alg).upper()


def canonical_type(name: str) -> str:
    """The console's name for a submission type given in either spelling; ValueError if none."""
    text = (name or "").strip()
    if text in MERRITT_TYPES:
        return text
    if text in TYPE_ALIASES:
        return TYPE_ALIASES[text]
    raise ValueError(f"unknown submission type {name!r}")


def merritt_type(name: str) -> str:
    """Merritt ingest's package type name for a type given in either spelling."""
    return MERRITT_TYPES[canonical_type(name)]


def java_urlencode(text: str) -> str:
    """``text`` encoded as Java's ``URLEncoder.encode(text, "utf-8")`` does it.

    Java leaves letters, digits and ``.-*_`` alone and writes a space as ``+``; everything else,
    ``~`` included, is percent-encoded. ``ark:/13030/m5abc`` -> ``ark%3A%2F13030%2Fm5abc``.
    """
    return quote_plus(text, safe="*").replace("~", "%7E")


def java_urldecode(text: str) -> str:
    """The inverse, as Java's ``URLDecoder.decode(text, "utf-8")``: ``+`` is a space."""
    return unquote_plus(text)


def java_date_text(moment: datetime | None = None) -> str:
    """A date as ``java.util.Date#toString()`` writes it: ``Sat Nov 21 10:02:03 PST 2026``.

    Merritt's ingest puts a ``java.util.Date`` into the batch submission's ``submissionDate``,
    and org.json writes such a value with its ``toString()``.
    """
    moment = (moment or datetime.now()).astimezone()
    zone = moment.strftime("%Z") or moment.strftime("%z")
    return moment.strftime(f"%a %b %d %H:%M:%S {zone} %Y")


def iso_date_text(moment: datetime | None = None) -> str:
    """A date as Merritt's ``DateState.toString()`` writes it: ISO 8601 to the second with the
    zone's offset, ``2026-11-21T10:02:03-08:00`` (``+00:00`` in UTC, never ``Z``)."""
    return (moment or datetime.now()).astimezone().isoformat(timespec="seconds")


_JAVA_DATE = re.compile(
    r"[A-Z][a-z]{2} (?P<month>[A-Z][a-z]{2}) (?P<day>\d\d) (?P<time>\d\d:\d\d:\d\d) "
    r"(?P<zone>\S+) (?P<year>\d{4})"
)


def parse_submission_date(text: str) -> datetime | None:
    """A ``submissionDate`` in either form Merritt writes (ISO 8601, or ``java.util.Date``
    text); None for anything else. Java's zone abbreviations are ambiguous: ``UTC``/``GMT``
    and a numeric offset are understood, any other is taken as this machine's zone."""
    text = text.strip()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is not None:
        return aware(moment)
    found = _JAVA_DATE.fullmatch(text)
    if found is None:
        return None
    try:
        naive = datetime.strptime(
            f"{found['year']} {found['month']} {found['day']} {found['time']}", "%Y %b %d %H:%M:%S"
        )
    except ValueError:
        return None
    zone = found["zone"]
    if zone in ("UTC", "GMT", "Z"):
        return inside(naive.replace(tzinfo=UTC))
    offset = re.fullmatch(r"([+-])(\d\d):?(\d\d)", zone)
    if offset:
        sign = -1 if offset[1] == "-" else 1
        delta = timedelta(hours=int(offset[2]), minutes=int(offset[3]))
        return inside(naive.replace(tzinfo=timezone(sign * delta)))
    # Any other abbreviation (PST, CET, ...) cannot be told apart reliably: this machine's zone.
    return aware(naive)


def store_mode(ark: str, node: int | str, *, update: bool = False) -> str:
    """``store.mode`` as Merritt's ingest writes it: ``add/<node>/<url-encoded ark>``."""
    action = "update" if update else "add"
    return f"{action}/{storage_node_number(node)}/{java_urlencode(ark)}"


def store_node(
    *, manifest_url: str, ark: str, node: int | str, update: bool = False, delete: str = ""
) -> dict[str, str]:
    """The ``store`` node: ``{"manifest_url", "mode", "delete"}``, every value a string."""
    return {
        "manifest_url": manifest_url,
        "mode": store_mode(ark, node, update=update),
        "delete": delete,
    }


def inventory_manifest_url(storage_url: str, ark: str, node: int | str) -> str:
    """Where storage serves an object's manifest: ``<storage>/manifest/<node>/<encoded ark>``,
    without the storage URL's credentials (the URL goes into the job's ``inventory`` node)."""
    storage_url = url_without_credentials(storage_url)
    return f"{storage_url.rstrip('/')}/manifest/{storage_node_number(node)}/{java_urlencode(ark)}"


def inventory_node(*, storage_url: str, ark: str, node: int | str) -> dict[str, str]:
    """The ``inventory`` node: ``{"manifest_url": <the object's storage manifest>, "mode": ""}``."""
    return {"manifest_url": inventory_manifest_url(storage_url, ark, node), "mode": ""}


def storage_node_number(node: int | str) -> int:
    """A storage node as the integer Merritt's storage consumer parses; ValueError otherwise."""
    if isinstance(node, bool):
        raise ValueError(f"storage node {node!r} is not a number")
    try:
        number = int(str(node).strip())
    except ValueError:
        raise ValueError(f"storage node {node!r} is not a number") from None
    if number < 0:
        raise ValueError(f"storage node {node!r} is not a number")
    return number


@dataclass(frozen=True)
class StoreMode:
    action: str  # "add" | "update"
    node: int
    ark: str


def parse_store_mode(mode: object) -> StoreMode:
    """Read ``store.mode`` as Merritt's storage consumer does: split on ``/`` into an action, an
    integer node and a URL-decoded ARK. ValueError for anything it would refuse."""
    if not isinstance(mode, str):
        raise ValueError(f"store mode must be a string, got {mode!r}")
    parts = mode.split("/")
    if len(parts) != 3:
        raise ValueError(f"store mode {mode!r} is not <action>/<node>/<ark>")
    action, node, ark = parts
    if action not in STORE_ACTIONS:
        raise ValueError(f"store mode {mode!r}: action {action!r} is not add or update")
    try:
        number = int(node)
    except ValueError:
        raise ValueError(f"store mode {mode!r}: node {node!r} is not a number") from None
    decoded = java_urldecode(ark)
    if not decoded:
        raise ValueError(f"store mode {mode!r} names no object")
    return StoreMode(action, number, decoded)
