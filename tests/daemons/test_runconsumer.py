"""``manage.py runconsumer``: names, --once exit codes, and SIGTERM in a real process."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from queues.daemons import runner
from queues.daemons.base import JobDaemon
from queues.daemons.registry import DAEMONS
from queues.daemons.runner import Host, daemon_threads
from queues.management.commands import runconsumer
from queues.zk import client as zkmod
from queues.zk.jobs import job_load

from .conftest import FileServer, make_job

# runconsumer checks that the database is migrated before it starts.
pytestmark = pytest.mark.django_db


def test_once_handles_one_item_and_exits_zero(zk, files: FileServer) -> None:
    first = make_job(zk, {"payload_url": files.put("a", "x"), "type": "file"})
    second = make_job(zk, {"payload_url": files.put("b", "y"), "type": "file"})
    call_command("runconsumer", "pending", "--once")
    zk = zkmod.client()  # the command closed the process's client on its way out
    states = sorted(job_load(zk, j.jid).state for j in (first, second))
    assert states == ["Estimating", "Pending"]


def test_once_exits_one_when_the_item_failed(zk) -> None:
    make_job(zk, {"payload_url": "http://x/a", "type": "folder"})  # no step can use it
    with pytest.raises(SystemExit) as exc:
        call_command("runconsumer", "pending", "--once")
    assert exc.value.code == 1


def test_once_with_nothing_to_do_exits_zero(zk) -> None:
    call_command("runconsumer", "all", "--once")


def test_unknown_daemon_is_refused(zk) -> None:
    with pytest.raises(CommandError):
        call_command("runconsumer", "nonsense", "--once")


def test_threads_run_that_many_copies_of_each_daemon(zk) -> None:
    host = Host("estimating", threads=3, poll=0.1)
    try:
        assert [d.name for d in host.daemons] == ["estimating"] * 3
        assert len({id(d) for d in host.daemons}) == 3
        assert {d.gate for d in host.daemons} == {host.gate}
    finally:
        host.close()
    everything = Host("all")
    try:
        assert {d.name for d in everything.daemons} == set(DAEMONS)
    finally:
        everything.close()


def test_every_job_step_runs_batched_by_default(zk) -> None:
    host = Host("all")
    try:
        batched = {d.name for d in host.daemons if isinstance(d, JobDaemon) and d.batched()}
        assert batched == {
            "pending",
            "estimating",
            "provisioning",
            "downloading",
            "processing",
            "storing",
            "recording",
            "notify",
        }
        sizes = {d.batch_size for d in host.daemons if d.name in batched}
        assert sizes == {settings.MRT_CLAIM_BATCH} == {32}
        short = [d for d in host.daemons if d.name in runner.BATCHED_STEPS]
        assert {d.name for d in short} == {"pending", "estimating", "provisioning", "notify"}
        keepers = {d.keeper for d in short}
        assert len(keepers) == 1 and None not in keepers  # one per process, shared
        # A claimed job never waits behind a step that grows with the object: those loops take
        # a job with its lock only when a thread would begin it soon, and claim no more than
        # their threads begin soon (test_long_steps).
        [keeper] = keepers
        long = {d.name: (d.keeper, d.workers) for d in host.daemons if d.name in runner.LONG_STEPS}
        assert long == {
            "downloading": (keeper, 4),  # MRT_DOWNLOAD_JOBS
            "processing": (keeper, 1),
            "storing": (keeper, 1),
            "recording": (keeper, 1),
        }
    finally:
        host.close()


def test_a_claim_batch_of_one_without_kept_locks_is_the_one_job_loop_everywhere(
    zk, settings
) -> None:
    settings.MRT_CLAIM_BATCH, settings.MRT_KEEP_LOCKS = 1, False
    settings.MRT_BATCH_LONG_STEPS = False
    plain = Host("all")
    try:
        assert not any(isinstance(d, JobDaemon) and d.batched() for d in plain.daemons)
    finally:
        plain.close()


def test_the_short_steps_loops_share_one_thread_a_copy_and_the_others_have_their_own(zk) -> None:
    host = Host("all", threads=2)
    stop = threading.Event()
    try:
        jobs = [d for d in host.daemons if isinstance(d, JobDaemon)]
        short = [d for d in jobs if d.batched() and not d.workers]
        long = [d for d in jobs if d.workers]
        # A long step's copies are its loop's threads: one loop of two.
        assert sorted((d.name, d.workers) for d in long) == [
            ("downloading", 4),
            ("processing", 2),
            ("recording", 2),
            ("storing", 2),
        ]
        shared = daemon_threads(host.daemons, stop, shared=True)
        names = [t.name for t in shared]
        # One thread for the first copy of every short batched step, one for the second; a
        # long step's loop has a thread of its own.
        assert sorted(n for n in names if n.startswith("batched-")) == ["batched-0", "batched-1"]
        assert len(shared) == len(host.daemons) - len(short) + 2
        assert not any(n.split("-")[0] in {"pending", "estimating", "notify"} for n in names)
        long_names = {"downloading", "processing", "storing", "recording"}
        assert {n.split("-")[0] for n in names} >= long_names
        each = daemon_threads(host.daemons, stop, shared=False)  # MRT_SHARED_LOOPS=0
        assert len(each) == len(host.daemons)
        assert not any(t.name.startswith("batched-") for t in each)
    finally:
        host.close()


def test_a_long_running_consumer_sets_the_garbage_collector_before_its_loops_start(
    zk, monkeypatch: pytest.MonkeyPatch
) -> None:
    done: list[str] = []
    monkeypatch.setattr(runconsumer, "tune_collector", lambda: done.append("collector set"))
    monkeypatch.setattr(Host, "run", lambda self, stop: done.append("loops run"))
    monkeypatch.setattr(runconsumer.Command, "_install_signals", lambda self, stop, timeout: None)
    call_command("runconsumer", "pending")
    assert done == ["collector set", "loops run"]
    done.clear()
    call_command("runconsumer", "all", "--once")  # one pass (scripts, tests): left alone
    assert done == []


def test_the_collector_leaves_what_a_started_consumer_holds_out_and_collects_less_often() -> None:
    script = (
        "import gc, os, django\n"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'mrtadmin.settings')\n"
        "django.setup()\n"
        "from queues.daemons.runner import COLLECTOR_THRESHOLDS, tune_collector\n"
        "before = gc.get_freeze_count()\n"
        "tune_collector()\n"
        "print(before, gc.get_freeze_count(), gc.get_threshold() == COLLECTOR_THRESHOLDS)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    assert out[0] == "0" and int(out[1]) > 10_000  # Django and every module: frozen
    assert out[2] == "True"


def test_with_noop_steps_every_job_step_moves_its_job_on_untouched(zk, settings) -> None:
    """MRT_NOOP_STEPS (bench/daemons.py --shipped): the loops as shipped, no step's work."""
    settings.MRT_NOOP_STEPS = True
    # A payload no step could use: only the loops and the moves run.
    job = make_job(zk, {"payload_url": "http://127.0.0.1:9/a", "type": "file"})
    host = Host("all", poll=0.1, record=False)
    try:
        steps = {d.name: d for d in host.daemons if isinstance(d, JobDaemon)}
        for name in ("pending", "estimating", "provisioning", "downloading", "processing"):
            steps[name].run_once()
        for name in ("storing", "recording", "notify"):
            steps[name].run_once()
        moved = job_load(zk, job.jid)
        assert moved.state == "Completed", moved.status.message
        assert moved.space_needed == 0 and moved.store is None  # nothing was worked on
    finally:
        host.close()
