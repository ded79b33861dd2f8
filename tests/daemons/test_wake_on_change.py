"""Idle consumers wake on a ZooKeeper watch of their folder instead of sleeping a full poll."""

import threading

from queues.zk import batches, jobs, paths
from queues.zk.daemon_support import ChangeSignal


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
