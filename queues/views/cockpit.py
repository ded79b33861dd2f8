"""The header's search box (issue 15's cockpit): one box that finds a job, a batch or a job by
its ARK or local ID. The rest of the cockpit lives with the resource it shows: a job's story in
``jobs.py``, a batch's summary mails in ``batches.py``, a report's export in ``reports.py``,
the hold previews in ``holds.py``."""

from __future__ import annotations

import re

from django.http import HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from queues.auth import VIEWER
from queues.zk import paths as zpaths

from .common import HtmxHttpRequest, console_view

UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


@require_GET
@console_view(VIEWER)
def search(request: HtmxHttpRequest) -> HttpResponse:
    """The header's search box: an exact job or batch ID goes straight to its page, a batch
    UUID to the batch list's lookup, anything else to the job list's search (ARK, local ID)."""
    q = request.GET.get("q", "").strip()[:300]
    if not q:
        return redirect("jobs")
    if zpaths.JID_RE.fullmatch(q):
        return redirect("job", jid=q)
    if zpaths.BID_RE.fullmatch(q):
        return redirect("batch", bid=q)
    if q.startswith("bid-") or UUID_RE.fullmatch(q):  # a batch's external ID (Merritt's)
        return redirect(f"{reverse('batches')}?{urlencode({'q': q})}")
    return redirect(f"{reverse('jobs')}?{urlencode({'q': q})}")
