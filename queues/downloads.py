"""Serves the archives the access consumers assemble under MRT_DOWNLOADS_DIR."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpRequest
from django.views.decorators.http import require_GET

# qid0000000001-ark+=99999=fk4abc_v1.zip: no slash, no leading dot, nothing but these characters.
ARCHIVE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=-]{0,250}\.zip$")


@login_required
@require_GET
def download(request: HttpRequest, name: str) -> FileResponse:
    if not ARCHIVE_NAME_RE.fullmatch(name) or ".." in name:
        raise Http404("no such archive")
    path = Path(settings.MRT_DOWNLOADS_DIR) / name
    if not path.is_file():
        raise Http404("no such archive")
    return FileResponse(path.open("rb"), as_attachment=True, filename=name)
