"""The environment banner: every page names the environment it runs in (``MRT_ENVIRONMENT``).

Production gets a quiet label; any other environment a coloured band above the page, the same
on every page and in the tab's title, so an operator never acts on a test console believing it
is the real one (or the other way round).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest

PRODUCTION = "production"
# Known names get their own colour; any other name is shown like development.
KINDS = {"production": "production", "prod": "production", "stage": "stage", "staging": "stage"}


def environment(request: HttpRequest) -> dict[str, Any]:
    name = settings.MRT_ENVIRONMENT
    kind = KINDS.get(name, "development")
    return {"environment": {"name": name, "kind": kind, "production": kind == PRODUCTION}}
