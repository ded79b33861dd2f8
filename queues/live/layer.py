"""Whether this web process can reach its channel layer (Redis, with ``REDIS_URL``).

During a Redis outage every websocket attempt and every live message fails the same way; a
traceback for each buried the log (about 420 a worker in a 20 s outage). Failures that mean
"the layer is unreachable" are reported here instead: one warning when the first one is seen,
one line when a layer operation works again. Any other error is a bug and is raised as before.
"""

from __future__ import annotations

import logging
import threading
import time

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger("queues.live")

# Refused, reset and timed-out connections: Python's own classes, and redis-py's (which are not
# OSErrors) for the same faults.
UNREACHABLE: tuple[type[BaseException], ...] = (
    ConnectionError,
    TimeoutError,
    RedisConnectionError,
    RedisTimeoutError,
)


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or one it was raised from) says the layer cannot be reached."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, UNREACHABLE):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


class LayerHealth:
    """The layer's state as this process last saw it, logged once per change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down_since: float | None = None

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
        log.warning(
            "live console: the channel layer is unreachable (%s: %s); pages show the queue "
            "without live updates and retry with back-off",
            type(exc).__name__,
            exc,
        )

    def worked(self) -> None:
        with self._lock:
            since, self._down_since = self._down_since, None
        if since is not None:
            log.warning(
                "live console: the channel layer is reachable again after %.0f s",
                time.monotonic() - since,
            )


health = LayerHealth()
