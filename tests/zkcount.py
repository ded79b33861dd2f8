"""What the tests that count a view's ZooKeeper requests leave out of the count."""

from __future__ import annotations

from typing import Any

from queues.zk import servertime


def clock_sample(zk: Any, request: Any) -> bool:
    """Whether ``request`` writes the process's sample of the server's clock
    (``queues.zk.servertime``: at most one write a minute a process, whichever page or step
    asks for the time first), not a cost of the view being counted."""
    path = getattr(request, "path", None)
    return isinstance(path, str) and zk.unchroot(path) == servertime.CLOCK
