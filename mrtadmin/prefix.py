"""Serving the console under a URL prefix (``https://host/queue/``: daphne's ``--root-path``,
or the proxy's ``Daphne-Root-Path`` header).

Django adds the prefix to a relative ``STATIC_URL`` once, when the setting is first read, which
under ASGI is at start-up, before any request has a prefix: every script and style was linked
outside it. ``PrefixedStaticFilesStorage`` adds the prefix of the request being answered.
"""

from __future__ import annotations

from django.contrib.staticfiles.storage import StaticFilesStorage
from django.urls import get_script_prefix


class PrefixedStaticFilesStorage(StaticFilesStorage):
    """Static files (``STATIC_URL`` absolute, ``/static/``) linked under the URL prefix of the
    request being answered; without a request or a prefix, as Django links them."""

    def url(self, name: str | None) -> str:
        url = super().url(name)
        prefix = get_script_prefix().rstrip("/")
        if prefix and url.startswith("/") and not url.startswith("//"):
            return prefix + url
        return url
