"""What one outage makes the console do is bounded by the outage, not by the jobs waiting on it:
``runconsumer all`` as shipped, over jobs of a server outside that goes away, tries that server
for its breaker's run of outages and then leaves every job alone until the breaker closes.

A callback receiver away (503 to every request, its breaker's probe included) with a notify
batch claimed: once the breaker has opened, the jobs of the batch still to step are given back
unposted (the hold looked at before each step), in one log line for those of one task, not each
posted in turn to meet the outage, its retry written, its step recorded and its line logged.
(Before, every job the loop claimed meanwhile was posted to the receiver whose breaker was
already open, three posts each: all 64 of 64 here, against the breaker's 5 now.)
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from django.conf import settings
from kazoo.client import KazooClient

from bench.loader import load_waiting
from queues.chaos.standins import Answer, CallbackReceiver, Request, running
from queues.core.states import JobState
from queues.services.zkserver import LocalZooKeeper
from queues.zk import client as zkmod
from queues.zk import paths as zpaths
from queues.zk.batches import batch_create
from queues.zk.maintenance import service_holds
from queues.zk.nodes import read_many

from .conftest import DEMO, wait_for
from .test_end_to_end import Consumers

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]

JOBS = 64
CLAIM = 32  # MRT_CLAIM_BATCH: the jobs one claim of the notify loop takes
FAILURES = 5  # MRT_BREAKER_FAILURES


class ReceiverAway(CallbackReceiver):
    """A callback receiver that answers 503 to everything, its root (the probe) too."""

    def handle(self, request: Request) -> Answer:
        return Answer(503, b"down for maintenance", "text/plain")


def _profiles(folder: Path, callback: str) -> Path:
    shutil.copytree(Path(settings.BASE_DIR) / "profiles", folder)
    path = folder / f"{DEMO}.json"
    profile = json.loads(path.read_text())
    profile["callback_url"] = callback
    path.write_text(json.dumps(profile))
    return folder


def _held(zk: KazooClient, service: str) -> bool:
    return any(hold.service == service for hold in service_holds(zk).values())


def _jobs_said(line: str) -> int:
    """The jobs a log line of results says: ``<step> waiting <why>: <n> jobs: ...``, or one."""
    found = re.search(r": (\d+) jobs: ", line)
    return int(found.group(1)) if found else 1


def _locked(zk: KazooClient, jids: list[str]) -> int:
    found = read_many(zk, [zpaths.job_node(jid, "lock") for jid in jids])
    return sum(1 for read in found.values() if read is not None)


def test_a_receiver_away_is_posted_to_for_its_breakers_run_not_for_every_job_claimed(
    server: LocalZooKeeper, tmp_path: Path
) -> None:
    zk: KazooClient = zkmod.connect(server.hosts)
    consumers = Consumers(tmp_path / "var", server.hosts)
    try:
        with running(ReceiverAway()) as receiver:
            service = f"callback 127.0.0.1:{receiver.port}"
            consumers.start(
                "all",
                MRT_PROFILES_DIR=str(_profiles(tmp_path / "profiles", receiver.url + "/hook")),
                MRT_CLAIM_BATCH=str(CLAIM),
                MRT_BREAKER_FAILURES=str(FAILURES),
            )
            log = consumers.procs[-1][1]
            wait_for(lambda: "notify: started" in log.read_text(), timeout=120)
            batch = batch_create(zk, submission={"profile": DEMO, "submitter": "tester"})
            configuration = {
                "profile": DEMO,
                "submitter": "tester",
                "payload_url": "http://127.0.0.1:9/a.txt",
                "type": "file",
            }
            jids = load_waiting(
                zk, bid=batch.bid, state=JobState.NOTIFY, count=JOBS, configuration=configuration
            )
            # The breaker opens, and the notify loop has let go of every job it claimed: what
            # it was to post in this outage it has posted.
            wait_for(
                lambda: _held(zk, service) and _locked(zk, jids) == 0,
                timeout=300,
                every=0.5,
            )
            posted = {r.path.rsplit("/mc/", 1)[1] for r in receiver.seen("POST")}
            print(f"{len(posted)} of {JOBS} jobs posted to a receiver away (claims of {CLAIM})")
            assert FAILURES <= len(posted) < 2 * FAILURES, posted
            # The jobs given back unposted are said in a line for those of one task, not a line
            # a job.
            said = log.read_text().splitlines()
            lines = [line for line in said if " waiting " in line and f"{service} held" in line]
            waited = sum(_jobs_said(line) for line in lines)
            print(f"{len(lines)} lines for {waited} jobs given back unposted")
            assert waited == 0 or len(lines) <= 4, lines
            # Every job is still in Notify, none failed: they wait for the receiver.
            folder = zpaths.job_state_folder(JobState.NOTIFY)
            assert len(zk.get_children(folder)) == JOBS
    finally:
        consumers.close()
        zk.stop()
        zk.close()
