"""Take away a test's chroot from the session's shared ZooKeeper when the test ends.

Left in place, every test's nodes stay in the one server's memory for the rest of the run: the
suite's bulk loads (thousands of jobs each) pile up in the server's 512 MB heap. CI twice met
``Connection time-out`` setting up the tests that came after the text search's 5,100 jobs, which
pass alone: most likely the server, near its heap's end, collecting garbage instead of
answering. The tree is listed a level at a time and deleted deepest first, each level's requests
sent without waiting (30,000 nodes in 6 s on a busy 2-core machine)."""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

from kazoo.exceptions import NoNodeError, NotEmptyError

from queues.services.zkserver import LocalZooKeeper, four_letter
from queues.zk import client as zkmod

log = logging.getLogger(__name__)

WINDOW = 2_000  # requests in flight at once


def _levels(zk: Any, root: str) -> list[list[str]]:
    levels = [[root]]
    while levels[-1]:
        below: list[str] = []
        level = levels[-1]
        for start in range(0, len(level), WINDOW):
            chunk = level[start : start + WINDOW]
            sent = [(path, zk.get_children_async(path)) for path in chunk]
            for path, answer in sent:
                try:
                    names = answer.get()
                except NoNodeError:
                    continue
                below.extend(f"{path.rstrip('/')}/{name}" for name in names)
        levels.append(below)
    return levels[:-1]


def delete_tree(zk: Any, root: str, *, tries: int = 3) -> bool:
    """Delete ``root`` and everything under it; False when something kept writing under it
    (a process the test left running) through ``tries`` passes."""
    for _ in range(tries):
        for level in reversed(_levels(zk, root)):
            for start in range(0, len(level), WINDOW):
                sent = [zk.delete_async(path) for path in level[start : start + WINDOW]]
                for answer in sent:
                    # Gone already; or written under since: the next pass takes it.
                    with contextlib.suppress(NoNodeError, NotEmptyError):
                        answer.get()
        if zk.exists(root) is None:
            return True
    return False


# A chroot holding more nodes than this, alone on its server, is taken away by starting the
# worker's server afresh (seconds) rather than deleted node by node (a minute for a bulk load of
# 100,000 jobs on a busy machine, in ZooKeeper's CPU and the client's).
FRESH_SERVER_OVER = 20_000


# What a server's root holds besides the tests' chroots: ZooKeeper's own folder, and the queue's
# top-level folders that every client connected at the root makes (``zkmod.connect``).
ROOT_FOLDERS = {"zookeeper"} | {node.lstrip("/").split("/")[0] for node in zkmod.BASE_NODES}


def _node_count(server: LocalZooKeeper) -> int:
    found = re.search(r"^Node count: (\d+)", four_letter(server.port) or "", re.M)
    return int(found.group(1)) if found else 0


def forget_chroot(server: LocalZooKeeper, chroot: str) -> None:
    """Take a test's chroot away from the shared server (the module's docstring says why); a
    server the test left unreachable is said in the log, not failed on."""
    try:
        root = zkmod.connect(server.hosts, timeout=10)
    except Exception as exc:
        log.warning("cannot delete %s: %s", chroot, exc)
        return
    fresh = False
    try:
        # Nothing else on the server (no module's chroot, no other test's: a worker runs one
        # test at a time) and much in it: the same server, empty, on the same port.
        # (A client connected at the root, as this one, makes the shared top-level folders
        # there: they are not another test's.)
        alone = set(root.get_children("/")) - ROOT_FOLDERS == {chroot.lstrip("/")}
        fresh = alone and _node_count(server) > FRESH_SERVER_OVER
        if not fresh and not delete_tree(root, chroot):
            log.warning("%s is still written under; left in place", chroot)
    except Exception as exc:
        log.warning("cannot delete %s: %s", chroot, exc)
        fresh = False
    finally:
        root.stop()
        root.close()
    if fresh:
        server.stop()
        shutil.rmtree(server.directory / "data", ignore_errors=True)
        server.start()


def new_chroot(hosts: str) -> str:
    """A new chroot (``/test-...``) made on the servers of ``hosts``; its path."""
    chroot = f"/test-{uuid.uuid4().hex[:12]}"
    root = zkmod.connect(hosts, timeout=10)
    try:
        root.ensure_path(chroot)
    finally:
        root.stop()
        root.close()
    return chroot


@contextlib.contextmanager
def chroot_on(server: LocalZooKeeper) -> Iterator[str]:
    """A chroot of its own on ``server`` for the block (a test's, or a module fixture's),
    taken away when the block ends: left on a worker's server, one module's chroot kept every
    later test's from being alone there, so each bulk load was deleted node by node."""
    chroot = new_chroot(server.hosts)
    try:
        yield chroot
    finally:
        forget_chroot(server, chroot)


@contextlib.contextmanager
def shared_client_on(hosts: str) -> Iterator[None]:
    """The process's shared client (``zkmod.client()``, ``settings.ZK_HOSTS``) on ``hosts`` for
    the block, and back where it was after."""
    from django.conf import settings

    old = settings.ZK_HOSTS
    settings.ZK_HOSTS = hosts
    zkmod.close()
    try:
        yield
    finally:
        zkmod.close()
        settings.ZK_HOSTS = old
