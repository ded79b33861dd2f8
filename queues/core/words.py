"""Yes and no, whole numbers, and a number's range, in words: one reading and one wording for
every place that takes them from outside: the settings' variables (``mrtadmin/settings.py``), the
forms' fields (``queues/web/forms.py``), the commands' number options
(``management/commands/_base.py``), and what Merritt's services, depositors and files say."""

from __future__ import annotations

import math

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
