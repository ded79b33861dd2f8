"""A short chaos run: consumers killed with SIGKILL and ZooKeeper restarted (for less than the
session timeout) while 30 jobs go through every daemon beside the hostile depositors; the run's
own verdict must find nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from queues.chaos.depositors import HOSTILE
from tests.workers import with_ports

MANAGE = Path(__file__).resolve().parents[2] / "manage.py"
# The transaction-log judge's figures when ZooKeeper's own log shows nothing wrong.
CLEAN_TXNLOG = (
    "non-owner deletes 0, deletes of absent locks 0, locks over live locks 0, unfenced job writes 0"
)


# A guard against a hung process only: the run ends itself, failed as stalled, when nothing moves
# for its --stall seconds, however slow the machine.
HANG_GUARD = 3600


@pytest.fixture
def chaos(request: pytest.FixtureRequest) -> str:
    """``--chaos``: ``small`` in CI, ``full`` from ``bin/run-chaos``; a test marked ``chaos`` is
    left out of a run without ``--chaos`` (tests/markers.py)."""
    return str(request.config.getoption("chaos"))


def sized(chaos: str, small: object, full: object) -> str:
    """A chaos run's argument at the size asked for."""
    return str(full if chaos == "full" else small)


def chaosrun(tmp_path: Path, *arguments: str, timeout: float = HANG_GUARD) -> str:
    """``manage.py chaosrun`` with its own settings (not the tests') and ports of its own
    (``tests/workers.py``); its whole output."""
    env = {k: v for k, v in os.environ.items() if k != "ZK_HOSTS"}
    env["MRT_VAR_DIR"] = str(tmp_path / "var")
    result = subprocess.run(
        with_ports([sys.executable, str(MANAGE), "chaosrun", *arguments]),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "VERDICT: OK" in output, output[-6000:]
    return output


@pytest.mark.chaos
@pytest.mark.zookeeper
@pytest.mark.slow
@pytest.mark.timeout(HANG_GUARD)
def test_thirty_jobs_survive_kills_and_a_zookeeper_restart(tmp_path: Path) -> None:
    output = chaosrun(
        tmp_path,
        *("--jobs", "30", "--batches", "3", "--consumers", "2", "--zk-restarts", "1"),
        *("--kill-every", "2", "5", "--stall", "120", "--seed", "7"),
    )
    assert "SIGKILL" in output
    assert "1 x ZooKeeper restart" in output
    assert "faults struck with jobs in flight: 1 of 1" in output
    # Hostile depositors ran among the good jobs (chaosrun's default) and each failed for its
    # own reason: the verdict checks each of them, and the refused address was never asked.
    assert (
        f"hostile depositors: {len(HOSTILE)} of {len(HOSTILE)} failed for their reasons, "
        "the refused address asked 0 times"
    ) in output
    assert "storage: 30 objects, 0 extra versions" in output
    assert "callbacks: 30 Completed jobs called back" in output  # each at least once
    # ZooKeeper's own log of the run, replayed: no lock taken from its owner, no job written
    # by a consumer not holding its lock; and the run says how fast it went.
    assert CLEAN_TXNLOG in output
    assert "throughput: 30 jobs in" in output  # the good batches' jobs; the hostile ones apart
