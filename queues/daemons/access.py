"""Access small / large: assemble a stored object into an archive the requester downloads.

The token node says what to assemble in one of three documented forms (``queues.steps.access``
and docs/merritt-access.md): the console's own (``ark``, ``version``, ``content``, ``format``),
Merritt storage's assembly request document (``objectIDS``, ``versionID``, ``archiveContent``,
``archiveType``, ``filterList``), or Merritt's queue entry (``token``, ``delivery-node``, ...),
whose assembly request is read from ``MRT_ACCESS_REQUESTS_URL``. A token that does not say what
to assemble fails, permanently, with a message naming what it lacks; nothing is guessed.

The step moves the request Pending -> Processing (so the console shows it in work), builds
``MRT_DOWNLOADS_DIR/<qid>-<ark folder>[_v<n>|_all][_producer].<zip|tar|tar.gz>`` and adds to the
token ``url``, ``size``, ``sha256``, ``archive`` and ``path`` (every other key is kept, the
library's ones included), then moves it to Completed. A request found in Processing unlocked
(its consumer died, or an operator resumed it there) is simply done again: the archive is
rebuilt under the same name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from django.conf import settings

from queues.core.states import AccessState
from queues.daemons import clients
from queues.daemons.base import AccessDaemon, Next, Step, StepFailed
from queues.services.depositors import system_policy
from queues.steps.access import (
    OBJECT,
    PRODUCER,
    AssemblyRequest,
    RequestError,
    UnsupportedRequest,
    build_archive,
    resolve,
)
from queues.steps.storage import StorageError
from queues.zk.access import access_set_token, access_transition
from queues.zk.records import AccessRequest


def requested(token: dict[str, Any]) -> AssemblyRequest:
    """What the token asks for; StepFailed (permanent unless worth retrying) when unclear."""
    try:
        return resolve(
            token,
            requests_base=settings.MRT_ACCESS_REQUESTS_URL,
            timeout=settings.MRT_HTTP_TIMEOUT,
        )
    except RequestError as exc:
        raise StepFailed(str(exc), permanent=exc.permanent) from exc


class AccessSmall(AccessDaemon):
    name: ClassVar[str] = "access-small"
    step: ClassVar[str] = "access-small"
    queue: ClassVar[str] = "small"
    queue_hold: ClassVar[str | None] = "access-small"

    def prepare(self, item: AccessRequest) -> AccessRequest:
        if item.state == AccessState.PENDING:
            return access_transition(self.zk, item, AccessState.PROCESSING, holder=True)
        return item

    def work(self, item: AccessRequest) -> Step:
        request = requested(item.token)
        try:
            archive = build_archive(
                storage=clients.storage(),
                ark=request.ark,
                downloads_dir=Path(settings.MRT_DOWNLOADS_DIR),
                version=request.version,
                producer_only=request.content == PRODUCER,
                all_versions=request.content == OBJECT,
                archive_type=request.archive_type,
                exclude=request.exclude,
                # The queue in the name: small and large number their requests independently.
                name=f"{item.queue}-{item.qid}-{request.archive_name()}",
                timeout=settings.MRT_HTTP_TIMEOUT,
                retries=settings.MRT_DOWNLOAD_RETRIES,
                file_roots=clients.internal_roots(),
                policy=system_policy(),
            )
        except UnsupportedRequest as exc:
            raise StepFailed(str(exc), permanent=True) from exc
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
        detail = f"{archive.size} bytes" + (
            "" if request.form == "console" else f" ({request.form})"
        )
        return Next(AccessState.COMPLETED, detail)


class AccessLarge(AccessSmall):
    name: ClassVar[str] = "access-large"
    step: ClassVar[str] = "access-large"
    queue: ClassVar[str] = "large"
    queue_hold: ClassVar[str | None] = "access-large"
