"""ASGI entry point: HTTP through Django, websockets through the live console consumers.

Request bodies are bounded before they are read (``mrtadmin.bodylimit``): in front of the
application, and, when daphne serves it, inside daphne, which otherwise writes a whole body to
disk before the application sees the request.

Importing this module builds the application and starts nothing. The read index is warmed
(``queues.web.warmup``) when the server first hands the application a connection: daphne speaks
no ASGI lifespan, and the first connection is the moment a server is certainly serving.
``bin/run-console`` and the image's health check ask ``/healthz`` as soon as daphne listens,
so the index fills from the start, not on the first operator's page.

Under a URL prefix every path is made to include it (``mrtadmin.prefix``), whether the proxy
passed it on or not.
"""

import os
import sys

from django.core.asgi import get_asgi_application

from mrtadmin.local import settings_or_exit
from queues.web.memory import limit_heaps

limit_heaps()  # before any thread of the server or the read index allocates
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mrtadmin.settings")
# A bad setting stops daphne in one line naming it (exit status 2), not a traceback.
settings_or_exit("mrtadmin.asgi")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from mrtadmin.bodylimit import BodyLimit, install_in_daphne  # noqa: E402
from mrtadmin.prefix import WholePath  # noqa: E402
from queues.live.routing import websocket_urlpatterns  # noqa: E402
from queues.web.warmup import WarmOnFirstConnection  # noqa: E402

# Only when daphne runs this process: importing Twisted first would choose its reactor for it.
if "daphne.server" in sys.modules:
    install_in_daphne()

application = WarmOnFirstConnection(
    WholePath(
        ProtocolTypeRouter(
            {
                "http": BodyLimit(django_asgi_app),
                "websocket": AllowedHostsOriginValidator(
                    AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
                ),
            }
        )
    )
)
