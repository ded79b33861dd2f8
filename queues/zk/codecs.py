"""Node encodings of the contract: compact JSON, plain integers, raw strings, empty markers.

Decoders raise MalformedNode naming the path, so a caller can show the bad node instead of
crashing on it.
"""

import contextlib
import json
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from queues.core.moments import aware, inside

from .errors import MalformedNode

TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S %z"


_last_stamp: tuple[int, str] = (-1, "")  # the current second and its stamp


def now_stamp(moment: datetime | None = None) -> str:
    """Local time in the contract's format, e.g. ``2026-11-21 10:02:03 -0800``.

    The format counts whole seconds, so the current time's stamp is made once a second (a
    consumer moving thousands of jobs a second stamps every one)."""
    global _last_stamp
    if moment is not None:
        return moment.astimezone().strftime(TIMESTAMP_FORMAT)
    second = int(time.time())
    last = _last_stamp
    if last[0] != second:
        last = (second, datetime.fromtimestamp(second).astimezone().strftime(TIMESTAMP_FORMAT))
        _last_stamp = last
    return last[1]


_ZONES: dict[int, timezone] = {}  # quarter hour since the epoch -> the local zone's offset then
_QUARTER = 900


def local_time(seconds: float | None = None) -> datetime:
    """``seconds`` since the epoch (now when None) as an aware local datetime, as
    ``datetime.fromtimestamp(seconds, UTC).astimezone()`` gives it.

    That looks the local zone up for every call, which a consumer reading and moving thousands
    of jobs a second (a node's mtime, a moved status) pays per job. Every zone changes its
    offset on a quarter hour, so the offset is looked up once per quarter hour met."""
    if seconds is None:
        seconds = time.time()
    quarter = int(seconds // _QUARTER)
    zone = _ZONES.get(quarter)
    if zone is None:
        found = datetime.fromtimestamp(quarter * _QUARTER, UTC).astimezone().tzinfo
        zone = found if isinstance(found, timezone) else timezone(timedelta(0))
        if len(_ZONES) > 4096:
            _ZONES.clear()
        _ZONES[quarter] = zone
    return datetime.fromtimestamp(seconds, zone)


def parse_stamp(value: Any) -> datetime | None:
    """Parse a contract timestamp; None for anything unparseable (never raises)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return inside(datetime.strptime(value, TIMESTAMP_FORMAT))
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return aware(parsed)


# json.dumps with any option makes a new encoder at every call, and an encoder makes its C
# encoding function again at every call as well; a consumer encodes a status a transition. The
# C function is made once (no circular-reference check: a value with a cycle ends in a
# RecursionError instead of a ValueError) and keeps no state between calls.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_MAKE_C_ENCODER = getattr(json.encoder, "c_make_encoder", None)  # None without the C module
_C_ENCODE = (
    None
    if _MAKE_C_ENCODER is None
    else _MAKE_C_ENCODER(
        None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, True
    )
)


def encode_json(value: dict[str, Any]) -> bytes:
    if _C_ENCODE is None:
        return _ENCODER.encode(value).encode("utf-8")
    return "".join(_C_ENCODE(value, 0)).encode("utf-8")


def decode_json(path: str, data: bytes | None) -> dict[str, Any]:
    if not data:
        raise MalformedNode(path, "empty, expected a JSON object")
    try:
        value = json.loads(data.decode("utf-8"))
    # RecursionError: nesting deeper than the decoder goes, as garbage from another client may be.
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedNode(path, f"not valid JSON ({str(exc)[:200]})") from exc
    if not isinstance(value, dict):
        raise MalformedNode(path, f"expected a JSON object, found {type(value).__name__}")
    if b"\\u" in data and not _is_text(value):
        raise MalformedNode(path, "a string holds a lone surrogate escape (\\ud800-\\udfff)")
    return value


def _is_text(value: Any) -> bool:
    """Whether every string of a decoded JSON value is text UTF-8 can hold: an escape such as
    ``"\\ud800"`` alone is valid JSON but no character, and the value could not be written back
    (or put in a page, a path or a log) without failing there. Only asked when the node holds an
    escape at all."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def encode_int(value: int) -> bytes:
    return str(int(value)).encode("ascii")


def decode_int(
    path: str, data: bytes | None, least: int | None = None, most: int | None = None
) -> int:
    """An integer node; MalformedNode when it is none, or outside ``least``..``most`` (a
    priority of 100, a size past what a 64-bit counter holds: another client may write them,
    and a reader that took them would fail later, in a path or an array)."""
    text = (data or b"").decode("utf-8", errors="replace").strip()
    value = None
    # ``int`` would take other scripts' digits and 4,300 of them; no integer here has 40.
    if len(text) <= 40 and text.isascii():
        with contextlib.suppress(ValueError):
            value = int(text)
    if value is None:
        raise MalformedNode(path, f"expected an integer, found {text[:40]!r}")
    if (least is not None and value < least) or (most is not None and value > most):
        raise MalformedNode(path, f"{value} is outside {least}..{most}")
    return value


def encode_str(value: str) -> bytes:
    return value.encode("utf-8")


def decode_str(path: str, data: bytes | None) -> str:
    try:
        return (data or b"").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedNode(path, "not UTF-8 text") from exc


def decode_any(data: bytes | None) -> Any:
    """Best-effort decoding for dumps: JSON, else text, else a byte count."""
    if not data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(data)} bytes of binary data>"
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return value if "\\u" not in text or _is_text(value) else text
