"""``chaosrun``'s numbers are checked before a run starts: a run of "nan" seconds never ended,
one of -5 never struck."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--stall", "nan", "a number above 0"),
        ("--stall", "0", "a number above 0"),
        ("--kill-every", "-1", "a number above 0"),
        ("--pause-seconds", "1e400", "a number from 0 to 86,400"),
        ("--jobs", "0", "a whole number from 1 to"),
        ("--zk-restarts", "-2", "a whole number from 0 to"),
        ("--zk-port", "70000", "a whole number from 0 to 65,535"),
    ],
)
def test_an_odd_number_is_refused_naming_its_option(option: str, value: str, said: str) -> None:
    arguments = [option, value] + (["3"] if option == "--kill-every" else [])
    with pytest.raises(CommandError, match=f"argument {option}: must be {said}"):
        call_command("chaosrun", *arguments)
