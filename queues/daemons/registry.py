"""Every consumer daemon by the name ``manage.py runconsumer NAME`` knows it by, and which of
them this deployment serves.

Which steps a deployment runs (MRT_DEPLOYMENT, MRT_BATCH_INTAKE, MRT_OWN_STEPS) is decided from
the settings alone in ``queues.services.deployment``, which the services and the operator's tools
import too; this module holds the daemon classes by those names (checked to be the same, in the
same order). ``runconsumer all`` runs only the owned ones; asking for one that is not owned is
refused with the reason.
"""

from __future__ import annotations

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
from queues.services.deployment import (
    ALL,
    BESIDE_MERRITT,
    CONSOLE_INTAKE,
    INTAKE_STEPS,
    INTAKES,
    MERRITT_INTAKE,
    MODES,
    NAMES,
    STANDALONE,
    STEPS,
    DeploymentError,
    batch_intake,
    deployment_mode,
    left_to_merritt,
    not_owned_reason,
    owned_steps,
)

# In pipeline order (``queues.core.deployment.STEPS``): ``all --once`` runs them in this order.
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
if tuple(DAEMONS) != STEPS:
    raise RuntimeError(
        "queues.daemons.registry: the daemons' names differ from queues.core.deployment.STEPS "
        f"(registry {tuple(DAEMONS)}, deployment {STEPS}); keep both in pipeline order"
    )
__all__ = [
    "ALL",
    "BESIDE_MERRITT",
    "CONSOLE_INTAKE",
    "DAEMONS",
    "INTAKES",
    "INTAKE_STEPS",
    "MERRITT_INTAKE",
    "MODES",
    "NAMES",
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
