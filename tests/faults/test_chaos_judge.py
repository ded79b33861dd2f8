"""The chaos run's judge against a real ZooKeeper and its storage stand-in over HTTP: what it
must call a violation (a lock a live consumer holds past the grace, a job stuck, a second
version of the same content, a job failed by the infrastructure, a Completed job never called
back), and what it must not."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import requests

from queues.chaos import judge
from queues.chaos.engine import Throughput
from queues.chaos.standins import StorageStandIn
from queues.zk import batches, jobs, paths
from queues.zk.consumers import CONSUMERS
from queues.zk.records import Job

CONFIGURATION = {
    "profile": "merritt_demo_content",
    "payload_url": "http://127.0.0.1:1/f.txt",
    "type": "file",
}


def a_job(zk: Any, local_id: str) -> Job:
    batch = batches.batch_create(zk, submission={**CONFIGURATION, "submitter": "chaos"})
    return jobs.job_create(zk, bid=batch.bid, configuration={**CONFIGURATION, "localID": local_id})


def test_a_lock_held_past_the_grace_by_a_live_consumer_is_an_orphan(zk: Any, other_zk: Any) -> None:
    job = jobs.job_transition(zk, a_job(zk, "chaos-1"), "Estimating")
    other_zk.create(f"{CONSUMERS}/host-4242", b"{}", ephemeral=True, makepath=True)
    other_zk.create(paths.job_node(job.jid, "lock"), b"", ephemeral=True)
    verdict, said = judge.Verdict(), []
    judge.wait_for_locks(zk, verdict, until=time.monotonic(), say=said.append)
    [violation] = verdict.violations
    assert violation.startswith(f"lock left after the grace: {paths.job_node(job.jid, 'lock')}")
    assert "(consumer host-4242, still running)" in violation
    judge.judge_stuck(zk, verdict)
    assert f"stuck: job {job.jid} (chaos-1) still Estimating, locked for" in verdict.violations[1]


def test_a_lock_released_within_the_grace_is_no_violation(zk: Any, other_zk: Any) -> None:
    job = a_job(zk, "chaos-2")
    lock = paths.job_node(job.jid, "lock")
    other_zk.create(lock, b"", ephemeral=True)
    released = threading.Timer(1.0, other_zk.delete, args=(lock,))
    released.start()
    verdict, said = judge.Verdict(), []
    judge.wait_for_locks(zk, verdict, until=time.monotonic() + 30, say=said.append)
    released.join()
    assert verdict.violations == []
    assert said == ["locks after the grace: 0"]


def test_two_adds_of_the_same_manifest_are_two_versions_and_a_violation(add_manifest: str) -> None:
    storage = StorageStandIn().start()
    try:
        for _ in range(2):
            answer = requests.post(
                f"{storage.url}/add/9501/ark%3A%2F99999%2Ffk4one",
                data={"manifest": add_manifest, "t": "xml"},
                timeout=10,
            )
            assert answer.ok, answer.text
        state = requests.get(f"{storage.url}/state/9501/ark%3A%2F99999%2Ffk4one", timeout=10)
        assert "<obj:numVersions>2</obj:numVersions>" in state.text
    finally:
        storage.stop()
    verdict, said = judge.Verdict(), []
    judge.judge_versions(storage.versions(), verdict, said.append)
    assert verdict.violations == [
        "storage: ark:/99999/fk4one has 2 versions (identical content); expected one"
    ]
    assert said == ["storage: 1 objects, 1 extra versions"]


def test_progress_counts_the_good_batches_finished_jobs_only(zk: Any) -> None:
    """A strike waits for good jobs to finish and counts the good jobs in flight: a hostile
    depositor's job failing (or one still failing slowly) must not stand in for them."""
    good = jobs.job_transition(zk, a_job(zk, "chaos-good-1"), "Estimating")
    jobs.job_transition(zk, good, "Failed", message="estimating: HTTP 404 from depositor")
    waiting = jobs.job_transition(zk, a_job(zk, "chaos-good-2"), "Estimating")
    hostile = jobs.job_transition(zk, a_job(zk, "chaos-hostile-1"), "Estimating")
    jobs.job_transition(zk, hostile, "Failed", message="downloading: too large")
    slow = jobs.job_transition(zk, a_job(zk, "chaos-hostile-2"), "Estimating")
    expected = {j.bid: {"x"} for j in (good, waiting, hostile, slow)}
    progress = judge.progress(zk, expected, {hostile.bid, slow.bid})
    assert progress is not None
    finished, done, line, counts = progress
    assert finished == 1  # the good one; the hostile one's Failed is left out
    assert done == set()  # no batch of them moved to a finished state
    assert counts["Failed"] == 2 and counts["Estimating"] == 2  # the line counts every job
    assert line.startswith("jobs: 0 Completed, 2 Failed, Estimating 2 |")
    everything = judge.progress(zk, expected)
    assert everything is not None and everything[0] == 2


def test_a_job_failed_by_the_database_is_failed_by_the_infrastructure(zk: Any) -> None:
    job = jobs.job_transition(zk, a_job(zk, "chaos-3"), "Estimating")
    jobs.job_transition(zk, job, "Failed", message="recording: database is locked")
    depositor = jobs.job_transition(zk, a_job(zk, "chaos-4"), "Estimating")
    jobs.job_transition(zk, depositor, "Failed", message="estimating: HTTP 404 from depositor")
    verdict, said = judge.Verdict(), []
    judge.judge_failures(judge.load_jobs(zk, verdict), verdict, said.append)
    assert sorted(verdict.violations) == [
        f"failed by the infrastructure: job {job.jid} (chaos-3): 'recording: database is locked'",
        f"good job {depositor.jid} (chaos-4) failed: 'estimating: HTTP 404 from depositor'",
    ]
    assert said == ["good jobs failed by the infrastructure: 1"]


def test_a_completed_job_without_its_callback_or_its_key_is_a_violation_a_repeat_a_figure(
    zk: Any,
) -> None:
    called, twice, silent, unkeyed, rekeyed = (a_job(zk, f"chaos-{n}") for n in range(5, 10))
    for job in (called, twice, silent, unkeyed, rekeyed):
        for state in ("Estimating", "Provisioning", "Downloading", "Processing", "Storing"):
            job = jobs.job_transition(zk, job, state)
        for state in ("Recording", "Notify", "Completed"):
            job = jobs.job_transition(zk, job, state)
    posts = Counter({called.jid: 1, twice.jid: 2, unkeyed.jid: 1, rekeyed.jid: 2})
    keys = {
        called.jid: {f"{called.jid}.0.completed"},
        twice.jid: {f"{twice.jid}.0.completed"},  # a repeat the receiver drops by its key
        unkeyed.jid: {""},
        rekeyed.jid: {f"{rekeyed.jid}.0.completed", f"{rekeyed.jid}.1.completed"},
    }
    verdict, said = judge.Verdict(), []
    judge.judge_callbacks(zk, judge.load_jobs(zk, verdict), posts, verdict, said.append, keys)
    assert verdict.violations == [
        f"job {silent.jid} Completed without its callback",
        f"job {unkeyed.jid}: a callback without its delivery key",
        f"job {rekeyed.jid}: one outcome delivered under 2 keys",
    ]
    assert said == [
        "callbacks: 5 Completed jobs called back, 2 posted more than once (6 posts, 4 by key); "
        "0 callback records left"
    ]


def test_the_throughput_is_measured_to_the_last_job_finished_and_over_the_last_minute() -> None:
    meter = Throughput(100.0)
    for second, finished in ((110.0, 5), (160.0, 20), (200.0, 40), (260.0, 40)):
        meter.add(second, finished)
    # 40 jobs by 200 s of a run begun at 100 s: the 60 s after the last one do not count.
    assert meter.summary() == "40 jobs in 100s, 0.40 jobs/s"
    # Over the run, and over the last minute from the last sample at or before its start
    # (160 s to 260 s: 20 jobs), with the time the rest would take at that pace.
    assert meter.line(50) == "0.25 jobs/s (0.20 over the last minute, ~50s to go)"
    meter.add(270.0, 43)  # 200 s to 270 s: 3 jobs
    assert meter.line(50) == "0.25 jobs/s (0.04 over the last minute, ~163s to go)"


def test_a_fault_that_never_heals_fails_the_run_instead_of_holding_it(
    monkeypatch: Any, tmp_path: Any
) -> None:
    """A run that ended (here: at once, as a stalled one does) waits a bounded time for the
    fault being caused to heal, then fails on it with its name: a fault stuck on a server that
    never serves again held a chaos run without a verdict."""
    import random
    from pathlib import Path

    from queues.chaos import engine
    from queues.chaos.faults import Fault, FaultLog, Stage, schedule

    began, release = threading.Event(), threading.Event()

    class Stuck(Fault):
        name = "stuck fault"

        def strike(self, stage: Stage) -> None:
            began.set()
            release.wait(60)

    lines: list[str] = []
    run = engine.Run(
        options=engine.Options(), say=lines.append, manage=Path("manage.py"), scratch=tmp_path
    )
    run.log = FaultLog(lines.append)
    run.stage = Stage(consumers=[], rng=random.Random(1), log=run.log, session_timeout=4.0)
    monkeypatch.setattr(engine, "FAULT_END_WAIT", 0.5)

    def watch(_zk: Any, _expected: Any, total: int, finished: list[int], _striking: Any) -> None:
        finished[0] = total  # every job finished: the fault strikes, and the run ends
        assert began.wait(10)

    monkeypatch.setattr(run, "_watch", watch)
    try:
        expected = {"bid0000000001": {"jid0000000001"}}
        run._chaos(None, expected, 1, schedule([Stuck(0.0)]), [1], lambda _wave: None)
    finally:
        release.set()
    assert any("stuck fault did not end within" in line for line in run.verdict.violations)
