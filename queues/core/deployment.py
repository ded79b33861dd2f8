"""The values the deployment settings may take, as data: ``MRT_DEPLOYMENT`` (a mode),
``MRT_BATCH_INTAKE`` (who takes new batches through ingest) and ``MRT_OWN_STEPS`` (daemon names,
or ``all``). ``mrtadmin/settings.py`` refuses any other value while the settings load, so the web
process and the daemons alike start only on one of these; ``queues.services.deployment`` decides
from them which steps this console serves (docs/merritt-ownership.md)."""

from __future__ import annotations

STANDALONE = "standalone"
BESIDE_MERRITT = "beside-merritt"
MODES = (STANDALONE, BESIDE_MERRITT)

MERRITT_INTAKE = "merritt"
CONSOLE_INTAKE = "console"
INTAKES = (MERRITT_INTAKE, CONSOLE_INTAKE)

# Every consumer daemon's name, in pipeline order: ``runconsumer all --once`` runs them in this
# order, so one pass moves an item far (``queues.daemons.registry`` checks its classes are these).
STEPS: tuple[str, ...] = (
    "batch-pending",
    "pending",
    "estimating",
    "provisioning",
    "downloading",
    "processing",
    "storing",
    "recording",
    "notify",
    "batch-reporting",
    "batch-update-reporting",
    "access-small",
    "access-large",
    "maintenance",
    "retention",
    "bulk-runs",
    "consistency",
    "alerts",
)
ALL = "all"
NAMES = (*STEPS, ALL)
