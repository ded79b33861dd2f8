"""A step that waits on servers outside runs in a thread of its own (``steps_elsewhere``): a
depositor's callback receiver or manifest host that does not answer holds up its own step only,
not the other batched steps sharing the loops' thread, as ``runconsumer`` runs them by default."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import ClassVar

import pytest
from kazoo.client import KazooClient

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


def test_a_stop_waits_for_the_step_under_way_and_moves_its_job(
    zk: KazooClient, files: FileServer, profiles: Path
) -> None:
    _with_callback(profiles, files.url + "/hook")
    (job,) = _jobs(zk, files, "Notify", 1)
    held = threading.Event()
    answer = threading.Event()
    files.on_post = lambda _route: (held.set(), answer.wait(60))
    stop = threading.Event()
    thread = _run([Notify(zk=zk, poll=0.05, batch=4)], stop)
    try:
        assert held.wait(30), "no callback was posted"
        stop.set()  # the weekly redeploy, while the receiver holds the callback
        threading.Timer(0.5, answer.set).start()
        thread.join(60)
        assert not thread.is_alive()
    finally:
        answer.set()
        stop.set()
        thread.join(60)
    # The callback was answered, so its job moved on before the loop stopped.
    done = job_load(zk, job.jid)
    assert (done.state, done.lock) == ("Completed", None)
    assert zk.exists(callback_record_path(job.jid)) is None
    assert len(files.posts) == 1


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
