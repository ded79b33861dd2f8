"""The retention archive when ZooKeeper is lost part-way through a batch's removal, caused for
real: a proxy between the archiver's client and the server lets the chosen request reach the
server (which applies it) and closes the connection before the answer comes back. The sweep
ends there, saying what it did; the batch is left marked Deleted with its row, never Completed
or Failed with jobs gone; the next sweep, once the client is back, finishes it."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from kazoo.exceptions import ConnectionLoss

from queues.core.roles import ADMIN
from queues.models import ArchivedBatch, ArchivedJob
from queues.operator import archive
from queues.operator.audit import AuditEntry
from queues.operator.auth import ensure_groups
from queues.zk import batches, paths
from queues.zk.batches import BEING_DELETED
from tests.zkproxy import MULTI, ZkProxy, request
from tests.zktree import shared_client_on

from .test_archive import exists

pytestmark = pytest.mark.zookeeper

NOW = timedelta(0)


def _sweep_until_lost(client: Any) -> list[archive.ArchiveOutcome]:
    said: list[archive.ArchiveOutcome] = []
    with pytest.raises(ConnectionLoss):
        for outcome in archive.sweep(older_than=NOW, zk=client):
            said.append(outcome)
    return said


def _wait_connected(client: Any) -> None:
    """Until the client has its session back through the proxy (the link is open again)."""
    client.exists("/")  # kazoo queues it until the connection is back, then answers


@pytest.mark.parametrize("lost_at", ["the batch's mark", "the second job's removal"])
def test_zookeeper_lost_part_way_leaves_a_deleted_batch_the_next_sweep_finishes(
    lost_at: str,
    database: str,
    zk: Any,
    proxy: ZkProxy,
    proxied_client: Any,
    finished_batch: Any,
) -> None:
    batch, made = finished_batch(("Completed", "Completed", "Failed"))
    made = sorted(made, key=lambda j: j.jid)  # the order the removal takes them in
    client = proxied_client()
    if lost_at == "the batch's mark":
        cut = request(MULTI, BEING_DELETED.encode())
    else:
        cut = request(MULTI, made[1].jid.encode())
    proxy.cut_after(cut)

    said = _sweep_until_lost(client)
    assert proxy.fired.is_set()
    # The request the connection was lost with usually reached the server and was applied;
    # when the closing link beat it there, it was not. Either way the same must hold. Another
    # session's read right after the loss may come before the server applies it (and the next
    # sweep then finds a job fewer than counted here): the archiver's own session reads once
    # it is back, when the server has applied that request or closed its link unread.
    _wait_connected(client)
    left = batches.batch_load(client, batch.bid)
    gone = [not exists(client, paths.job(j.jid)) for j in made]
    if lost_at == "the batch's mark":
        assert said == [] and gone == [False, False, False]
        marked = left.state == "Deleted"
        if not marked:  # not applied: nothing was written at all
            assert left.status.version == batch.status.version
    else:
        # The sweep said what it did before it ended: the first job's removal was answered.
        (outcome,) = said
        assert (outcome.bid, outcome.done, outcome.partway) == (batch.bid, False, True)
        assert outcome.jobs == 1
        assert "stopped part-way (ConnectionLoss)" in outcome.detail
        assert gone[0] and not gone[2]
        marked = True
    if marked:
        # Never Completed or Failed with jobs gone: marked Deleted, its row written before.
        assert (left.state, left.status.message) == ("Deleted", BEING_DELETED)
    row = ArchivedBatch.objects.get(bid=batch.bid)
    assert row.final_state == "Failed"
    assert ArchivedJob.objects.filter(bid=batch.bid).count() == 3

    # The next sweep, the client back, finishes it: a marked batch whatever the age asked; the
    # row keeps what was archived (not the Deleted mark).
    [again] = list(archive.sweep(older_than=timedelta(days=30) if marked else NOW, zk=client))
    assert (again.bid, again.done, again.partway) == (batch.bid, True, False), again
    assert again.jobs == gone.count(False)
    assert not exists(zk, paths.batch(batch.bid))
    assert not any(exists(zk, paths.job(j.jid)) for j in made)
    row = ArchivedBatch.objects.get(bid=batch.bid)
    assert (row.final_state, row.job_ids) == ("Failed", sorted(j.jid for j in made))
    assert ArchivedJob.objects.filter(bid=batch.bid).count() == 3


def test_queue_archive_says_what_it_did_and_that_zookeeper_was_lost_in_one_line(
    database: str,
    zk: Any,
    zk_server: Any,
    zk_hosts: str,
    other_zk: Any,
    proxy: ZkProxy,
    finished_batch: Any,
) -> None:
    """By hand: the batch's line and the counts, then one clear error (not a traceback, nor
    the batch delete's own advice); archive again finishes it."""
    batch, made = finished_batch(("Completed", "Failed"))
    made = sorted(made, key=lambda j: j.jid)
    admin = get_user_model().objects.create_user(username="ops")
    admin.groups.add(ensure_groups()[ADMIN])
    as_ops = ("--user", "ops", "--reason", "disk space")
    out = StringIO()
    with shared_client_on(proxy.hosts + zk_hosts[len(zk_server.hosts) :]):
        proxy.cut_after(request(MULTI, made[1].jid.encode()))
        with pytest.raises(CommandError, match=r"^ZooKeeper was lost \(ConnectionLoss\)"):
            call_command("queue", "archive", "--older-than-days", "0", *as_ops, stdout=out)
        said = out.getvalue()
        assert f"batch {batch.bid}: Failed -> Deleted, stopped part-way" in said, said
        assert "1 batches stopped part-way (marked Deleted; archive again finishes them)" in said
        [entry] = AuditEntry.objects.filter(action="archive")
        assert (entry.item_id, entry.after, entry.ok) == (batch.bid, "Deleted", False)
        assert batches.batch_load(other_zk, batch.bid).state == "Deleted"

        call_command("queue", "archive", "--older-than-days", "30", *as_ops, stdout=out)
    # The last job's removal was lost with the connection: applied (0 left) or not (1).
    assert re.search(rf"batch {batch.bid}: Deleted, archived with [01] jobs", out.getvalue())
    assert not exists(other_zk, paths.batch(batch.bid))
    assert ArchivedBatch.objects.get(bid=batch.bid).final_state == "Failed"
