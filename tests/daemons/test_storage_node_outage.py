"""The storage-node outage, end to end (issue 24): jobs for node A (9501) and node B (9502) in
flight; node A's storage fails some jobs before anyone notices; node A is held, its later jobs
wait while node B's complete; node A comes back and is released; "resume what failed on node A
in the window" (the console's preview, then its bulk resume) completes the failed ones. The
node-held alert (the operator's own hold: once it has lasted MRT_ALERT_HAND_HOLD_AFTER) fired
once and resolved once, by mail and by webhook."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from alerts.conftest import Webhook, a_moment, later, mails_with, only, smtp, webhook  # noqa: F401 - fixtures
from django.test import Client
from django.utils import timezone

from queues.chaos.standins import InventoryStandIn, StorageStandIn, running
from queues.daemons.alerting import Evaluator, deliver_due
from queues.models import AlertEpisode, AuditEntry
from queues.zk.jobs import job_load
from queues.zk.maintenance import node_held, node_holds
from tests.console.conftest import make_user  # noqa: F401 - a fixture

from .conftest import DEMO, FileServer, drive, make_job
from .test_storing_recording import _served

pytestmark = pytest.mark.django_db

QUIET = 60.0
HAND_HOLD = 120.0  # seconds an operator's own hold lasts before it pages


def _for_node(zk: Any, files: FileServer, profiles: Path, node: int, name: str) -> Any:
    path = profiles / f"{DEMO}.json"
    profile = json.loads(path.read_text())
    profile["storage_node"] = str(node)
    path.write_text(json.dumps(profile))
    job = make_job(
        zk,
        {"payload_url": files.put(name, name * 3), "type": "file", "filename": name},
        state="Downloading",
    )
    drive(zk, lambda: job_load(zk, job.jid).state == "Storing", names=["downloading", "processing"])
    return job


def _local(moment: Any) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%dT%H:%M:%S")


def test_a_storage_node_outage_from_first_failure_to_every_job_stored(
    zk: Any,
    files: FileServer,
    profiles: Path,
    settings: Any,
    smtp: Any,  # noqa: F811 - the imported fixture
    webhook: Webhook,  # noqa: F811
    make_user: Any,  # noqa: F811
) -> None:
    only("node-held", quiet_seconds=QUIET, threshold=0.0)
    settings.MRT_ALERT_HAND_HOLD_AFTER = HAND_HOLD
    evaluator = Evaluator(name="scenario")
    operator = Client()
    operator.force_login(make_user("operator", "olga"))
    steps = ["storing", "recording"]
    with (
        running(StorageStandIn(nodes=(9502,))) as storage,  # node 9501 is down
        running(InventoryStandIn()) as inventory,
        _served(Path(settings.MRT_WORK_DIR)) as work_url,
    ):
        settings.MRT_STORAGE_URL = storage.url
        settings.MRT_INVENTORY_URL = inventory.url
        settings.MRT_WORK_URL = work_url
        window_start = timezone.now() - timedelta(seconds=1)

        # Before anyone notices: node A's storage fails two jobs; node B's job completes.
        early_a = [_for_node(zk, files, profiles, 9501, f"a{i}.txt") for i in range(2)]
        first_b = _for_node(zk, files, profiles, 9502, "b0.txt")
        drive(
            zk,
            lambda: (
                all(job_load(zk, j.jid).state == "Failed" for j in early_a)
                and job_load(zk, first_b.jid).state == "Notify"
            ),
            names=steps,
        )
        assert "9501" in job_load(zk, early_a[0].jid).status.message
        t0 = a_moment()
        assert evaluator.evaluate(zk=zk, now=t0) == []

        # Node A held: its later jobs wait unclaimed, node B's go on.
        response = operator.post(
            "/holds/node/", {"node": "9501", "reason": "node 9501 unreachable"}
        )
        assert response.status_code == 303 and node_held(zk, 9501)
        late_a = [_for_node(zk, files, profiles, 9501, f"a{i}.txt") for i in range(2, 4)]
        more_b = [_for_node(zk, files, profiles, 9502, f"b{i}.txt") for i in range(1, 3)]
        drive(zk, lambda: all(job_load(zk, j.jid).state == "Notify" for j in more_b), names=steps)
        for job in late_a:
            waiting = job_load(zk, job.jid)
            assert waiting.state == "Storing" and waiting.status.message == ""
        # The operator's own hold pages only once it has lasted MRT_ALERT_HAND_HOLD_AFTER.
        held_at = node_holds(zk)[9501].at
        assert held_at is not None
        assert evaluator.evaluate(zk=zk, now=later(held_at, 5)) == []
        fired = evaluator.evaluate(zk=zk, now=later(held_at, HAND_HOLD + 1))
        assert len(fired) == 1 and "node-held" in fired[0]
        for step in (10, 20, 30):
            assert evaluator.evaluate(zk=zk, now=later(held_at, HAND_HOLD + step)) == []
        t0 = later(held_at, HAND_HOLD)

        # Node A back; released: the waiting jobs complete.
        storage.nodes.add(9501)
        assert operator.post("/holds/node/9501/release/").status_code == 303
        drive(zk, lambda: all(job_load(zk, j.jid).state == "Notify" for j in late_a), names=steps)

        # What failed on node A in the window: the preview lists exactly those two.
        window_end = timezone.now() + timedelta(seconds=1)
        page = operator.get(
            "/holds/node-failed/",
            {"node": "9501", "since": _local(window_start), "before": _local(window_end)},
        )
        assert page.status_code == 200
        html = page.content.decode()
        assert "2 jobs failed on node 9501" in html
        listed = set(re.findall(r'id="node-failed-(jid[0-9]{10})"', html))
        assert listed == {j.jid for j in early_a}
        items = re.findall(r'name="item" value="(jid[0-9]{10}:[0-9]+)"', html)
        resumed = operator.post(
            "/failed/bulk/",
            {"action": "resume", "scope": "selection", "item": items, "reason": "node 9501 back"},
        )
        assert resumed.status_code == 200
        assert AuditEntry.objects.filter(kind="job", action="resume", ok=True).count() == 2
        drive(zk, lambda: all(job_load(zk, j.jid).state == "Notify" for j in early_a), names=steps)
        for job in early_a:
            assert storage.objects[(9501, job_load(zk, job.jid).primary_id)]

        # The alert resolves once, after its quiet period.
        cleared = later(t0, 40)
        assert evaluator.evaluate(zk=zk, now=cleared) == []
        resolved = evaluator.evaluate(zk=zk, now=later(cleared, QUIET))
        assert len(resolved) == 1 and "resolved" in resolved[0]
        assert evaluator.evaluate(zk=zk, now=later(cleared, QUIET + 30)) == []
        deliver_due(now=later(cleared, QUIET + 30))
        [episode] = AlertEpisode.objects.filter(kind="node-held")
        assert episode.key == "9501" and episode.resolved is not None
        assert len(mails_with(smtp, "ALERT")) == 1 and len(mails_with(smtp, "RESOLVED")) == 1
        texts = [p["json"]["text"] for p in webhook.posts]
        assert sum("ALERT" in t for t in texts) == 1 and sum("RESOLVED" in t for t in texts) == 1
