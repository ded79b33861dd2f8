"""Health check for load balancers and the container: is ZooKeeper reachable?

The answer comes within ``BUDGET`` seconds whatever ZooKeeper does. Connecting (up to
ZK_TIMEOUT) and a request on a connection that is not yet known to be dead (kazoo waits for it
indefinitely) both happen in one background probe; the request waits for that probe at most
the budget and otherwise says 503. A probe still under way is joined by the next health check
rather than started again, so a slow ZooKeeper never piles up threads.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from queues.zk.client import client

BUDGET = 1.5  # seconds; load balancers expect an answer well within 2 s

_lock = threading.Lock()
_probe: Future[str] | None = None


def _check(future: Future[str]) -> None:
    try:
        zk = client()
        if not zk.connected:
            raise ConnectionError(f"ZooKeeper connection is {zk.state}")
        zk.exists_async("/").get(timeout=BUDGET)
    # Whatever stops us reaching ZooKeeper (no server, lost session, timeout) means unhealthy.
    except BaseException as exc:
        future.set_exception(exc)
    else:
        future.set_result(str(zk.state))


def _current_probe() -> Future[str]:
    global _probe
    with _lock:
        if _probe is None or _probe.done():
            _probe = Future()
            threading.Thread(
                target=_check, args=(_probe,), name="healthz-probe", daemon=True
            ).start()
        return _probe


def _unreachable(error: str) -> JsonResponse:
    return JsonResponse({"zookeeper": "unreachable", "error": str(error)}, status=503)


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    probe = _current_probe()
    try:
        state = probe.result(timeout=BUDGET)
    except FutureTimeout:
        return _unreachable(f"no answer from ZooKeeper within {BUDGET:g} s")
    except Exception as exc:
        return _unreachable(str(exc) or type(exc).__name__)
    return JsonResponse({"zookeeper": "connected", "state": state})
