"""Who may do what: three roles as Django groups, checked on the server for every action.

viewer reads; operator also holds, releases, resumes and updates reporting; admin also deletes,
fails, repairs and holds whole queues. Each role is a group holding one of the permissions
declared on AuditEntry, so a superuser passes every check without being in a group.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import re
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from axes.backends import AxesStandaloneBackend
from axes.signals import user_locked_out
from django.conf import settings
from django.contrib import auth
from django.contrib.auth.backends import RemoteUserBackend
from django.contrib.auth.middleware import PersistentRemoteUserMiddleware
from django.contrib.auth.models import Group
from django.contrib.auth.signals import user_login_failed
from django.core.exceptions import PermissionDenied
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django_htmx.http import HttpResponseClientRedirect

from queues.core.roles import ADMIN, OPERATOR, ROLES, VIEWER
from queues.models import ApiToken
from queues.operator import catalogue

log = logging.getLogger(__name__)

# The permission each role adds; a role includes the ones before it.
ROLE_PERMISSION = {
    VIEWER: "queues.view_queues",
    OPERATOR: "queues.operate_queues",
    ADMIN: "queues.administer_queues",
}
ROLE_PERMISSIONS = {
    VIEWER: ("view_queues", "view_auditentry"),
    OPERATOR: ("view_queues", "view_auditentry", "operate_queues"),
    ADMIN: ("view_queues", "view_auditentry", "operate_queues", "administer_queues"),
}

# (kind, action) -> the role needed, from the one catalogue of actions. Anything missing is
# refused.
ACTION_ROLES: dict[tuple[str, str], str] = {a.key: a.role for a in catalogue.ACTIONS}


def has_role(user: Any, role: str) -> bool:
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    return user.has_perm(ROLE_PERMISSION[role])


def role_of(user: Any) -> str | None:
    """The highest role the user has, or None."""
    for role in reversed(ROLES):
        if has_role(user, role):
            return role
    return None


def may(user: Any, kind: str, action: str) -> bool:
    role = ACTION_ROLES.get((kind, action))
    return role is not None and has_role(user, role)


def session_access(session_key: str | None, user_id: Any) -> str | None:
    """Whether the user a session was opened for still may see the console: None when so, else
    what is wrong: "login" (the session ended, expired or now names no user or another one, or
    the user was deactivated or changed their password) or "role" (no viewer role any more).

    Read afresh from the session store, as Django reads a request's user: for a connection that
    outlives the request that opened it (the live websocket)."""
    from importlib import import_module
    from types import SimpleNamespace

    if not session_key:
        return "login"
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = auth.get_user(SimpleNamespace(session=store))  # type: ignore[arg-type]
    if not user.is_authenticated or user.pk != user_id:
        return "login"
    return None if has_role(user, VIEWER) else "role"


def require_action(user: Any, kind: str, action: str) -> None:
    if not may(user, kind, action):
        role = ACTION_ROLES.get((kind, action), "nobody")
        raise PermissionDenied(f"{action} on a {kind} needs the {role} role")


# The WWW-Authenticate answer of a door that wants a token (the API, /metrics).
BEARER_CHALLENGE = 'Bearer realm="mrt-console"'


def token_from(request: HttpRequest) -> ApiToken | None:
    """The API token a request carries (``Authorization: Bearer <key>`` or ``Token <key>``),
    or None. The one token check of every door that takes tokens: the JSON API, ``/metrics``,
    the poster door (which also takes the key as an HTTP Basic password)."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() not in ("bearer", "token"):
        return None
    return ApiToken.find(key.strip())


def role_required(
    role: str,
) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Login first (redirect), then the role (403): every console view goes through this."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                from django.contrib.auth.views import redirect_to_login

                if getattr(request, "htmx", False):
                    # A redirect inside an htmx swap would paste the login page into a row:
                    # the browser goes to the login page instead (HX-Redirect).
                    return HttpResponseClientRedirect(settings.LOGIN_URL, status=401)
                return redirect_to_login(request.get_full_path())
            if not has_role(request.user, role):
                raise PermissionDenied(f"this page needs the {role} role")
            return view(request, *args, **kwargs)

        return wrapped

    return decorator


def ensure_groups() -> dict[str, Group]:
    """Create the three groups with their permissions (idempotent)."""
    from django.contrib.auth.models import Permission

    groups = {}
    for role in ROLES:
        group, _ = Group.objects.get_or_create(name=role)
        perms = Permission.objects.filter(
            content_type__app_label="queues", codename__in=ROLE_PERMISSIONS[role]
        )
        group.permissions.set(perms)
        groups[role] = group
    return groups


# What a user name may look like (Django's own user name rule). Anything else in the header,
# such as two values joined by a comma because a client sent the header too, is refused.
SSO_USERNAME_RE = re.compile(r"^[\w.@+-]{1,150}\Z")


def sso_meta_key() -> str:
    """The request.META key of the configured header: X-Remote-User -> HTTP_X_REMOTE_USER.

    Both the WSGI and the ASGI request put a header under this key; neither puts a header
    whose name has an underscore there (Django's ASGI request drops those, WSGI servers do).
    """
    return "HTTP_" + settings.MRT_SSO_HEADER.upper().replace("-", "_")


def _proxy_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(p, strict=False) for p in settings.MRT_SSO_PROXIES]


def from_trusted_proxy(request: HttpRequest) -> bool:
    """Whether the request came from an address allowed to send the SSO header.

    Without MRT_SSO_PROXIES every address is (the deployment then relies on daphne being
    reachable only from the proxy); with it, only the listed addresses and networks.
    """
    if not settings.MRT_SSO_PROXIES:
        return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in network for network in _proxy_networks())


def trusted_username(request: HttpRequest) -> str | None:
    """The user name the trusted proxy put in the configured header, or None.

    The one place that reads the header, for the sync and the async request path alike.
    """
    if not settings.MRT_SSO_HEADER:
        return None
    value = request.META.get(sso_meta_key())
    if value is None:
        return None
    if not from_trusted_proxy(request):
        log.warning(
            "ignored the %s header from %s, which is not in MRT_SSO_PROXIES",
            settings.MRT_SSO_HEADER,
            request.META.get("REMOTE_ADDR", "?"),
        )
        return None
    value = value.strip()
    if not SSO_USERNAME_RE.fullmatch(value):
        log.warning("ignored a %s header that is not a user name", settings.MRT_SSO_HEADER)
        return None
    return value


class TrustedHeaderMiddleware(PersistentRemoteUserMiddleware):
    """Log in the user named by the trusted proxy's header (settings.MRT_SSO_HEADER).

    Persistent: a request without the header keeps its session, so password login still works
    where the proxy is bypassed. Only enable behind a proxy that strips the header from clients.

    Django's own remote-user middleware reads ``META[header]`` on the sync path but
    ``META["HTTP_" + header]`` on the async one (the path daphne takes), so one setting of
    ``header`` cannot be right for both. Both paths here go through ``process_request``, which
    reads the header with ``trusted_username`` only.
    """

    header = ""  # unused: see trusted_username

    def process_request(self, request: HttpRequest) -> None:
        username = trusted_username(request)
        if username is None:
            return
        if request.user.is_authenticated:
            if request.user.get_username() == self.clean_username(username, request):
                return
            # Someone else is logged in on this session: the proxy's word wins.
            auth.logout(request)
        user = auth.authenticate(request, remote_user=username)
        if user:
            request.user = user
            auth.login(request, user)

    async def aprocess_request(self, request: HttpRequest) -> None:
        await sync_to_async(self.process_request, thread_sensitive=True)(request)


class TrustedHeaderBackend(RemoteUserBackend):
    """Create unknown SSO users on first sight, as viewers; operators are promoted by hand."""

    create_unknown_user = True

    def configure_user(self, request: HttpRequest | None, user: Any, created: bool = True) -> Any:
        if created:
            group, _ = Group.objects.get_or_create(name=VIEWER)
            user.groups.add(group)
        return user


class LoginAttemptsBackend(AxesStandaloneBackend):
    """django-axes' check, first in AUTHENTICATION_BACKENDS: a locked-out name gets no login.

    It counts password logins only: an SSO login (``remote_user``) is the proxy's word, not a
    guess, and goes on working while the name is locked out for wrong passwords. API tokens
    never go through authenticate() at all.
    """

    def authenticate(  # type: ignore[override]
        self,
        request: HttpRequest,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> None:
        if "remote_user" in kwargs:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def lockout_response(request: HttpRequest, *_: Any) -> HttpResponse:
    """The page a locked-out login gets (settings.AXES_LOCKOUT_CALLABLE), status 429."""
    from django.shortcuts import render

    form = request.POST if request.method == "POST" else request.GET
    context = {
        "username": form.get("username", "")[:150],
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "minutes": settings.MRT_LOGIN_COOLOFF_MINUTES,
    }
    return render(request, "registration/locked_out.html", context, status=429)


# Failed and locked-out logins go to the audit log too. These receivers are connected when this
# module is first imported, which authenticate() does (it loads the backends above) before it
# can send either signal.
@receiver(user_login_failed, dispatch_uid="queues.operator.auth.audit_login_failed")
def audit_login_failed(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **_: Any
) -> None:
    from queues.operator.audit import record

    record(
        user=None,
        action="login-failed",
        kind="login",
        item_id=str(credentials.get("username", ""))[:120],
        reason="wrong user name or password, or locked out",
        detail=f"from {request.META.get('REMOTE_ADDR', '?')}" if request is not None else "",
        ok=False,
    )


@receiver(user_locked_out, dispatch_uid="queues.operator.auth.audit_locked_out")
def audit_locked_out(
    sender: Any,
    request: HttpRequest | None = None,
    username: str | None = None,
    ip_address: str | None = None,
    **_: Any,
) -> None:
    from queues.operator.audit import record

    record(
        user=None,
        action="login-locked-out",
        kind="login",
        item_id=str(username or "")[:120],
        reason=(
            f"{settings.AXES_FAILURE_LIMIT} failed logins: locked out for "
            f"{settings.MRT_LOGIN_COOLOFF_MINUTES} minutes"
        ),
        detail=f"from {ip_address or '?'}",
        ok=False,
    )
