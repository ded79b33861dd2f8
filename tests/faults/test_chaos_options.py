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


def test_with_every_fault_the_services_flap_first() -> None:
    """A flap's verdict needs requests made while it strikes; with every fault asked of a few
    hundred jobs, a flap whose turn came last struck after the last job had finished (seen:
    300 jobs, 20 strikes, "the fault never acted")."""
    from queues.chaos.engine import Options
    from queues.chaos.faults import Flap, schedule

    options = Options(
        ensemble=True,
        leader_kills=3,
        leader_storms=1,
        pauses=3,
        black_holes=2,
        db_outages=2,
        redis_stops=2,
        disk_fills=2,
        flaps=3,
    )
    plan = schedule(options.strikes())
    assert len(plan) == 20
    assert isinstance(plan[0].fault, Flap) and plan[0].share < 0.05
    assert sum(isinstance(strike.fault, Flap) for strike in plan) == 3


def test_each_strike_comes_with_a_wave_of_batches_of_its_own() -> None:
    """Strikes come one after another and each takes a while: spread over the share of the
    jobs finished, the later ones struck an idle queue when the faults were many and the jobs
    few. With a wave of batches a strike, submitted at its turn, each strikes once a third of
    its wave has finished; with fewer waves, a wave's strikes share its first two thirds."""
    from queues.chaos.engine import Options, _waves
    from queues.chaos.faults import schedule

    strikes = Options(ensemble=True, leader_kills=3, pauses=3, flaps=2, zk_restarts=2).strikes()
    plan = schedule(strikes, len(strikes))
    assert [strike.wave for strike in plan] == list(range(10))
    assert {round(strike.share, 6) for strike in plan} == {round(1 / 3, 6)}
    assert sorted(strike.fault.name for strike in plan) == sorted(f.name for f in strikes)

    plan = schedule(strikes[:6], 2)
    assert [strike.wave for strike in plan] == [0, 0, 0, 1, 1, 1]
    assert [round(strike.share * 9) for strike in plan] == [1, 3, 5, 1, 3, 5]

    # The batches in waves, in their order, as even as can be.
    assert _waves(list(range(7)), 3) == [[0, 1], [2, 3], [4, 5, 6]]
    assert _waves(list(range(2)), 1) == [[0, 1]]
