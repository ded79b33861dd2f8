"""What a depositor's URLs may reach, from settings in this one place.

Every request the system makes for a depositor (estimating's HEADs, downloads, manifests,
callbacks, and the checks at the submission doors) uses :func:`depositor_policy`, and their
``file://`` URLs may read only under :func:`payload_roots`. The system's own requests (to
Merritt's storage and inventory on its own network, its own working folders) use
:func:`system_policy`: any address, the same bounds on the whole exchange.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from django.conf import settings

from queues.steps.netpolicy import SYSTEM, FetchPolicy, parse_networks


def payload_roots() -> list[Path]:
    """Folders a depositor's file:// URLs (payloads, manifests, the files they list) may read.

    MRT_FILE_ROOTS, and nothing when it is empty: a depositor must not be able to ask for
    file:///etc/passwd, or for another deposit's working folder.
    """
    roots = settings.MRT_FILE_ROOTS
    if isinstance(roots, str):
        roots = [r for r in roots.split(":") if r.strip()]
    return [Path(r) for r in roots or ()]


def depositor_policy(*, timeout: float | None = None) -> FetchPolicy:
    key = (
        settings.MRT_FETCH_ALLOW,
        settings.MRT_FETCH_MAX_REDIRECTS,
        settings.MRT_HTTP_TIMEOUT if timeout is None else timeout,
        settings.MRT_DOWNLOAD_DEADLINE,
        settings.MRT_DOWNLOAD_MIN_RATE,
        settings.MRT_DOWNLOAD_RATE_WINDOW,
    )
    return _policy(*key)


@functools.lru_cache(maxsize=32)
def _policy(
    allow: str,
    max_redirects: int,
    timeout: float,
    deadline: float | None,
    min_rate: int,
    rate_window: float,
) -> FetchPolicy:
    """The policy of these settings, made once (the downloading loop asks for every job)."""
    return FetchPolicy(
        restrict=True,
        allow=parse_networks(allow),
        max_redirects=max_redirects,
        timeout=timeout,
        deadline=deadline or None,
        min_rate=min_rate,
        rate_window=rate_window,
    )


def system_policy() -> FetchPolicy:
    """The policy of the system's own requests (local storage's manifests and files, the local
    inventory's manifests, an access request's files): any address, with the downloads'
    deadline and minimum rate for the whole exchange."""
    return _system_policy(
        settings.MRT_HTTP_TIMEOUT,
        settings.MRT_DOWNLOAD_DEADLINE,
        settings.MRT_DOWNLOAD_MIN_RATE,
        settings.MRT_DOWNLOAD_RATE_WINDOW,
    )


@functools.lru_cache(maxsize=32)
def _system_policy(
    timeout: float, deadline: float | None, min_rate: int, rate_window: float
) -> FetchPolicy:
    return dataclasses.replace(
        SYSTEM,
        timeout=timeout,
        deadline=deadline or None,
        min_rate=min_rate,
        rate_window=rate_window,
    )


def in_request_policy() -> FetchPolicy:
    """The depositor policy for what a web request reads while its client waits (a batch
    manifest given by URL, sent on to Merritt's ingest): one short deadline for the whole
    exchange, ``MRT_IN_REQUEST_FETCH_SECONDS``, instead of the downloads' hours; below the
    policy's rate floor it is cut off sooner still."""
    policy = depositor_policy()
    seconds = float(settings.MRT_IN_REQUEST_FETCH_SECONDS)
    deadline = seconds if policy.deadline is None else min(seconds, policy.deadline)
    return dataclasses.replace(policy, deadline=deadline, timeout=min(policy.timeout, deadline))
