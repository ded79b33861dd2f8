"""Each benchmark run leaves the server as it found it: a tree grown by every earlier run makes
ZooKeeper's snapshots, taken in the middle of later runs, ever longer, so a bench's last runs
would meet a slower server than its first."""

from __future__ import annotations

import pytest

from bench.common import BenchError, drop_chroot, new_chroot
from bench.loader import bulk_load
from queues.services.zkserver import LocalZooKeeper
from queues.zk import client as zkmod


def _count(zk, path: str) -> int:
    return 1 + sum(_count(zk, f"{path}/{name}") for name in zk.get_children(path))


def test_a_runs_chroot_goes_with_everything_under_it(zk_server: LocalZooKeeper) -> None:
    run, other = new_chroot(zk_server.hosts, "run"), new_chroot(zk_server.hosts, "other")
    for target in (run, other):
        client = zkmod.connect(target)
        bulk_load(client, batches=3, jobs=40)
        client.stop()
        client.close()
    root = zkmod.connect(zk_server.hosts)
    try:
        run_path, other_path = run[len(zk_server.hosts) :], other[len(zk_server.hosts) :]
        nodes, others = _count(root, run_path), _count(root, other_path)

        # Few deletes a request: every level takes several multis, deepest level first.
        assert drop_chroot(run, per_multi=7) == nodes

        assert root.exists(run_path) is None
        assert _count(root, other_path) == others  # another run's nodes are left alone
        drop_chroot(other)
    finally:
        root.stop()
        root.close()


def test_a_connection_string_without_a_chroot_is_refused(zk_server: LocalZooKeeper) -> None:
    with pytest.raises(BenchError, match="names no chroot"):
        drop_chroot(zk_server.hosts)
