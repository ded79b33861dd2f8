"""API tokens: a user's own (an admin sees all), issuing one (its key shown once) and revoking."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.db import transaction
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from queues.operator import audit
from queues.operator.audit import ApiToken
from queues.operator.auth import ADMIN, VIEWER, has_role
from queues.web.forms import TokenForm

from .common import HtmxHttpRequest, console_view, error_response, only_fields, redirect_after_post


def _visible(user: Any) -> Any:
    """The tokens ``user`` may see and revoke: an admin all, anyone else their own."""
    if has_role(user, ADMIN):
        return ApiToken.objects.all()
    return ApiToken.objects.filter(user__username=user.get_username())


@require_GET
@console_view(VIEWER)
def tokens(request: HtmxHttpRequest) -> HttpResponse:
    return render(
        request,
        "queues/tokens.html",
        {"tokens": _visible(request.user).select_related("user"), "form": TokenForm()},
    )


@require_POST
@console_view(VIEWER)
def token_create(request: HtmxHttpRequest) -> HttpResponse:
    only_fields(request, TokenForm)
    form = TokenForm(request.POST)
    if not form.is_valid():
        return error_response(request, "a token needs a name", 400)
    # The token and its entry both or neither: no key that works with nobody's record of it.
    with transaction.atomic():
        token, key = ApiToken.issue(user=request.user, name=form.cleaned_data["name"])
        audit.record(
            user=request.user,
            action="create",
            kind="token",
            item_id=str(token.pk),
            after=token.prefix,
            detail=f"named {token.name!r}",
        )
    return render(request, "queues/token_created.html", {"token": token, "key": key})


@require_POST
@console_view(VIEWER)
def token_revoke(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    only_fields(request)
    token = get_object_or_404(_visible(request.user), pk=pk)
    owner = token.user.get_username()
    with transaction.atomic():
        token.delete()
        audit.record(
            user=request.user,
            action="revoke",
            kind="token",
            item_id=str(pk),
            before=token.prefix,
            detail=f"of {owner}, named {token.name!r}",
        )
    messages.success(request, f"Token {token.name} revoked")
    return redirect_after_post(reverse("tokens"))
