"""A stop cuts an outage's back-offs short: a claim of MRT_CLAIM_BATCH jobs meets the back-off
once per job in a row (``Daemon.failure``), and a stopping process must not wait for all of
them. The loop's thread binds its stop (``runner.daemon_threads``); a step thread the stop of
the loop that gave it the step (``SerialByKey``)."""

from __future__ import annotations

import errno
import threading

from queues.core import transient
from queues.daemons.base import Stay
from queues.daemons.notify import Notify
from queues.daemons.runner import daemon_threads
from queues.daemons.serial import SerialByKey


def test_a_back_off_ends_when_the_threads_stop_is_set() -> None:
    stop = threading.Event()
    stop.set()
    with transient.stopped_by(stop):
        assert transient.current_stop() is stop
        transient.pause(3600)  # returns at once: the stop is set
    assert transient.current_stop() is None


def test_a_step_thread_waits_on_the_stop_of_the_loop_that_gave_it_the_step() -> None:
    stop = threading.Event()
    lanes = SerialByKey(1, "test-backoff-stop")
    try:
        with transient.stopped_by(stop):
            given = lanes.submit("server", transient.current_stop)
        unbound = lanes.submit("server", transient.current_stop)
        assert given.result(30) is stop
        assert unbound.result(30) is None  # submitted outside the loop's binding
    finally:
        lanes.shutdown()


def test_every_job_of_a_claim_in_an_outage_stays_at_once_once_the_process_stops(zk) -> None:
    """Thirty-two jobs' steps meet a full disk one after another in a stopping loop's thread:
    each stays where it is, and none waits its back-off (0.5 s, doubling to 2 s, would be about
    a minute)."""
    daemon = Notify(zk=zk, batch=32, poll=0.05)
    stop = threading.Event()
    stays: list[object] = []

    def steps() -> None:
        for _ in range(32):
            stays.append(daemon.failure(None, OSError(errno.ENOSPC, "No space left on device")))

    stop.set()
    for thread in daemon_threads([_Once(steps)], stop, shared=True):
        thread.start()
        thread.join(30)
        assert not thread.is_alive()
    assert len(stays) == 32 and all(isinstance(s, Stay) for s in stays)
    assert transient.backoff_of(daemon).failures == 32


class _Once:
    """What ``daemon_threads`` runs in a thread of its own: ``run(stop)`` runs ``work``."""

    name = "once"

    def __init__(self, work) -> None:
        self.work = work

    def run(self, stop: threading.Event) -> None:
        self.work()
