"""Fill the web process's read index when it starts, not on the first operator's page view.

With 100,000 jobs the first overview after a start otherwise pays for listing every state
folder and reading every batch's status (seconds); afterwards watches keep the index current.
"""

from __future__ import annotations

import logging
import threading

from queues import selectors

log = logging.getLogger(__name__)


def warm_read_index() -> None:
    try:
        selectors.overview()
    # ZooKeeper may be down at start: pages say so, and the index fills on first use instead.
    except Exception as exc:
        log.warning("could not warm the read index: %s", exc)


def warm_in_background() -> threading.Thread:
    thread = threading.Thread(target=warm_read_index, name="warm-read-index", daemon=True)
    thread.start()
    return thread
