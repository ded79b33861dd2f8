"""Fill the web process's read index when it starts, not on the first operator's page view.

The fill runs in a background thread and reads in the order pages need it: the overview's
counts and batch states first, then each Failed job's batch and step, then every job's
configuration and identifiers (collection filters and the search by local ID or ARK). Pages
asked meanwhile answer from what is ready and say what is still loading
(``ReadIndex.loading``); afterwards watches keep the index current.

Nothing starts on import. The web process's ASGI application is wrapped in
:class:`WarmOnFirstConnection`, which starts the fill when the server hands it its first
connection (``mrtadmin/asgi.py`` says why then); tests and benchmarks call
:func:`warm_in_background` themselves.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from queues.console import jobtext, selectors
from queues.operator import stuck
from queues.zk import index as zindex
from queues.zk.client import connected_client

log = logging.getLogger(__name__)


def warm_read_index() -> None:
    try:
        zk = connected_client()
        idx = zindex.for_client(zk)
        # The search's text index in the database takes what the fill reads of every job
        # (only the jobs it does not hold yet are written: the backfill after a restart).
        jobtext.feed_for(idx, start=True)
        idx.fill(first=selectors.overview)
        # Then the stuck jobs' first count, which reads every working entry's creation time:
        # the overview card and /metrics do not wait for it (stuck.stuck_counts(wait=False)).
        stuck.prime(zk)
    # ZooKeeper may be down at start: pages say so, and the index fills on first use instead.
    except Exception as exc:
        log.warning("could not warm the read index: %s", exc)


def warm_in_background() -> threading.Thread:
    thread = threading.Thread(target=warm_read_index, name="warm-read-index", daemon=True)
    thread.start()
    return thread


class WarmOnFirstConnection:
    """An ASGI application that starts the warm-up once, on its first call, then passes through.

    Any scope counts (an HTTP request, a websocket, a server's ``lifespan`` start-up), so a
    health probe is enough to start it. The fill runs in its own thread; the connection is
    handed on at once.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.warming: threading.Thread | None = None
        self._lock = threading.Lock()

    def start_warming(self) -> None:
        with self._lock:
            if self.warming is None:
                self.warming = warm_in_background()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> Any:
        if self.warming is None:
            self.start_warming()
        return await self.app(scope, receive, send)
