"""Content-Security-Policy for every answer: defence in depth behind the pages' escaping.

The console's pages load scripts and styles from its own static files only (htmx, live.js,
console.js, console.css) and open one websocket to their own host, so the policy allows exactly
that: no inline script or style, no eval, nothing from another origin, no framing. A page that
needs more is a page to fix, not a policy to widen.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.debug import SafeExceptionReporterFilter

DEFAULT_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "font-src 'self'",
        # 'self' covers ws:// and wss:// to the page's own host and port (the live websocket).
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class ContentSecurityPolicyMiddleware:
    """Adds settings.CONTENT_SECURITY_POLICY (or the default above) unless a view set its own."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.policy = getattr(settings, "CONTENT_SECURITY_POLICY", "") or DEFAULT_POLICY

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = self.policy
        return response


class SecretSettingsFilter(SafeExceptionReporterFilter):
    """Django's error report (the debug page under ``DJANGO_DEBUG``, and error mails) with every
    setting that may hold a secret hidden: Django's own names, and every URL or address of a
    service (``DATABASE_URL``, ``REDIS_URL``, ``CHANNEL_LAYERS``, the Merritt services' URLs, the
    alert webhook), whose user-info, or a Slack webhook's path, is a credential."""

    hidden_settings = re.compile(
        "API|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|URL|DATABASE|CHANNEL_LAYERS|CACHES",
        flags=re.IGNORECASE,
    )
