"""``bench/daemons.py --shipped --real`` measures the shipped command doing every step's own
work: the jobs its window counts were downloaded, stored and called back for, not moved on by a
no-op."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.daemons import CpuWindow, RealServices, Window, _table_line, main, run_shipped
from queues.chaos.servers import DepositorRoutes
from queues.services.zkserver import LocalZooKeeper


def test_the_real_run_downloads_stores_and_calls_back_for_its_jobs(
    zk_server: LocalZooKeeper,
) -> None:
    real = RealServices(512)
    kept: list[Path] = []
    try:
        run = run_shipped(zk_server.hosts, jobs=40, processes=1, seconds=120, real=real, keep=kept)
        assert run.window.transitions > 0
        # The server's request count and its time in fsync, read (mntr) at both ends.
        assert run.window.packets is not None and run.window.packets > 0
        assert run.window.fsync_ms is not None and run.window.fsync_ms >= 0
        # The window closes at 90% of the 280 transitions, and the process is stopped after
        # it: at least 30 jobs were past Storing then, and at least 12 Completed.
        assert real.storage.adds >= 30, _log_tail(kept)
        assert len(DepositorRoutes.callbacks) >= 12, _log_tail(kept)
        assert all(count >= 1 for count in DepositorRoutes.callbacks.values())
    finally:
        real.stop()
        for folder in kept:
            shutil.rmtree(folder, ignore_errors=True)


def _log_tail(kept: list[Path], lines: int = 80) -> str:
    """The end of the consumers' log, for a run that fell short: what they were waiting for."""
    text = "".join(p.joinpath("consumers.log").read_text(errors="replace") for p in kept)
    return "consumers.log ends:\n" + "\n".join(text.splitlines()[-lines:])


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--batch", "-1"], "--batch must be 0"),
        (["--real"], "--real is a way to run the shipped command"),
        (["--depositors", "8"], "--depositors is 1 to 250, with --shipped"),
        (["--shipped", "--depositors", "0"], "--depositors is 1 to 250"),
        (["--shipped", "--real", "--depositors", "8"], "--depositors is 1 to 250"),
    ],
)
def test_the_benchmark_refuses_bad_arguments_before_it_starts_anything(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_a_window_the_disk_held_says_so_beside_its_rate() -> None:
    """The largest share of a window the server spent in fsync is printed for each side: a run
    that moved little while the machine idled is told from one the clients held."""
    held = Window(5_000, 10.0, 2_000, CpuWindow([], 0.5, 0.08), fsync_ms=8_000)
    usual = Window(60_000, 10.0, 8_000, CpuWindow([], 6.0, 0.9), fsync_ms=300)
    unknown = Window(60_000, 10.0, None, CpuWindow([], 6.0, 0.9))
    assert held.fsync_share == pytest.approx(0.8)
    assert "server fsync 80% / 3%)" in _table_line(2, [usual, held], [usual])
    assert "server fsync ? / 3%)" in _table_line(2, [unknown], [usual])
