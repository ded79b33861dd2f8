"""Storage-node holds (issue 24): jobs bound for a held node wait, unclaimed, in Storing and
Recording; jobs for other nodes go on; released, the waiting jobs complete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from queues.daemons.storing import Storing
from queues.zk.jobs import job_load
from queues.zk.maintenance import job_store_node, node_hold_clear, node_hold_set
from queues.zk.waits import node_holds_watch

from .conftest import DEMO, FileServer, daemon, drive, make_job, wait_for

pytestmark = pytest.mark.django_db


def _stored_on(zk, files: FileServer, profiles: Path, node: str, name: str):
    """A job processed for storage node ``node`` (its profile's node): its store node names it."""
    path = profiles / f"{DEMO}.json"
    profile = json.loads(path.read_text())
    profile["storage_node"] = node
    path.write_text(json.dumps(profile))
    job = make_job(
        zk,
        {"payload_url": files.put(name, name), "type": "file", "filename": name},
        state="Downloading",
    )
    drive(zk, lambda: job_load(zk, job.jid).state == "Storing", names=["downloading", "processing"])
    job = job_load(zk, job.jid)
    assert job_store_node(job) == int(node)
    return job


def test_jobs_for_a_held_node_wait_while_jobs_for_other_nodes_complete(
    zk, files: FileServer, profiles: Path
) -> None:
    on_a = _stored_on(zk, files, profiles, "9501", "a.txt")
    on_b = _stored_on(zk, files, profiles, "9502", "b.txt")
    assert node_hold_set(zk, 9501, by="ops", reason="node 9501 down")
    drive(zk, lambda: job_load(zk, on_b.jid).state == "Notify", names=["storing", "recording"])
    # Not claimed at all: no failure, no message, no retry.
    waiting = job_load(zk, on_a.jid)
    assert waiting.state == "Storing" and waiting.status.version == on_a.status.version
    assert not Storing(zk=zk).run_once()
    assert node_hold_clear(zk, 9501)
    drive(zk, lambda: job_load(zk, on_a.jid).state == "Notify", names=["storing", "recording"])


def test_a_job_stored_before_the_hold_waits_in_recording(
    zk, files: FileServer, profiles: Path
) -> None:
    job = _stored_on(zk, files, profiles, "9501", "c.txt")
    daemon(zk, "storing").run_once()
    assert job_load(zk, job.jid).state == "Recording"
    node_hold_set(zk, 9501)
    assert not daemon(zk, "recording").run_once()
    assert job_load(zk, job.jid).state == "Recording"
    node_hold_clear(zk, 9501)
    # The loops see holds through the process's watch of them (queues.zk.waits), not a read a
    # look: the release is theirs once the watch has told it (CI once looked before).
    wait_for(lambda: not node_holds_watch(zk).held(), timeout=30)
    assert daemon(zk, "recording").run_once()
    assert job_load(zk, job.jid).state == "Notify"


def test_a_hold_of_another_node_or_a_malformed_store_node_holds_nothing(
    zk, files: FileServer, profiles: Path
) -> None:
    job = _stored_on(zk, files, profiles, "9501", "d.txt")
    node_hold_set(zk, 1)
    assert daemon(zk, "storing").run_once()
    assert job_load(zk, job.jid).state == "Recording"


class _LiftedRightAfterTheAnswer:
    """The watch's client, but for ``get_children``: the server answers (one node held, the
    watch set), then another client lifts the hold and the watch fires, before the caller goes
    on (the interleaving of a hold lifted just as a loop first lists the holds)."""

    def __init__(self, zk, other_zk, node: int, fired) -> None:
        self._zk, self._other, self._node, self._fired = zk, other_zk, node, fired

    def get_children(self, path, watch=None):
        names = self._zk.get_children(path, watch=watch)
        if names and not self._fired.is_set():
            node_hold_clear(self._other, self._node)
            assert self._fired.wait(30), "the watch did not fire"
        return names

    def __getattr__(self, name):
        return getattr(self._zk, name)


def test_a_node_hold_lifted_as_the_watch_is_set_is_seen_lifted(zk, other_zk) -> None:
    """A lifted hold must not stay in the watch's answer for good (its storing loop would pass
    over that node's jobs until its session ended)."""
    import threading

    from queues.zk.waits import NodeHoldsWatch

    node_hold_set(other_zk, 9501, by="op", reason="maintenance")
    woken = threading.Event()
    watch = NodeHoldsWatch(zk)
    watch.subscribe(woken)
    watch._zk = _LiftedRightAfterTheAnswer(zk, other_zk, 9501, woken)

    assert watch.held() == frozenset({9501})  # the answer as the server gave it
    assert woken.is_set()
    assert watch.held() == frozenset()  # listed again, not kept
    woken.clear()
    node_hold_set(other_zk, 9502)
    assert woken.wait(30)  # armed again: the next change is seen
    assert watch.held() == frozenset({9502})
