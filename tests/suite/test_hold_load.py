"""``bench/hold_load.py``, which holds the load for the suite's "at load 10" figure: it starts
busy-loops while the load is under its target, and a stop takes every one of them away."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[int]:
    found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in found]


def test_it_adds_loops_under_its_target_and_a_stop_ends_them_all() -> None:
    proc = subprocess.Popen(
        [sys.executable, "bench/hold_load.py", "--target", "1000", "--every", "0.1", "--most", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its loops in its process group: a failure kills them all
    )
    assert proc.stdout is not None
    try:
        # The load is far under 1,000: a loop a look, up to --most.
        for line in proc.stdout:
            if line.rstrip().endswith("loops 2"):
                break
        loops = _children(proc.pid)
        assert len(loops) >= 2  # the loops (and multiprocessing's own helper, if any)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0  # (its few lines fit the pipe)
        rest = proc.stdout.read()
        assert "mean load" in rest
        for pid in loops:  # checked before the clean-up below kills what is left
            assert not Path(f"/proc/{pid}").exists() or _state(pid) == "Z", f"loop {pid} runs"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_bad_argument_is_refused_with_the_reason() -> None:
    done = subprocess.run(
        [sys.executable, "bench/hold_load.py", "--every", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "--every must be positive" in done.stderr


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
