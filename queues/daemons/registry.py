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

``MRT_OWN_STEPS`` (daemon names, comma-separated, or ``all``) names the steps this console's
daemons serve, overriding the mode's default. ``runconsumer all`` runs only those; asking for
one that is not owned is refused with the reason.
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
from queues.daemons.notify import Notify
from queues.daemons.processing import Processing
from queues.daemons.provisioning import Provisioning
from queues.daemons.recording import Recording
from queues.daemons.retention import Retention
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
        Retention,
        BulkRuns,
        ConsistencyCheck,
        Alerts,
    )
}
ALL = "all"
NAMES = (*DAEMONS, ALL)

STANDALONE = "standalone"
BESIDE_MERRITT = "beside-merritt"
MODES = (STANDALONE, BESIDE_MERRITT)
# What a mode leaves to Merritt's services unless MRT_OWN_STEPS says otherwise.
LEFT_TO_MERRITT: dict[str, frozenset[str]] = {
    STANDALONE: frozenset(),
    # Merritt's storage service also assembles access requests (its own queue consumer).
    BESIDE_MERRITT: frozenset({"storing", "recording", "access-small", "access-large"}),
}


class DeploymentError(ValueError):
    """A deployment setting that cannot work, or a daemon this deployment does not serve."""


def deployment_mode() -> str:
    mode = str(settings.MRT_DEPLOYMENT or STANDALONE).strip().lower()
    mode = mode.replace("_", "-")
    if mode not in MODES:
        raise DeploymentError(f"MRT_DEPLOYMENT must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def _names(value: object) -> list[str]:
    if isinstance(value, str):
        return [n.strip() for n in value.split(",") if n.strip()]
    if isinstance(value, Iterable):
        return [str(n).strip() for n in value if str(n).strip()]
    return []


def owned_steps() -> list[str]:
    """The daemons this deployment serves, in pipeline order."""
    mode = deployment_mode()
    names = _names(settings.MRT_OWN_STEPS)
    if not names:
        return [n for n in DAEMONS if n not in LEFT_TO_MERRITT[mode]]
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
    beside = deployment_mode() == BESIDE_MERRITT and "processing" in owned_steps()
    if beside and not settings.MRT_WORK_URL:
        problems.append(
            "beside Merritt, Processing's storage manifests must be served over HTTP for "
            "Merritt's storage service: set MRT_WORK_URL"
        )
    return problems


# The alerts' no-consumer rule looks for a consumer process of every step this deployment serves.
alert_rules.serve_steps(owned_steps)
