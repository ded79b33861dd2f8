"""Which steps this deployment runs, from the settings alone (no daemon class is imported here,
so the services and the operator's tools may ask too; ``queues.daemons.registry`` holds the
daemon classes by these names and checks they are these, in this order).

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
daemons serve, overriding both defaults.

The values each setting may take are ``queues.core.deployment``'s, which the settings check when
they load; the checks here stay for a value set after that (the tests' ``settings`` fixture).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings

from queues.core.deployment import (
    ALL,
    BESIDE_MERRITT,
    CONSOLE_INTAKE,
    INTAKES,
    MERRITT_INTAKE,
    MODES,
    NAMES,
    STANDALONE,
    STEPS,
)
from queues.steps.merritt_ingest_client import DeploymentError, batch_intake, deployment_mode

__all__ = [
    "ALL",
    "BESIDE_MERRITT",
    "CONSOLE_INTAKE",
    "INTAKES",
    "INTAKE_STEPS",
    "LEFT_TO_MERRITT",
    "MERRITT_INTAKE",
    "MODES",
    "NAMES",
    "STANDALONE",
    "STEPS",
    "DeploymentError",
    "access_step",
    "batch_intake",
    "beside_merritt",
    "deployment_mode",
    "left_to_merritt",
    "not_owned_reason",
    "owned_steps",
    "runs_access",
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


def beside_merritt() -> bool:
    """Whether this deployment shares its queue with Merritt's services (MRT_DEPLOYMENT)."""
    return deployment_mode() == BESIDE_MERRITT


def left_to_merritt() -> frozenset[str]:
    """The daemons the deployment leaves to Merritt's services unless MRT_OWN_STEPS says."""
    left = LEFT_TO_MERRITT[deployment_mode()]
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
        return [n for n in STEPS if n not in left]
    if ALL in names:
        return list(STEPS)
    unknown = [n for n in names if n not in STEPS]
    if unknown:
        raise DeploymentError(
            f"MRT_OWN_STEPS names no daemon {', '.join(map(repr, unknown))}; "
            f"one of: {', '.join(NAMES)}"
        )
    return [n for n in STEPS if n in names]


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


def access_step(queue: str) -> str:
    """The daemon that assembles the requests of access queue ``queue`` (small, large)."""
    return f"access-{queue}"


def runs_access(queue: str) -> bool:
    """Whether this deployment's own consumer assembles the requests of ``queue``: the only
    consumer that takes a Processing request (Merritt's storage claims only Pending ones,
    mrt-zk ``Access.acquirePendingAssembly``; docs/merritt-access.md)."""
    return access_step(queue) in owned_steps()
