"""A short chaos run: consumers killed with SIGKILL and ZooKeeper restarted while 30 jobs go
through every daemon beside five hostile depositors; the run's own verdict must find nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MANAGE = Path(__file__).resolve().parents[2] / "manage.py"


@pytest.mark.slow
def test_thirty_jobs_survive_kills_and_a_zookeeper_restart(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ZK_HOSTS"}
    env["MRT_VAR_DIR"] = str(tmp_path / "var")  # the command's own settings, not the tests'
    result = subprocess.run(
        [
            sys.executable,
            str(MANAGE),
            "chaosrun",
            "--jobs",
            "30",
            "--batches",
            "3",
            "--consumers",
            "2",
            "--zk-restarts",
            "1",
            "--kill-every",
            "2",
            "5",
            "--timeout",
            "300",
            "--seed",
            "7",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "VERDICT: OK" in output
    assert "SIGKILL" in output
    # Hostile depositors ran among the good jobs (chaosrun's default) and each failed for its
    # own reason: the verdict checks each of them, and the refused address was never asked.
    assert "hostile depositors: 5 failed for their reasons, the refused address asked 0" in output
