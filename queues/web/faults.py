"""Django's answer to a fault no view turned into a refusal (``handler500``): in each door's own
format, so a client reading JSON or Merritt's exception documents never meets an HTML page.

Django has logged the fault (the ``django.request`` logger, with its traceback) before it asks for
this answer, which names nothing of what failed.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views import defaults

from queues.views.poster import Refused, error_response
from queues.web.api_door import error_json

MESSAGE = "internal error: the console logged it"


def server_error(request: HttpRequest) -> HttpResponse:
    """Under ``/api/`` the JSON error every other API answer has; under ``/poster/`` Merritt's
    exception document (``GENERAL_EXCEPTION``, as Merritt's own door answers a fault); the
    console's error page elsewhere."""
    path = request.path_info
    if path.startswith("/api/"):
        return error_json(MESSAGE, 500)
    if path.startswith("/poster/"):
        return error_response(request, Refused(MESSAGE, "GENERAL_EXCEPTION"))
    return defaults.server_error(request)
