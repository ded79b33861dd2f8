"""Yes and no, whole numbers, and a number's range, in words: one reading and one wording for
every place that takes them from outside: the settings' variables (``mrtadmin/settings.py``), the
forms' fields (``queues/web/forms.py``), the commands' number options
(``management/commands/_base.py``), and what Merritt's services, depositors and files say; and
JSON from outside, nested no deeper than anything here needs, each key given once
(``json_within``)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})


def yes_or_no(text: str) -> bool | None:
    """True or False for one of the words (any case, spaces around), None for anything else."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    return None


# The largest size or count Merritt's Java services read (a ``long``) and the databases store.
LONG_MAX = 2**63 - 1

# The largest version ZooKeeper gives a node (a signed 32-bit ``int``): a version the console
# shows, and so one a request may expect, is a whole number from 0 to this; past it, it is a
# malformed request, not an item that "changed since".
VERSION_MOST = 2**31 - 1


def digits(text: str, most: int = 19) -> int | None:
    """The whole number ``text`` spells in 1 to ``most`` ASCII digits, None for anything else.
    ``str.isdigit`` alone lets "²" through to ``int``, which then raises; ``int`` and ``float``
    read other scripts' digits and spaces, which no format here allows; and past 4,300 digits
    ``int`` raises too."""
    if 0 < len(text) <= most and text.isascii() and text.isdigit():
        return int(text)
    return None


def within(number: float, low: float | None, high: float | None, *, above: bool = False) -> bool:
    """Whether ``number`` is finite, at least ``low`` (more than ``low`` with ``above``) and at
    most ``high``; a bound of None is no bound."""
    return (
        math.isfinite(number)
        and (low is None or (number > low if above else number >= low))
        and (high is None or number <= high)
    )


def range_words(kind: str, low: float | None, high: float | None, *, above: bool = False) -> str:
    """``kind`` with its range: "a whole number from 1 to 65,535", "a number above 0"."""

    def figure(x: float) -> str:
        return f"{x:,.0f}" if float(x).is_integer() else f"{x:g}"

    if low is None:
        return kind if high is None else f"{kind} of at most {figure(high)}"
    if high is None:
        return f"{kind} {'above' if above else 'of at least'} {figure(low)}"
    if above:
        return f"{kind} above {figure(low)} and at most {figure(high)}"
    return f"{kind} from {figure(low)} to {figure(high)}"


# How deep JSON from outside (an API request's body, a browser's socket message) may nest. None
# here needs more than 4 levels of lists and objects. Python's parser recurses once a level and
# fails at the interpreter's recursion limit (about 1,000) with a RecursionError, no ValueError,
# and a value it does take that deep fails again in whatever walks it recursively next.
JSON_DEPTH_MOST = 32

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NO_BRACKET = re.compile(r"[^\[\]{}]+")


class TooDeep(ValueError):
    """JSON nested deeper than ``json_within`` takes."""


class DuplicateKey(ValueError):
    """A JSON object that gives one key twice: which value is meant is not guessed (Python's
    parser kept the last, so ``{"priority": 9, "priority": 1}`` was priority 1)."""


def _one_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKey(f"key {key[:40]!r} twice in one object")
        seen[key] = value
    return seen


def _no_constant(name: str) -> Any:
    # NaN, Infinity and -Infinity: Python's parser takes them, JSON (RFC 8259) has no such value.
    raise ValueError(f"{name} is no JSON value")


def json_within(data: str | bytes, most: int = JSON_DEPTH_MOST) -> Any:
    """The JSON value of ``data`` (text, or bytes in an encoding ``json.loads`` reads), read from
    outside: a ValueError for anything that is no JSON, and ``TooDeep`` for lists and objects
    nested deeper than ``most``, found before the parser goes down (a 2 KB body of 1,000 "["
    raised RecursionError out of ``json.loads``, a 500); ``DuplicateKey`` for an object that
    gives a key twice; NaN and Infinity, which are no JSON, a ValueError too."""
    if isinstance(data, bytes):  # as json.loads decodes it
        data = data.decode(json.detect_encoding(data), "surrogatepass")
    text = data
    # No more opening brackets than ``most``, whatever their order, nest no deeper.
    if text.count("[") + text.count("{") > most:
        brackets = _NO_BRACKET.sub("", _JSON_STRING.sub("", text))
        # Each pass takes away the innermost pairs: a well-formed value no deeper than ``most``
        # is gone within ``most`` passes, each at the speed of str.replace.
        rest = brackets
        for _ in range(most):
            shorter = rest.replace("[]", "").replace("{}", "")
            if shorter == rest:
                break
            rest = shorter
        if rest:  # too deep, or no JSON: counted one by one, then
            depth = 0
            for bracket in brackets:
                depth += 1 if bracket in "[{" else -1
                if depth > most:
                    raise TooDeep(f"JSON nested deeper than {most} levels of lists and objects")
    return json.loads(text, object_pairs_hook=_one_each, parse_constant=_no_constant)
