"""Health check for load balancers and the container: is ZooKeeper reachable?"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from queues.zk import client


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    try:
        zk = client()
        zk.exists("/")
    # Whatever stops us reaching ZooKeeper (no server, lost session, timeout) means unhealthy.
    except Exception as exc:
        return JsonResponse({"zookeeper": "unreachable", "error": str(exc)}, status=503)
    return JsonResponse({"zookeeper": "connected", "state": str(zk.state)})
