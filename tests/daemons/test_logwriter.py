"""The daemons' log lines, written by a thread of their own (queues/daemons/logwriter.py)."""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Iterator

import pytest

from queues.core.outside_text import LogFormatter
from queues.daemons import logwriter

log = logging.getLogger("queues.daemons.test_logwriter")


@pytest.fixture
def written() -> Iterator[io.StringIO]:
    """The root logger with one handler as the settings make it (writing to a buffer), and
    nothing else, for the test."""
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(LogFormatter("%(levelname)s %(name)s %(message)s"))
    root.handlers = [handler]
    root.setLevel(logging.INFO)
    try:
        yield out
    finally:
        root.handlers = saved
        root.setLevel(level)


def test_lines_are_written_in_order_by_the_writer_and_all_before_the_block_ends(written):
    root = logging.getLogger()
    handler = root.handlers[0]
    writers: set[str] = set()
    emit = handler.emit

    def noting(record: logging.LogRecord) -> None:
        writers.add(threading.current_thread().name)
        emit(record)

    handler.emit = noting  # type: ignore[method-assign]
    before = list(root.handlers)  # pytest's capture's too
    with logwriter.queued_logging():
        assert handler not in root.handlers  # behind the queue meanwhile
        for n in range(500):
            log.info("moved %d jobs: %s", n, "jid0000000001")
    assert root.handlers == before
    lines = written.getvalue().splitlines()
    assert lines == [
        f"INFO queues.daemons.test_logwriter moved {n} jobs: jid0000000001" for n in range(500)
    ]
    assert threading.current_thread().name not in writers  # the loops never write a line


def test_a_line_says_what_its_arguments_were_when_it_was_logged(written):
    jobs = ["jid0000000001"]
    release = threading.Event()
    root = logging.getLogger()
    handler = root.handlers[0]
    emit = handler.emit

    def held(record: logging.LogRecord) -> None:
        release.wait(10)  # the writer is behind: the caller changes its list meanwhile
        emit(record)

    handler.emit = held  # type: ignore[method-assign]
    with logwriter.queued_logging():
        log.info("handed on: %s", jobs)
        jobs.append("jid0000000002")
        release.set()
    assert written.getvalue() == "INFO queues.daemons.test_logwriter handed on: ['jid0000000001']\n"


def test_a_traceback_keeps_its_lines_and_outside_text_is_escaped(written):
    with logwriter.queued_logging():
        try:
            raise ValueError("bad\nvalue")
        except ValueError:
            log.exception("step failed for %s", "evil\nname\x1b[31m")
    text = written.getvalue()
    first, *rest = text.splitlines()
    assert first == r"ERROR queues.daemons.test_logwriter step failed for evil\nname\x1b[31m"
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-2:] == ["ValueError: bad", "value"]  # a traceback keeps its newlines


def test_flush_writes_what_is_queued_before_a_process_exits_without_unwinding(written):
    root = logging.getLogger()
    before = list(root.handlers)
    with logwriter.queued_logging():
        for n in range(100):
            log.warning("line %d", n)
        logwriter.flush()  # as before os._exit
        assert len(written.getvalue().splitlines()) == 100
    # The block's end after a flush stops nothing twice and gives the handlers back.
    assert root.handlers == before


def test_no_handlers_no_writer(written):
    root = logging.getLogger()
    root.handlers = []
    before = threading.active_count()
    with logwriter.queued_logging():
        assert threading.active_count() == before
        assert root.handlers == []


def test_a_full_queue_makes_the_logger_wait_and_loses_nothing(written, monkeypatch):
    """An output that takes nothing (a full pipe) holds the loops up once MAX_QUEUED lines wait,
    as the output itself did, rather than growing the process without end or dropping lines;
    and ``flush`` before an exit gives up on it rather than keeping the process alive."""
    monkeypatch.setattr(logwriter, "MAX_QUEUED", 3)
    root = logging.getLogger()
    handler = root.handlers[0]
    emit = handler.emit
    release = threading.Event()
    taken = threading.Event()

    def blocked(record: logging.LogRecord) -> None:
        taken.set()
        release.wait(30)
        emit(record)

    handler.emit = blocked  # type: ignore[method-assign]
    logged: list[int] = []

    def logger() -> None:
        for n in range(10):
            log.info("line %d", n)
            logged.append(n)

    with logwriter.queued_logging():
        writer = logwriter._active[-1]
        thread = threading.Thread(target=logger)
        thread.start()
        assert taken.wait(10)
        while not writer.lines.full():
            thread.join(0.01)
        # One line in the output's hands, three queued: the fifth call cannot return.
        assert len(logged) <= 4
        logwriter.flush(timeout=0.05)  # gives up: the queue stays full
        assert writer.thread.is_alive()
        release.set()
        thread.join(10)
        assert not thread.is_alive()
        writer.lines.put(None)  # the writer ``flush`` gave up on ends after the lines
        writer.thread.join(10)
    assert written.getvalue().splitlines() == [
        f"INFO queues.daemons.test_logwriter line {n}" for n in range(10)
    ]
