"""Access small / large: assemble a stored object into a zip the requester downloads.

The token (opaque JSON, written by whoever asked) names the object:

    ark | object | objectID     the object's ARK (required)
    version                     a version number (optional; the latest by default)
    content: "producer"         only the depositor's files, without system/ (optional)

The step moves the request Pending -> Processing (so the console shows it in work), builds
``MRT_DOWNLOADS_DIR/<qid>-<ark folder>[_v<n>].zip`` and adds to the token ``url``, ``size``,
``sha256``, ``archive`` and ``path``, then moves it to Completed. A request found in Processing
unlocked (its consumer died, or an operator resumed it there) is simply done again: the zip is
rebuilt under the same name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from django.conf import settings

from queues.daemons import clients
from queues.daemons.base import AccessDaemon, Next, Step, StepFailed
from queues.steps.access import archive_name, build_archive
from queues.steps.storage import StorageError
from queues.zk.access import access_set_token, access_transition
from queues.zk.records import AccessRequest

ARK_KEYS = ("ark", "object", "objectID", "object_id")


def requested(token: dict[str, Any]) -> tuple[str, int | None, bool]:
    ark = next((token[k] for k in ARK_KEYS if isinstance(token.get(k), str) and token[k]), "")
    if not ark:
        raise StepFailed("the token names no object (ark)", permanent=True)
    version = token.get("version")
    if isinstance(version, str) and version.isdigit():
        version = int(version)
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise StepFailed(f"version {version!r} is not a number", permanent=True)
    return ark, version, token.get("content") == "producer"


class AccessSmall(AccessDaemon):
    name: ClassVar[str] = "access-small"
    step: ClassVar[str] = "access-small"
    queue: ClassVar[str] = "small"
    queue_hold: ClassVar[str | None] = "access-small"

    def prepare(self, item: AccessRequest) -> AccessRequest:
        if item.state == "Pending":
            return access_transition(self.zk, item, "Processing")
        return item

    def work(self, item: AccessRequest) -> Step:
        ark, version, producer_only = requested(item.token)
        name = f"{item.qid}-{archive_name(ark, version, producer_only=producer_only)}"
        try:
            archive = build_archive(
                storage=clients.storage(),
                ark=ark,
                downloads_dir=Path(settings.MRT_DOWNLOADS_DIR),
                version=version,
                producer_only=producer_only,
                name=name,
                timeout=settings.MRT_HTTP_TIMEOUT,
                retries=settings.MRT_DOWNLOAD_RETRIES,
                file_roots=clients.internal_roots(),
            )
        except StorageError as exc:
            raise StepFailed(str(exc)) from exc
        token = dict(item.token)
        token.update(
            url=clients.download_url(archive.path.name),
            size=archive.size,
            sha256=archive.sha256,
            archive=archive.path.name,
            path=str(archive.path),
        )
        access_set_token(self.zk, item, token)
        return Next("Completed", f"{archive.size} bytes")


class AccessLarge(AccessSmall):
    name: ClassVar[str] = "access-large"
    step: ClassVar[str] = "access-large"
    queue: ClassVar[str] = "large"
    queue_hold: ClassVar[str | None] = "access-large"
