"""Idle consumers wake on a ZooKeeper watch of their folder instead of sleeping a full poll."""

import threading

from queues.core.states import JOB
from queues.daemons.base import JobDaemon, Next
from queues.zk import batches, jobs, paths
from queues.zk.records import Job
from queues.zk.watch import ChangeSignal

from .conftest import make_job, wait_for


def test_signal_reports_a_new_job_in_the_watched_state(zk, other_zk):
    signal = ChangeSignal(zk, paths.job_state_folder("Pending"))
    signal.arm()
    batch = batches.batch_create(other_zk, submission={"profile": "p", "submitter": "s"})
    jobs.job_create(other_zk, bid=batch.bid, configuration={"profile": "p"})
    # A long timeout: the call returns because the folder changed, and says so.
    assert signal.wait(threading.Event(), timeout=60) is True


def test_signal_times_out_quietly_when_nothing_changes(zk):
    signal = ChangeSignal(zk, paths.job_state_folder("Estimating"))
    assert signal.wait(threading.Event(), timeout=0.3) is False


def test_signal_returns_when_the_daemon_is_stopped(zk):
    stop = threading.Event()
    stop.set()
    assert ChangeSignal(zk, paths.BATCHES).wait(stop, timeout=60) is False


def test_one_watch_is_kept_however_long_the_daemon_idles(zk):
    signal = ChangeSignal(zk, paths.job_state_folder("Storing"))
    for _ in range(20):
        signal.wait(threading.Event(), timeout=0.01)
    # kazoo keeps one callback per registration, keyed by the full (chrooted) path: an idle
    # daemon that registered a new one on every poll would grow this set without bound.
    # (The folder does not exist yet in a fresh tree, so the watch is an existence watch.)
    key = zk.chroot + paths.job_state_folder("Storing")
    watchers = zk._child_watchers.get(key, set()) | zk._data_watchers.get(key, set())
    assert len(watchers) == 1


class PassOn(JobDaemon):
    """A step with nothing to do: each job moves on to the next state at once."""

    name = "test-pass-on"
    step = "Estimating"
    state = "Estimating"
    queue_hold = None

    def work(self, item: Job) -> Next:
        return Next(JOB.successor(item.state))


def run_in_thread(consumer: JobDaemon) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    thread.start()
    return thread, stop


def test_a_busy_consumer_lists_its_folder_once_not_for_every_job(zk, other_zk, monkeypatch):
    made = [make_job(zk, {"payload_url": "http://h/a"}, state="Estimating").jid for _ in range(30)]
    folder = zk.chroot + paths.job_state_folder("Estimating")
    listings = []
    real = zk.get_children_async

    def counting(path, *args, **kwargs):
        if zk.chroot + path == folder:
            listings.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(zk, "get_children_async", counting)
    consumer = PassOn(zk=zk, poll=60)
    consumer._claimer = jobs.JobClaimer(zk, "Estimating", max_age=3600)
    thread, stop = run_in_thread(consumer)
    try:
        # Watched through another client: the test's own polling must not count as listings.
        wait_for(lambda: not other_zk.get_children(paths.job_state_folder("Estimating")))
    finally:
        stop.set()
        thread.join(timeout=30)
    assert {j for j in made if jobs.job_load(other_zk, j).state == "Provisioning"} == set(made)
    # One listing to work from, one to make sure it is empty, then the watch and one more look
    # once idle. The watch used to be set again (a full listing) after every job.
    assert len(listings) <= 6, len(listings)


def test_an_idle_consumer_wakes_for_a_job_that_arrives(zk, monkeypatch):
    idle = threading.Event()  # set once the consumer waits on its armed watch
    real_wait = ChangeSignal.wait

    def waiting(self, stop, timeout):
        idle.set()
        return real_wait(self, stop, timeout)

    monkeypatch.setattr(ChangeSignal, "wait", waiting)
    consumer = PassOn(zk=zk, poll=3600)  # only the watch can wake it in time
    thread, stop = run_in_thread(consumer)
    try:
        assert idle.wait(30), "the consumer never went idle"
        job = make_job(zk, {"payload_url": "http://h/a"}, state="Estimating")
        wait_for(lambda: jobs.job_load(zk, job.jid).state == "Provisioning", timeout=30)
    finally:
        stop.set()
        thread.join(timeout=30)


def test_arming_returns_the_listing_the_watch_was_set_with(zk, other_zk):
    """The batched loop uses the children the watch was set with as its fresh listing, instead
    of listing the folder a second time before it goes idle."""
    folder = paths.job_state_folder("Provisioning")
    fired = threading.Event()
    signal = ChangeSignal(zk, folder, fired)
    assert signal.arm() == []  # no folder yet: an existence watch, nothing listed
    zk.ensure_path(f"{folder}/05-jid0000000001")
    assert fired.wait(60)
    wait_for(lambda: not signal.armed)
    fired.clear()
    assert signal.arm() == ["05-jid0000000001"]
    assert signal.arm() is None  # set already, and nothing changed: no new listing
    other_zk.create(f"{folder}/05-jid0000000002")
    assert fired.wait(60)
    wait_for(lambda: not signal.armed)
    assert sorted(signal.arm() or []) == ["05-jid0000000001", "05-jid0000000002"]


class _RemovedRightAfterTheAnswer:
    """The watch's client, but for ``exists``: the server answers (present, the watch set),
    then the node is deleted by another client and the watch fires, all before the caller
    goes on: the interleaving a busy process meets when a hold is released just as one of
    its loops first asks about it."""

    def __init__(self, zk, other_zk, fired: threading.Event) -> None:
        self._zk, self._other, self._fired = zk, other_zk, fired

    def exists(self, path, watch=None):
        stat = self._zk.exists(path, watch=watch)
        if stat is not None and not self._fired.is_set():
            self._other.delete(path)
            assert self._fired.wait(30), "the watch did not fire"
        return stat

    def __getattr__(self, name):
        return getattr(self._zk, name)


def test_a_hold_released_as_its_watch_is_set_is_seen_released(zk, other_zk):
    """PresenceWatch: the node deleted between the server's answer and the watch noting it
    must not leave the watch saying "present" for good (a queue hold released at a start
    held one loop until its session ended: the benchmark's stalls)."""
    from queues.zk.watch import PresenceWatch

    path = paths.queue_lock("ingest")
    other_zk.ensure_path(path)
    woken = threading.Event()
    watch = PresenceWatch(zk, path, woken)
    watch._zk = _RemovedRightAfterTheAnswer(zk, other_zk, woken)

    assert watch.present() is True  # the answer as the server gave it
    assert woken.is_set()  # the loop is woken: the answer may differ now
    assert watch.present() is False  # asked again, not kept
    assert watch.present() is False
    other_zk.create(path)
    wait_for(lambda: watch.present() is True, timeout=30)  # armed again: the next change seen
