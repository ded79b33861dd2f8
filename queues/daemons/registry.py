"""Every consumer daemon by the name ``manage.py runconsumer NAME`` knows it by, and which of
them this deployment serves.

Two deployment modes (setting ``MRT_DEPLOYMENT``):

* ``standalone`` (the default): every step is this console's, with local storage, inventory and
  minter unless MRT_STORAGE_URL, MRT_INVENTORY_URL or MRT_EZID_URL name real services.
* ``beside-merritt``: the console manages a ZooKeeper queue shared with Merritt's own services.
  Processing writes the ``store`` and ``inventory`` job nodes exactly as Merritt's ingest does and
  leaves the job in Storing: Merritt's storage service claims Storing jobs and its inventory
  service Recording jobs (and storage assembles access requests), so by default this console's
  daemons serve every step but ``storing``, ``recording``, ``access-small`` and ``access-large``.

Beside Merritt, ``MRT_BATCH_INTAKE`` says who takes new batches through ingest:

* ``merritt`` (the default beside Merritt): Merritt's ingest service. A submission made through
  the console is sent to its ``/poster/submit`` (``queues/steps/merritt_ingest_client.py``), so
  the console writes no Pending batch its consumers would take, and this console's daemons leave
  every step Merritt's ingest consumers acquire to them (``INTAKE_STEPS``: batch-pending, the job
  steps Pending to Processing, Notify, and batch reporting).
* ``console``: this console's daemons run intake; Merritt's ingest service must not consume the
  queue (docs/merritt-ownership.md says why no node form keeps its consumers off our items).
  Standalone, ``console`` is the only value.

``MRT_OWN_STEPS`` (daemon names, comma-separated, or ``all``) names the steps this console's
daemons serve, overriding both defaults. ``runconsumer all`` runs only those; asking for one
that is not owned is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings

from queues.daemons import alert_rules
from queues.daemons.access import AccessLarge, AccessSmall
from queues.daemons.alerts import Alerts
from queues.daemons.base import Daemon
from queues.daemons.batch_pending import BatchPending
from queues.daemons.batch_reporting import BatchReporting, BatchUpdateReporting
from queues.daemons.bulk_runs import BulkRuns
from queues.daemons.consistency import ConsistencyCheck
from queues.daemons.downloading import Downloading
from queues.daemons.estimating import Estimating
from queues.daemons.job_pending import JobPending
from queues.daemons.maintenance import Maintenance
from queues.daemons.notify import Notify
from queues.daemons.processing import Processing
from queues.daemons.provisioning import Provisioning
from queues.daemons.recording import Recording
from queues.daemons.retention import Retention
from queues.daemons.storing import Storing
from queues.steps.merritt_ingest_client import (
    BESIDE_MERRITT,
    CONSOLE_INTAKE,
    INTAKES,
    MERRITT_INTAKE,
    MODES,
    STANDALONE,
    DeploymentError,
    batch_intake,
    deployment_mode,
)

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
        Maintenance,
        Retention,
        BulkRuns,
        ConsistencyCheck,
        Alerts,
    )
}
ALL = "all"
NAMES = (*DAEMONS, ALL)
__all__ = [
    "BESIDE_MERRITT",
    "CONSOLE_INTAKE",
    "DAEMONS",
    "INTAKES",
    "INTAKE_STEPS",
    "MERRITT_INTAKE",
    "MODES",
    "STANDALONE",
    "DeploymentError",
    "batch_intake",
    "daemon_classes",
    "deployment_mode",
    "deployment_problems",
    "left_to_merritt",
    "not_owned_reason",
    "owned_steps",
]

# What a mode leaves to Merritt's services unless MRT_OWN_STEPS says otherwise.
LEFT_TO_MERRITT: dict[str, frozenset[str]] = {
    STANDALONE: frozenset(),
    # Merritt's storage service also assembles access requests (its own queue consumer).
    BESIDE_MERRITT: frozenset({"storing", "recording", "access-small", "access-large"}),
}


# The daemons whose items Merritt's ingest consumers acquire (read in CDLUC3/mrt-ingest's
# consumer/*.java; docs/merritt-ownership.md): its BatchConsumer (acquirePendingBatch), its job
# consumers for Pending, Estimating, Provisioning, Downloading, Processing and Notify, and its
# BatchReportConsumer / UpdateBatchReportConsumer. Recording is already Merritt's beside it.
INTAKE_STEPS = frozenset(
    {
        "batch-pending",
        "pending",
        "estimating",
        "provisioning",
        "downloading",
        "processing",
        "notify",
        "batch-reporting",
        "batch-update-reporting",
    }
)


def left_to_merritt() -> frozenset[str]:
    """The daemons the deployment leaves to Merritt's services unless MRT_OWN_STEPS says."""
    mode = deployment_mode()
    left = LEFT_TO_MERRITT[mode]
    if batch_intake() == MERRITT_INTAKE:
        left = left | INTAKE_STEPS
    return left


def _names(value: object) -> list[str]:
    if isinstance(value, str):
        return [n.strip() for n in value.split(",") if n.strip()]
    if isinstance(value, Iterable):
        return [str(n).strip() for n in value if str(n).strip()]
    return []


def owned_steps() -> list[str]:
    """The daemons this deployment serves, in pipeline order."""
    left = left_to_merritt()
    names = _names(settings.MRT_OWN_STEPS)
    if not names:
        return [n for n in DAEMONS if n not in left]
    if ALL in names:
        return list(DAEMONS)
    unknown = [n for n in names if n not in DAEMONS]
    if unknown:
        raise DeploymentError(
            f"MRT_OWN_STEPS names no daemon {', '.join(map(repr, unknown))}; "
            f"one of: {', '.join(NAMES)}"
        )
    return [n for n in DAEMONS if n in names]


def not_owned_reason(name: str) -> str:
    mode = deployment_mode()
    if _names(settings.MRT_OWN_STEPS):
        why = f"MRT_OWN_STEPS does not name it ({', '.join(owned_steps()) or 'nothing'})"
    elif name in INTAKE_STEPS and batch_intake() == MERRITT_INTAKE:
        why = (
            f"MRT_DEPLOYMENT={mode} with MRT_BATCH_INTAKE={MERRITT_INTAKE} leaves it to "
            "Merritt's ingest service"
        )
    else:
        why = f"MRT_DEPLOYMENT={mode} leaves it to Merritt's services"
    return f"{name} is not a step this deployment serves: {why}"


def daemon_classes(name: str) -> list[type[Daemon]]:
    """The classes ``runconsumer NAME`` runs: ``all`` is every owned daemon."""
    if name == ALL:
        return [DAEMONS[n] for n in owned_steps()]
    if name not in DAEMONS:
        raise ValueError(f"unknown daemon {name!r}; one of: {', '.join(NAMES)}")
    if name not in owned_steps():
        raise DeploymentError(not_owned_reason(name))
    return [DAEMONS[name]]


def deployment_problems() -> list[str]:
    """Settings under which the owned daemons cannot work with Merritt's services (empty when
    they can): beside Merritt, storage must be able to fetch the manifests Processing writes."""
    problems = []
    batch_intake()  # a bad MRT_BATCH_INTAKE is refused here too, with its reason
    beside = deployment_mode() == BESIDE_MERRITT and "processing" in owned_steps()
    if beside and not settings.MRT_WORK_URL:
        problems.append(
            "beside Merritt, Processing's storage manifests must be served over HTTP for "
            "Merritt's storage service: set MRT_WORK_URL"
        )
    return problems


# The alerts' no-consumer rule looks for a consumer process of every step this deployment serves.
alert_rules.serve_steps(owned_steps)
