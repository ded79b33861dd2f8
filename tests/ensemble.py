"""A three-member ZooKeeper ensemble on loopback, for the tests that kill its leader."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from queues.services.zkserver import LocalEnsemble
from queues.zk import client as zkmod


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
    chroot = f"/test-{uuid.uuid4().hex[:12]}"
    root = zkmod.connect(ensemble.hosts)
    root.ensure_path(chroot)
    root.stop()
    root.close()
    hosts = f"{ensemble.hosts}{chroot}"
    old = settings.ZK_HOSTS
    settings.ZK_HOSTS = hosts
    zkmod.close()
    yield hosts
    zkmod.close()
    settings.ZK_HOSTS = old
