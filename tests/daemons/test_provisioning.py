"""Provisioning: throttle at the high-water mark, evaluate every waiting job each cycle."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest

from queues.daemons import provisioning
from queues.daemons.provisioning import IDLE_EVALUATION_GAP, Provisioning
from queues.zk.jobs import job_load
from tests.jobnodes import set_job_nodes

from .conftest import make_job

Usage = namedtuple("Usage", "total used free")


def _disk(used: int, total: int = 1000):
    return lambda _path: Usage(total, used, total - used)


def _job(zk, space: int, priority: int = 5):
    job = make_job(
        zk, {"payload_url": "http://x/a", "type": "file"}, state="Provisioning", priority=priority
    )
    return set_job_nodes(zk, job, space_needed=space)


class Counting(Provisioning):
    """Provisioning that counts its evaluations (each reads every waiting job)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.evaluations = 0

    def evaluate(self, jids: list[str]) -> None:
        self.evaluations += 1
        super().evaluate(jids)


def test_job_that_fits_goes_on_to_downloading(zk, settings: Any) -> None:
    settings.MRT_PROVISION_HIGH_WATER = 0.7
    job = _job(zk, 100)
    assert Provisioning(zk=zk, disk_usage=_disk(used=500)).run_once()
    assert job_load(zk, job.jid).state == "Downloading"


def test_job_that_does_not_fit_stays_and_smaller_ones_behind_it_go(zk, settings: Any) -> None:
    settings.MRT_PROVISION_HIGH_WATER = 0.7
    big = _job(zk, 300, priority=1)
    small = _job(zk, 100, priority=5)
    daemon = Provisioning(zk=zk, disk_usage=_disk(used=500))
    assert daemon.run_once()
    assert job_load(zk, small.jid).state == "Downloading"
    assert job_load(zk, big.jid).state == "Provisioning"
    assert job_load(zk, big.jid).lock is None
    # Nothing else fits: the cycle claims nothing, and the loop sleeps before the next.
    assert not daemon.run_once()


def test_jobs_already_downloading_count_against_the_mark(zk, settings: Any) -> None:
    settings.MRT_PROVISION_HIGH_WATER = 0.7
    first = _job(zk, 150)
    second = _job(zk, 150)
    daemon = Provisioning(zk=zk, disk_usage=_disk(used=500))
    daemon.run_once()
    daemon.run_once()
    states = sorted(job_load(zk, j.jid).state for j in (first, second))
    assert states == ["Downloading", "Provisioning"]


def test_waiting_job_goes_once_space_is_freed(zk, settings: Any) -> None:
    settings.MRT_PROVISION_HIGH_WATER = 0.7
    job = _job(zk, 0)
    full = Provisioning(zk=zk, disk_usage=_disk(used=800))
    assert not full.run_once()
    assert job_load(zk, job.jid).state == "Provisioning"
    freed = Provisioning(zk=zk, disk_usage=_disk(used=100))
    assert freed.run_once()
    assert job_load(zk, job.jid).state == "Downloading"


def test_one_evaluation_hands_out_every_job_that_fits(zk, settings: Any) -> None:
    """Waiting jobs are read once per cycle, not once per claim (N jobs, not N squared)."""
    settings.MRT_PROVISION_HIGH_WATER = 0.7
    fitting = [_job(zk, 50, priority=p) for p in (1, 2, 3)]
    too_big = _job(zk, 100, priority=4)  # 3 x 50 leave 50 of the 200 below the mark

    daemon = Counting(zk=zk, disk_usage=_disk(used=500))
    for _ in fitting:
        assert daemon.run_once()
    assert daemon.evaluations == 1
    assert [job_load(zk, j.jid).state for j in fitting] == ["Downloading"] * 3
    assert not daemon.run_once()
    assert job_load(zk, too_big.jid).state == "Provisioning"


def test_with_the_disk_full_arrivals_do_not_each_reread_every_waiting_job(
    zk, settings: Any
) -> None:
    settings.MRT_PROVISION_HIGH_WATER = 0.7
    for _ in range(3):
        _job(zk, 100)

    daemon = Counting(zk=zk, disk_usage=_disk(used=800))
    for _ in range(5):  # five wake-ups in a row, as five arrivals would cause
        assert daemon.claim() is None
    assert daemon.evaluations == 1
    daemon.evaluated_at -= IDLE_EVALUATION_GAP  # the gap has passed
    # Neither the disk nor the jobs Downloading changed: reading the jobs again would be polling.
    assert daemon.claim() is None
    assert daemon.evaluations == 1
    daemon.disk_usage = _disk(used=500)  # room for two of them
    assert daemon.claim() is not None
    assert daemon.evaluations == 2
    assert len(daemon.fitting) == 1 and len(daemon.unfit) == 1


def test_the_batched_loop_moves_every_job_that_fits_and_passes_over_the_rest(
    zk, settings: Any, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the batched loop, as ``runconsumer`` runs it: the jobs that fit go on in batches,
    ahead of them in run order a job that does not fit stays unlocked and unread after the
    evaluation."""
    settings.MRT_PROVISION_HIGH_WATER = 0.7
    monkeypatch.setattr(provisioning, "IDLE_EVALUATION_GAP", 3600.0)  # one evaluation
    big = _job(zk, 300, priority=1)
    small = [_job(zk, 10, priority=5) for _ in range(12)]
    asked: list[Any] = []

    def disk(path: Any) -> Usage:
        asked.append(path)
        return Usage(1000, 500, 500)

    daemon = Counting(zk=zk, disk_usage=disk, batch=8, poll=0.05)
    assert daemon.batched()
    loop = daemon.pipeline()
    loop.begin()
    try:
        for _ in range(50):
            if all(job_load(zk, j.jid).state == "Downloading" for j in small):
                break
            loop.turn()
        assert [job_load(zk, j.jid).state for j in small] == ["Downloading"] * 12
        assert job_load(zk, big.jid).state == "Provisioning"
        assert job_load(zk, big.jid).lock is None
        assert daemon.unfit == {big.jid}
        assert daemon.evaluations == 1
        # The disk asked twice by the evaluation (its room, its size), then once a job under
        # its lock: not again by the job's step for the size it had a moment before.
        assert len(asked) == 2 + len(small)
    finally:
        loop.end()


def test_a_job_larger_than_the_disk_can_ever_give_fails_saying_so(zk, settings: Any) -> None:
    """It would wait for ever, silently, with the jobs that fit going on around it."""
    settings.MRT_PROVISION_HIGH_WATER = 0.7
    huge = _job(zk, 800, priority=1)
    small = _job(zk, 100, priority=5)
    daemon = Provisioning(zk=zk, disk_usage=_disk(used=0))
    assert daemon.run_once()
    assert daemon.run_once()
    failed = job_load(zk, huge.jid)
    assert failed.state == "Failed"
    assert "needs 800 bytes of working disk, more than it can ever give one job (700 bytes" in (
        failed.status.message
    )
    assert job_load(zk, small.jid).state == "Downloading"
