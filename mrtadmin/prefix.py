"""Serving the console under a URL prefix (``https://host/queue/``: daphne's ``--root-path``,
or the proxy's ``Daphne-Root-Path`` header).

A proxy passes a request's path on either whole (``/queue/jobs/``) or without the prefix
(``/jobs/``); daphne hands either to the application as it came, with the prefix beside it as
``root_path``. Django (5.x) and Channels' router take the path to include the prefix, as ASGI
now says it should: Django's ``request.path``, from which the console's own links, ``?next=``
and htmx's polling URLs are made, lost the prefix, and Channels answered the live socket 500.
``WholePath`` puts the prefix back in front of a path that comes without it.

Django adds the prefix to a relative ``STATIC_URL`` once, when the setting is first read, which
under ASGI is at start-up, before any request has a prefix: every script and style was linked
outside it. ``PrefixedStaticFilesStorage`` adds the prefix of the request being answered.
"""

from __future__ import annotations

from typing import Any

from django.contrib.staticfiles.storage import StaticFilesStorage
from django.urls import get_script_prefix


class WholePath:
    """An ASGI application's scopes with their path under ``root_path``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        root = scope.get("root_path", "")
        path = scope.get("path")
        if root and isinstance(path, str) and not (path == root or path.startswith(root + "/")):
            scope = {**scope, "path": root + path}
            if "raw_path" in scope and scope["raw_path"] is not None:
                scope["raw_path"] = root.encode() + scope["raw_path"]
        await self.app(scope, receive, send)


class PrefixedStaticFilesStorage(StaticFilesStorage):
    """Static files (``STATIC_URL`` absolute, ``/static/``) linked under the URL prefix of the
    request being answered; without a request or a prefix, as Django links them."""

    def url(self, name: str | None) -> str:
        url = super().url(name)
        prefix = get_script_prefix().rstrip("/")
        if prefix and url.startswith("/") and not url.startswith("//"):
            return prefix + url
        return url
