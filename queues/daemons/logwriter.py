"""A daemon process's log lines written by a thread of their own.

A batched loop logs a line for every group of jobs it moves, thousands a second with every
step's work done at once. Written where they are logged, each line took the handlers' lock
(one for every loop of the process) and a write to stderr, a system call that gives up the
interpreter lock: the loops queued behind one another and behind the other threads, about a
sixth of a long step's loop time (docs/benchmarks.md). Here a loop only fills in the record's
message and puts it on a queue; one writer thread formats and writes the lines, in the order
they were logged, through the handlers the settings configured.

``queued_logging`` moves the root logger's handlers behind the queue while a daemon runs and
puts them back when it stops, after every record queued has been written. ``flush`` writes
what is queued before a process exits without unwinding (``os._exit``).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Iterator, Sequence

MAX_QUEUED = 10_000  # lines; past it a loop waits for the writer, as it waited for the output
STOP_TIMEOUT = 5.0  # seconds ``flush`` gives the writer before a process exits regardless

_TRACEBACKS = logging.Formatter()
_active: list[_Writer] = []
_active_lock = threading.Lock()


class _Enqueue(logging.Handler):
    def __init__(self, lines: queue.Queue[logging.LogRecord | None]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        # The message's arguments may change once the caller goes on, and a traceback's frames
        # with them: both become text now. The rest of the formatting (time, level, escaping:
        # the settings' formatter) is the writer's. The record itself is kept, not copied (a
        # copy a line was a few percent of a batched daemon's CPU): every other handler of the
        # record reads the same message from it.
        try:
            if record.args:
                record.msg, record.args = record.getMessage(), None
            if record.exc_info and not record.exc_text:
                record.exc_text = _TRACEBACKS.formatException(record.exc_info)
            self.lines.put(record)
        except Exception:
            self.handleError(record)

    def handle(self, record: logging.LogRecord) -> bool:
        # No lock of its own: the queue has one, and one lock for every thread of the process
        # is what this handler is for not taking.
        if self.filter(record):
            self.emit(record)
            return True
        return False


class _Writer:
    """One thread writing the queued records through ``handlers``, each at its own level."""

    def __init__(self, handlers: Sequence[logging.Handler]) -> None:
        self.handlers = list(handlers)
        self.lines: queue.Queue[logging.LogRecord | None] = queue.Queue(MAX_QUEUED)
        self.thread = threading.Thread(target=self._run, name="log-writer", daemon=True)

    def _run(self) -> None:
        while (record := self.lines.get()) is not None:
            for handler in self.handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)

    def stop(self, timeout: float | None = None) -> None:
        """Write what is queued and end the thread (or give up after ``timeout``: an output
        that takes nothing must not keep a process from exiting)."""
        try:
            self.lines.put(None, timeout=timeout)
        except queue.Full:
            return
        self.thread.join(timeout)


@contextlib.contextmanager
def queued_logging() -> Iterator[None]:
    """The root logger's handlers fed from a queue by one writer thread, for the block."""
    root = logging.getLogger()
    handlers = list(root.handlers)
    if not handlers:
        yield
        return
    writer = _Writer(handlers)
    enqueue = _Enqueue(writer.lines)
    for handler in handlers:
        root.removeHandler(handler)
    root.addHandler(enqueue)
    writer.thread.start()
    with _active_lock:
        _active.append(writer)
    try:
        yield
    finally:
        root.removeHandler(enqueue)
        for handler in handlers:
            root.addHandler(handler)
        if _take(writer):
            writer.stop()  # every record queued is written before the block ends


def _take(writer: _Writer) -> bool:
    with _active_lock:
        if writer not in _active:
            return False  # stopped by ``flush``
        _active.remove(writer)
        return True


def flush(timeout: float = STOP_TIMEOUT) -> None:
    """Write every line queued so far and stop the writers: before ``os._exit``, which runs
    no ``finally``."""
    with _active_lock:
        writers = list(_active)
    for writer in writers:
        if _take(writer):
            writer.stop(timeout)
