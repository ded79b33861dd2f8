"""SerialByKey: a key's tasks one after another, other keys' beside them."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError

import pytest

from queues.daemons.serial import SerialByKey


@pytest.fixture
def pool():
    runner = SerialByKey(2, "test-serial")
    yield runner
    runner.shutdown()


def test_a_keys_tasks_run_in_order_one_at_a_time_while_another_key_goes_on(pool) -> None:
    release = threading.Event()
    ran: list[str] = []

    def first() -> str:
        assert release.wait(30)
        ran.append("a1")
        return "a1"

    a1 = pool.submit("a", first)
    a2 = pool.submit("a", lambda: ran.append("a2") or "a2")
    b1 = pool.submit("b", lambda: ran.append("b1") or "b1")
    assert b1.result(30) == "b1"  # while a1 still waits
    assert not a2.done()
    release.set()
    assert (a1.result(30), a2.result(30)) == ("a1", "a2")
    assert ran == ["b1", "a1", "a2"]


def test_a_task_not_begun_can_be_cancelled_and_a_failure_reaches_its_future(pool) -> None:
    release = threading.Event()
    started = threading.Event()
    ran: list[str] = []
    first = pool.submit("a", lambda: started.set() or release.wait(30))

    def broken() -> None:
        raise ValueError("broken")

    failing = pool.submit("a", broken)
    dropped = pool.submit("a", lambda: ran.append("dropped"))
    assert dropped.cancel()
    assert started.wait(30)
    assert not first.cancel()  # under way
    release.set()
    assert first.result(30) is True
    with pytest.raises(ValueError, match="broken"):
        failing.result(30)
    with pytest.raises(CancelledError):
        dropped.result(30)
    assert pool.submit("a", lambda: "after").result(30) == "after"
    assert ran == []


def test_a_task_set_aside_lets_its_lane_go_on_in_another_thread() -> None:
    runner = SerialByKey(1, "test-serial-aside", aside=1)
    release = threading.Event()
    started = threading.Event()
    ran: list[str] = []
    try:
        slow = runner.submit("a", lambda: started.set() or release.wait(30))
        after = runner.submit("a", lambda: ran.append("a2") or "a2")
        first = runner.submit("a", lambda: ran.append("a1") or "a1", first=True)
        assert started.wait(30)
        assert not after.done()  # behind the slow task in its lane, the one lane there is
        assert runner.set_aside("a", slow)
        assert (first.result(30), after.result(30)) == ("a1", "a2")  # while it still runs
        assert ran == ["a1", "a2"]
        assert not slow.done() and runner.aside() == 1
        # One set aside at a time: another slow task keeps its lane.
        began = threading.Event()
        other = runner.submit("b", lambda: began.set() or release.wait(30))
        wait = threading.Event()
        behind = runner.submit("b", lambda: wait.set())
        assert began.wait(30)
        assert not runner.set_aside("b", other)
        assert not runner.set_aside("a", after)  # not a task under way
        release.set()
        assert slow.result(30) is True and other.result(30) is True
        assert behind.result(30) is None and wait.is_set()
        assert runner.aside() == 0
        assert runner.submit("a", lambda: "again").result(30) == "again"
    finally:
        release.set()
        runner.shutdown()
