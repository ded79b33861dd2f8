"""The live server's requests and the flush between tests, kept apart.

pytest-django's ``live_server`` serves from a thread that shares the test's own connection to
SQLite's in-memory database. A request still being answered when a test ends (a page's
reconnecting ``/ws/live/`` after its browser context closed) used that one connection while the
teardown's ``flush`` ran on it, and the flush failed ("couldn't be flushed") once in a CI run.
Each request the server answers is counted here, and the flush waits until none is being
answered.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.servers.basehttp import ThreadedWSGIServer
from django.test.testcases import TransactionTestCase

# Long enough for any request of the suite's pages; a request that takes longer is left to race,
# as before, rather than hanging the suite.
IDLE_WAIT_S = 30.0

_answering = 0
_changed = threading.Condition()


def _counted(serve: Any) -> Any:
    def process_request_thread(self: ThreadedWSGIServer, request: Any, client_address: Any) -> None:
        global _answering
        with _changed:
            _answering += 1
        try:
            serve(self, request, client_address)
        finally:
            with _changed:
                _answering -= 1
                _changed.notify_all()

    return process_request_thread


def _after_requests(flush: Any) -> Any:
    def _fixture_teardown(self: TransactionTestCase) -> None:
        with _changed:
            _changed.wait_for(lambda: _answering == 0, timeout=IDLE_WAIT_S)
        flush(self)

    return _fixture_teardown


def install() -> None:
    """Count the live server's requests and have each flush wait for them; once a process."""
    if getattr(ThreadedWSGIServer.process_request_thread, "counted", False):
        return
    counted = _counted(ThreadedWSGIServer.process_request_thread)
    counted.counted = True
    ThreadedWSGIServer.process_request_thread = counted  # type: ignore[method-assign]
    TransactionTestCase._fixture_teardown = _after_requests(  # type: ignore[method-assign]
        TransactionTestCase._fixture_teardown
    )
