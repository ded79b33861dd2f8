"""Fill the web process's read index when it starts, not on the first operator's page view.

The fill runs in a background thread and reads in the order pages need it: the overview's
counts and batch states first, then each Failed job's batch and step, then every job's
configuration and identifiers (collection filters and the search by local ID or ARK). Pages
asked meanwhile answer from what is ready and say what is still loading
(``ReadIndex.loading``); afterwards watches keep the index current.
"""

from __future__ import annotations

import logging
import threading

from queues import selectors
from queues.zk import index as zindex

log = logging.getLogger(__name__)


def warm_read_index() -> None:
    try:
        zindex.for_client(selectors.zk_client()).fill(first=selectors.overview)
    # ZooKeeper may be down at start: pages say so, and the index fills on first use instead.
    except Exception as exc:
        log.warning("could not warm the read index: %s", exc)


def warm_in_background() -> threading.Thread:
    thread = threading.Thread(target=warm_read_index, name="warm-read-index", daemon=True)
    thread.start()
    return thread
