"""Right after a start, pages come before the background fill (issue 51).

ZooKeeper answers one session's requests in order, and the fill's work holds the interpreter:
at a million jobs the overview's dozen small reads waited behind the fill's pipelined reads
for 2-4 s. Between two of its steps the fill now waits while a page is being answered
(``index.yield_to_pages``), except for a page that is itself waiting for the fill."""

from __future__ import annotations

import threading

import pytest

from queues.zk import index as zindex


@pytest.fixture
def long_yield(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zindex, "FILL_YIELD_MOST", 60.0)


def _fill_step() -> threading.Thread:
    thread = threading.Thread(target=zindex.yield_to_pages, daemon=True)
    thread.start()
    return thread


def test_the_fill_waits_while_a_page_is_answered_and_goes_on_when_it_is(long_yield) -> None:
    with zindex.answer_within(30):
        step = _fill_step()
        step.join(0.5)
        assert step.is_alive()  # it waits for the page (at most 60 s here), not a moment
    step.join(30)
    assert not step.is_alive()


def test_a_page_waiting_for_the_fill_does_not_hold_it_up(long_yield) -> None:
    with zindex.answer_within(30), zindex._waiting_for_fill():
        step = _fill_step()
        step.join(30)
        assert not step.is_alive()


def test_outside_a_page_nothing_is_counted(long_yield) -> None:
    with zindex._waiting_for_fill():  # no page: no count to give back
        pass
    step = _fill_step()
    step.join(30)
    assert not step.is_alive()
