"""A three-member ZooKeeper ensemble on loopback, for the tests that kill its leader."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from queues.services.zkserver import LocalEnsemble
from tests.zktree import new_chroot, shared_client_on


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalEnsemble]:
    servers = LocalEnsemble(Path(tmp_path_factory.mktemp("ensemble")))
    servers.start()
    yield servers
    servers.stop()


@pytest.fixture
def ensemble_hosts(ensemble: LocalEnsemble) -> Iterator[str]:
    """The ensemble's connection string into a chroot of this test's own, as ``ZK_HOSTS``.

    Every member is running again first: a test before may have left one killed.
    """
    ensemble.start()
    ensemble.wait_for_leader()
    hosts = f"{ensemble.hosts}{new_chroot(ensemble.hosts)}"
    with shared_client_on(hosts):
        yield hosts
