"""Who may do what: three roles as Django groups, checked on the server for every action.

viewer reads; operator also holds, releases, resumes and updates reporting; admin also deletes,
fails, repairs and holds whole queues. Each role is a group holding one of the permissions
declared on AuditEntry, so a superuser passes every check without being in a group.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.backends import RemoteUserBackend
from django.contrib.auth.middleware import PersistentRemoteUserMiddleware
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

VIEWER = "viewer"
OPERATOR = "operator"
ADMIN = "admin"
ROLES = (VIEWER, OPERATOR, ADMIN)

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

# (kind, action) -> the role needed. Anything missing here is refused.
ACTION_ROLES: dict[tuple[str, str], str] = {
    ("job", "hold"): OPERATOR,
    ("job", "release"): OPERATOR,
    ("job", "resume"): OPERATOR,
    ("job", "fail"): ADMIN,
    ("job", "delete"): ADMIN,
    ("batch", "release"): OPERATOR,
    ("batch", "update-reporting"): OPERATOR,
    ("batch", "delete"): ADMIN,
    ("batch", "submit"): OPERATOR,
    ("access", "resume"): OPERATOR,
    ("access", "delete"): ADMIN,
    ("collection", "hold"): OPERATOR,
    ("collection", "release"): OPERATOR,
    ("queue", "hold"): ADMIN,
    ("queue", "release"): ADMIN,
    ("consistency", "repair"): ADMIN,
}


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


def require_action(user: Any, kind: str, action: str) -> None:
    if not may(user, kind, action):
        role = ACTION_ROLES.get((kind, action), "nobody")
        raise PermissionDenied(f"{action} on a {kind} needs the {role} role")


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
                    # A redirect inside an htmx swap would paste the login page into a row.
                    response = HttpResponse(status=401)
                    response["HX-Redirect"] = settings.LOGIN_URL
                    return response
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


def _header_key() -> str:
    """The WSGI META key of the configured header: X-Remote-User -> HTTP_X_REMOTE_USER."""
    return "HTTP_" + settings.MRT_SSO_HEADER.upper().replace("-", "_")


class TrustedHeaderMiddleware(PersistentRemoteUserMiddleware):
    """Log in the user named by the trusted proxy's header (settings.MRT_SSO_HEADER).

    Persistent: a request without the header keeps its session, so password login still works
    where the proxy is bypassed. Only enable behind a proxy that strips the header from clients.
    """

    def __init__(self, get_response: Callable[..., Any]) -> None:
        super().__init__(get_response)
        self.header = _header_key()


class TrustedHeaderBackend(RemoteUserBackend):
    """Create unknown SSO users on first sight, as viewers; operators are promoted by hand."""

    create_unknown_user = True

    def configure_user(self, request: HttpRequest, user: Any, created: bool = True) -> Any:
        if created:
            group, _ = Group.objects.get_or_create(name=VIEWER)
            user.groups.add(group)
        return user
