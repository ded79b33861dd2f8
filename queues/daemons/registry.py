"""Every consumer daemon by the name ``manage.py runconsumer NAME`` knows it by."""

from __future__ import annotations

from queues.daemons.access import AccessLarge, AccessSmall
from queues.daemons.base import Daemon
from queues.daemons.batch_pending import BatchPending
from queues.daemons.batch_reporting import BatchReporting, BatchUpdateReporting
from queues.daemons.downloading import Downloading
from queues.daemons.estimating import Estimating
from queues.daemons.job_pending import JobPending
from queues.daemons.notify import Notify
from queues.daemons.processing import Processing
from queues.daemons.provisioning import Provisioning
from queues.daemons.recording import Recording
from queues.daemons.storing import Storing

# In pipeline order: ``all --once`` runs them in this order, so one pass moves an item far.
DAEMONS: dict[str, type[Daemon]] = {
    cls.name: cls
    for cls in (
        BatchPending,
        JobPending,
        Estimating,
        Provisioning,
        Downloading,
        Processing,
        Storing,
        Recording,
        Notify,
        BatchReporting,
        BatchUpdateReporting,
        AccessSmall,
        AccessLarge,
    )
}
ALL = "all"
NAMES = (*DAEMONS, ALL)


def daemon_classes(name: str) -> list[type[Daemon]]:
    if name == ALL:
        return list(DAEMONS.values())
    try:
        return [DAEMONS[name]]
    except KeyError:
        raise ValueError(f"unknown daemon {name!r}; one of: {', '.join(NAMES)}") from None
