"""A step that waits on servers outside runs in threads of its own (``steps_elsewhere``), one
server's jobs one after another: a depositor's callback receiver or host that does not answer
holds up its own jobs only, not another depositor's jobs of the same step nor the other batched
steps sharing the loops' thread, as ``runconsumer`` runs them by default."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

import pytest
from kazoo.client import KazooClient

from queues.daemons import pipeline
from queues.daemons.estimating import Estimating
from queues.daemons.job_pending import JobPending
from queues.daemons.notify import Notify
from queues.daemons.pipeline import LockKeeper
from queues.daemons.runner import daemon_threads
from queues.zk import paths as zpaths
from queues.zk.jobs import job_load
from queues.zk.records import Job
from queues.zk.side_effects import callback_record_path

from .conftest import FileServer, expire_session, make_job, object_manifest, wait_for
from .test_batched import Step1
from .test_notify import _with_callback

pytestmark = pytest.mark.django_db(transaction=True)


def _jobs(zk: KazooClient, files: FileServer, state: str, n: int) -> list[Job]:
    return [
        make_job(
            zk, {"payload_url": files.put(f"{state}{i}", b"x" * 10), "type": "file"}, state=state
        )
        for i in range(n)
    ]


def test_a_silent_callback_receiver_holds_up_only_notify(
    zk: KazooClient, files: FileServer, profiles: Path
) -> None:
    _with_callback(profiles, files.url + "/hook")
    called = _jobs(zk, files, "Notify", 2)
    held = threading.Event()
    answer = threading.Event()

    def silent(_route: str) -> None:
        held.set()
        assert answer.wait(60), "the test did not let the receiver answer"

    files.on_post = silent
    estimated: list[Job] = []
    keeper = LockKeeper()
    loops = [cls(zk=zk, poll=0.05, batch=4, keeper=keeper) for cls in (Estimating, Notify)]
    stop = threading.Event()
    (thread,) = daemon_threads(loops, stop, shared=True)  # both loops in one thread
    thread.start()
    try:
        assert held.wait(30), "no callback was posted"
        # The receiver holds the first callback; jobs reaching Estimating meanwhile go through
        # the same thread's other loop.
        estimated += _jobs(zk, files, "Estimating", 3)
        wait_for(lambda: all(job_load(zk, j.jid).state == "Provisioning" for j in estimated))
        assert len(files.posts) == 1, "the receiver still holds the first callback"
        assert [job_load(zk, j.jid).state for j in called] == ["Notify", "Notify"]
        answer.set()
        wait_for(lambda: all(job_load(zk, j.jid).state == "Completed" for j in called))
        assert sorted(path.rpartition("/")[2] for path, _body in files.posts) == sorted(
            j.jid for j in called
        )
    finally:
        answer.set()
        stop.set()
        thread.join(60)
    assert not thread.is_alive()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("notify-step")]
    for job in called + estimated:
        assert zk.exists(zpaths.job_node(job.jid, "lock")) is None


def _run(daemons: list, stop: threading.Event) -> threading.Thread:
    (thread,) = daemon_threads(daemons, stop, shared=True)
    thread.start()
    return thread


def test_a_session_lost_while_the_step_thread_posts_is_not_a_second_callback(
    zk: KazooClient, zk_hosts: str, own_zk, files: FileServer, profiles: Path
) -> None:
    client, gate = own_zk
    _with_callback(profiles, files.url + "/hook")
    jobs = _jobs(zk, files, "Notify", 2)
    old = client.client_id[0]

    def lose_the_session(_route: str) -> None:
        # The receiver has the first callback; its answer has not reached the consumer.
        files.on_post = None
        expire_session(client, zk_hosts)
        wait_for(lambda: client.connected and client.client_id[0] != old, timeout=30)

    files.on_post = lose_the_session
    stop = threading.Event()
    thread = _run([Notify(zk=client, gate=gate, poll=0.05, batch=4)], stop)
    try:
        # The batch's move is refused with the old session's locks; the loop claims the jobs
        # again in its new session, finds both callbacks delivered and moves them on.
        wait_for(lambda: all(job_load(zk, j.jid).state == "Completed" for j in jobs))
    finally:
        stop.set()
        thread.join(60)
    assert gate.generation == 1
    assert sorted(path.rpartition("/")[2] for path, _body in files.posts) == sorted(
        j.jid for j in jobs
    )
    for job in jobs:
        assert job_load(zk, job.jid).lock is None
        assert zk.exists(callback_record_path(job.jid)) is None


class Elsewhere(Step1):
    """Estimating -> Provisioning in the step thread; its preparation of one job breaks (in
    the step thread, or in the loops' own with ``steps_elsewhere`` False)."""

    steps_elsewhere: ClassVar[bool] = True
    broken = ""

    def prepare(self, item: Job) -> Job:
        if item.jid == self.broken:
            raise RuntimeError("a bug in the step")
        return item


@pytest.mark.parametrize("elsewhere", [True, False], ids=["step-thread", "loops-thread"])
def test_a_step_raising_gives_back_its_job_only(
    zk: KazooClient, files: FileServer, caplog, elsewhere: bool
) -> None:
    jobs = _jobs(zk, files, "Estimating", 3)
    daemon = type("Broken", (Elsewhere,), {"steps_elsewhere": elsewhere, "broken": jobs[1].jid})
    stop = threading.Event()
    thread = _run([daemon(zk=zk, poll=0.05, batch=4)], stop)
    try:
        wait_for(lambda: job_load(zk, jobs[0].jid).state == "Provisioning")
        wait_for(lambda: job_load(zk, jobs[2].jid).state == "Provisioning")
        wait_for(lambda: "unexpected error in the step of " + jobs[1].jid in caplog.text)
        # The loop goes on cycling (a job made now is taken and moved) without the broken one.
        (later,) = _jobs(zk, files, "Estimating", 1)
        wait_for(lambda: job_load(zk, later.jid).state == "Provisioning")
    finally:
        stop.set()
        thread.join(60)
    broken = job_load(zk, jobs[1].jid)
    assert (broken.state, broken.lock) == ("Estimating", None)  # left for a fixed consumer
    assert "a bug in the step" in caplog.text
    # Passed over afterwards (STEP_ERROR_PAUSE), not claimed and failing again at once.
    assert caplog.text.count("unexpected error in the step of") == 1


def test_a_silent_manifest_host_holds_up_only_pending(zk: KazooClient, files: FileServer) -> None:
    files.put("a", b"payload")
    manifest = files.put("m.checkm", object_manifest([{"url": files.url + "/a", "filename": "a"}]))
    fetching = make_job(zk, {"payload_url": manifest, "type": "object-manifest"}, state="Pending")
    estimated = _jobs(zk, files, "Estimating", 3)
    held = threading.Event()
    answer = threading.Event()

    def silent(method: str, route: str) -> None:
        if route == "/m.checkm":
            held.set()
            assert answer.wait(60), "the test did not let the host answer"
        elif method == "HEAD":
            # Estimating's jobs are looked at once the manifest is held, so their moves need
            # the loops' thread while pending's step waits.
            assert held.wait(30), "the manifest was not fetched"

    files.before_answer = silent
    keeper = LockKeeper()
    loops = [cls(zk=zk, poll=0.05, batch=4, keeper=keeper) for cls in (JobPending, Estimating)]
    stop = threading.Event()
    thread = _run(loops, stop)
    try:
        wait_for(lambda: all(job_load(zk, j.jid).state == "Provisioning" for j in estimated))
        assert job_load(zk, fetching.jid).state == "Pending"
        answer.set()
        wait_for(lambda: job_load(zk, fetching.jid).state == "Provisioning")
    finally:
        answer.set()
        stop.set()
        thread.join(60)
    assert not thread.is_alive()
    for job in [fetching, *estimated]:
        assert zk.exists(zpaths.job_node(job.jid, "lock")) is None


def test_a_silent_host_holds_up_only_its_own_jobs(
    zk: KazooClient, files: FileServer, other_files: FileServer, settings, monkeypatch, caplog
) -> None:
    settings.MRT_HTTP_TIMEOUT = 60.0  # the host is let answer before the HEAD times out
    monkeypatch.setattr(pipeline, "SERVER_SLOW", 0.5)
    monkeypatch.setattr(pipeline, "SERVER_SLOW_PAUSE", 1.0)
    # The depositor's URLs carry a password (sent as HTTP Basic authentication): the log line
    # that names a URL found slow shows it as ***.
    silent_jobs = [
        make_job(
            zk,
            {
                "payload_url": files.put(f"Estimating{i}", b"x" * 10).replace(
                    "http://", "http://depositor:s3cret@"
                ),
                "type": "file",
            },
            state="Estimating",
        )
        for i in range(4)
    ]
    parts = urlsplit(files.url)
    server = f"{parts.hostname}:{parts.port}"
    held = threading.Event()
    answer = threading.Event()
    lock = threading.Lock()
    at_once = [0, 0]  # HEADs under way at the silent host, and the most at one time

    def silent(method: str, _route: str) -> None:
        if method != "HEAD":
            return
        with lock:
            at_once[0] += 1
            at_once[1] = max(at_once)
        held.set()
        try:
            assert answer.wait(60), "the test did not let the host answer"
        finally:
            with lock:
                at_once[0] -= 1

    files.before_answer = silent
    stop = threading.Event()
    thread = _run([Estimating(zk=zk, poll=0.05, batch=2)], stop)
    others: list[Job] = []
    try:
        assert held.wait(30), "the silent host was not asked"
        # Its first steps are set aside one after another until none of its URLs has answered
        # ASIDE_IN_A_ROW times in a row; then the step in its lane is waited for, and once that
        # one is found slow, the host is: its task not begun is given back, its jobs are passed
        # over, and another depositor's jobs go through meanwhile.
        wait_for(lambda: f"estimating: {server} has not answered a step for" in caplog.text)
        assert f"estimating: http://depositor:***@{server}/Estimating" in caplog.text
        assert "s3cret" not in caplog.text
        others += _jobs(zk, other_files, "Estimating", 3)
        wait_for(lambda: all(job_load(zk, j.jid).state == "Provisioning" for j in others))
        assert {job_load(zk, j.jid).state for j in silent_jobs} == {"Estimating"}
        answer.set()
        wait_for(lambda: all(job_load(zk, j.jid).state == "Provisioning" for j in silent_jobs))
    finally:
        answer.set()
        stop.set()
        thread.join(60)
    assert not thread.is_alive()
    # Its lane's step, and the steps set aside before the host was found not to answer at all.
    assert at_once[1] == 1 + pipeline.ASIDE_IN_A_ROW
    assert all(files.hits("HEAD", f"Estimating{i}") == 1 for i in range(4))
    for job in silent_jobs + others:
        assert zk.exists(zpaths.job_node(job.jid, "lock")) is None


def test_a_stop_waits_for_the_step_under_way_and_begins_no_more(
    zk: KazooClient, files: FileServer, profiles: Path
) -> None:
    _with_callback(profiles, files.url + "/hook")
    jobs = _jobs(zk, files, "Notify", 2)  # one batch, one receiver: one task
    held = threading.Event()
    answer = threading.Event()
    files.on_post = lambda _route: (held.set(), answer.wait(60))
    stop = threading.Event()
    thread = _run([Notify(zk=zk, poll=0.05, batch=4)], stop)
    try:
        assert held.wait(30), "no callback was posted"
        stop.set()  # the weekly redeploy, while the receiver holds the first callback
        threading.Timer(0.5, answer.set).start()
        thread.join(60)
        assert not thread.is_alive()
    finally:
        answer.set()
        stop.set()
        thread.join(60)
    # The callback under way was answered and its job moved on; the other job's step did not
    # begin, so the stop did not wait for a second receiver's answer.
    ((posted, _body),) = files.posts
    for job in jobs:
        found = job_load(zk, job.jid)
        expected = "Completed" if posted.endswith(job.jid) else "Notify"
        assert (found.state, found.lock) == (expected, None)
        assert zk.exists(callback_record_path(job.jid)) is None


def test_a_busy_host_that_answers_is_not_passed_over(zk: KazooClient, files: FileServer, caplog):
    jobs = _jobs(zk, files, "Estimating", 12)  # one host, six batches' worth
    stop = threading.Event()
    thread = _run([Estimating(zk=zk, poll=0.05, batch=2)], stop)
    try:
        wait_for(lambda: all(job_load(zk, j.jid).state == "Provisioning" for j in jobs))
    finally:
        stop.set()
        thread.join(60)
    # Its jobs waited their turn in the loop's room; none was given back untouched.
    ok = [r.getMessage() for r in caplog.records if "estimating ok" in r.getMessage()]
    assert all(sum(line.count(job.jid) for line in ok) == 1 for job in jobs), ok
    assert "estimating waiting" not in caplog.text
    assert all(files.hits("HEAD", f"Estimating{i}") == 1 for i in range(12))


def test_a_slow_url_holds_up_none_of_its_hosts_other_jobs(
    zk: KazooClient, files: FileServer, settings, caplog
) -> None:
    """Two URLs that never answer a HEAD, on the host and port that serve the good files: the
    good jobs leave Estimating, their HEADs still one at a time, while both are unanswered."""
    settings.MRT_HTTP_TIMEOUT = 120.0  # the hostile URLs are let answer before a HEAD times out
    good: list[Job] = []
    hostile: list[Job] = []
    for n in range(14):  # created in run order: four good jobs, one hostile, ...
        name = f"hostile{n // 5}" if n % 5 == 4 else f"good{n}"
        url = files.put(name, b"x" * 10)
        job = make_job(zk, {"payload_url": url, "type": "file"}, state="Estimating")
        (hostile if name.startswith("hostile") else good).append(job)
    lock = threading.Lock()
    asked: set[str] = set()  # hostile URLs whose HEAD is under way
    at_once = [0, 0]  # good HEADs under way, and the most at one time
    answer = threading.Event()

    def before(method: str, route: str) -> None:
        if method != "HEAD":
            return
        if route.startswith("/hostile"):
            with lock:
                asked.add(route)
            assert answer.wait(120), "the test did not let the hostile URLs answer"
            return
        with lock:
            at_once[0] += 1
            at_once[1] = max(at_once)
        try:
            time.sleep(0.01)  # long enough for two HEADs at once to meet, were there any
        finally:
            with lock:
                at_once[0] -= 1

    files.before_answer = before
    stop = threading.Event()
    # A poll longer than the test: the step watch, not the poll, brings the loop back to set a
    # slow step aside.
    thread = _run([Estimating(zk=zk, poll=300.0, batch=4)], stop)
    try:
        wait_for(lambda: all(job_load(zk, j.jid).state == "Provisioning" for j in good))
        # Both hostile URLs were asked and neither has answered: no good job waited for them.
        assert asked == {"/hostile0", "/hostile1"}
        assert not answer.is_set()
        assert {job_load(zk, j.jid).state for j in hostile} == {"Estimating"}
        answer.set()
        wait_for(lambda: all(job_load(zk, j.jid).state == "Provisioning" for j in hostile))
    finally:
        answer.set()
        stop.set()
        thread.join(60)
    assert not thread.is_alive()
    # The good jobs' HEADs one at a time: the host's lane. On a busy machine a good HEAD may
    # itself outlast the host's usual pace and be set aside (as designed), and the lane then
    # goes on beside it: each such one may add one HEAD at a time, never more.
    asides = [r.getMessage() for r in caplog.records if "is set aside" in r.getMessage()]
    good_asides = sum(any(f"{j.jid}'s step" in m for j in good) for m in asides)
    assert at_once[1] <= 1 + good_asides, asides
    assert "has not answered a step for" not in caplog.text  # no host (nor URL) judged slow
    assert all(files.hits("HEAD", f"hostile{n}") == 1 for n in range(2))
    for job in good + hostile:
        assert zk.exists(zpaths.job_node(job.jid, "lock")) is None
