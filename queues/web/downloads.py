"""Serves the archives the access consumers assemble under MRT_DOWNLOADS_DIR.

Who may fetch an archive:

* the holder of its access request's token: the ``token`` string in the request's ``token``
  node (a UUID in Merritt), given as ``?token=...`` or in an ``X-Access-Token`` header, with
  or without a login. The archive's name begins with the request's queue and qid
  (``small-qid0000000001-ark+=99999=fk4abc_v1.zip``), and when the token node names its archive
  (``archive``, written by the access consumer) it must be this one. Tokens shorter than
  ``MIN_TOKEN_LENGTH`` are never accepted as a credential;
* a logged-in operator or admin, who may fetch any archive (to check what a requester got).

Anyone else is refused: a viewer with 403, a wrong token with 404 (as for a missing archive, so
that names cannot be probed), no login and no token with the login page.
"""

from __future__ import annotations

import hmac
import re
from pathlib import Path

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.views.decorators.http import require_GET

from queues.operator.auth import OPERATOR, has_role
from queues.zk.access import access_load
from queues.zk.client import client
from queues.zk.errors import MalformedNode, NotFound, is_connection_error
from queues.zk.paths import ACCESS_QUEUES
from queues.zk.records import AccessRequest

# small-qid0000000001-ark+=99999=fk4abc_v1.zip (or .tar, .tar.gz: the access consumers' archive
# types): no slash, no leading dot, nothing but these characters.
ARCHIVE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=-]{0,250}\.(zip|tar|tar\.gz)$")
# The queue prefix is absent from archives built before it was added.
QID_PREFIX_RE = re.compile(r"^(?:(small|large)-)?(qid[0-9]{10})-")
MIN_TOKEN_LENGTH = 16


def presented_token(request: HttpRequest) -> str:
    return (request.GET.get("token") or request.META.get("HTTP_X_ACCESS_TOKEN") or "").strip()


def _token_fits(item: AccessRequest, name: str, presented: str) -> bool:
    expected = item.token.get("token")
    if not isinstance(expected, str) or len(expected) < MIN_TOKEN_LENGTH:
        return False
    archive = item.token.get("archive")
    if archive is not None and archive != name:
        return False
    return hmac.compare_digest(expected.encode(), presented.encode())


def token_grants(name: str, presented: str) -> bool:
    """Whether ``presented`` is the token of the access request this archive was built for."""
    match = QID_PREFIX_RE.match(name)
    if not match or len(presented) < MIN_TOKEN_LENGTH:
        return False
    zk = client()
    # small and large number their requests independently: the name says which one.
    queues = (match.group(1),) if match.group(1) else ACCESS_QUEUES
    for queue in queues:
        try:
            item = access_load(zk, queue, match.group(2))
        except (NotFound, MalformedNode):
            continue
        if _token_fits(item, name, presented):
            return True
    return False


@require_GET
def download(request: HttpRequest, name: str) -> HttpResponseBase:
    if not ARCHIVE_NAME_RE.fullmatch(name) or ".." in name:
        raise Http404("no such archive")
    token = presented_token(request)
    if has_role(request.user, OPERATOR):
        pass
    elif token:
        try:
            allowed = token_grants(name, token)
        except Exception as exc:
            if not is_connection_error(exc):
                raise
            response = JsonResponse({"error": f"ZooKeeper is unavailable: {exc}"}, status=503)
            response["Retry-After"] = "10"
            return response
        if not allowed:
            raise Http404("no such archive")
    elif not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    else:
        return HttpResponse(
            "Archives are for the holder of the access request's token, or an operator.\n",
            status=403,
            content_type="text/plain; charset=utf-8",
        )
    path = Path(settings.MRT_DOWNLOADS_DIR) / name
    if not path.is_file():
        raise Http404("no such archive")
    return FileResponse(path.open("rb"), as_attachment=True, filename=name)
