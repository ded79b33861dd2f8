"""kazoo's private API is used in one module, which refuses a kazoo it was not written for."""

from __future__ import annotations

import inspect
import subprocess
import sys
import threading

import kazoo.version
import pytest
from kazoo.client import KazooClient
from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import selector_select

from queues.zk import kazoo_private
from queues.zk.kazoo_private import KazooVersionError, check_version


def test_the_installed_kazoo_is_one_it_was_written_for() -> None:
    assert kazoo.version.__version__ in kazoo_private.WRITTEN_FOR
    check_version(kazoo.version.__version__)


@pytest.mark.parametrize("version", ["2.10.0", "2.11.1", "3.0.0", ""])
def test_an_unknown_version_is_refused_saying_what_to_do(version: str) -> None:
    with pytest.raises(KazooVersionError) as raised:
        check_version(version)
    message = str(raised.value)
    assert f"kazoo {version} is installed" in message
    assert "queues/zk/kazoo_private.py" in message
    assert "requirements.txt" in message and "WRITTEN_FOR" in message


def test_importing_the_contract_with_another_kazoo_fails_at_once() -> None:
    program = "import kazoo.version\nkazoo.version.__version__ = '9.9.9'\nimport queues.zk.client\n"
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "KazooVersionError: kazoo 9.9.9 is installed" in done.stderr


def test_the_private_names_used_are_still_there() -> None:
    """What a kazoo upgrade must be read for (the module's docstring names each)."""
    assert inspect.signature(KazooClient._call).parameters.keys() >= {"request", "async_object"}
    assert callable(KazooClient._reset_watchers)
    assert "selectors_module" in inspect.signature(selector_select).parameters
    assert callable(SequentialThreadingHandler.select)


def test_after_watch_callbacks_waits_for_the_events_already_received(zk: KazooClient) -> None:
    zk.create("/watched", b"")
    seen = threading.Event()

    def slow(event: object) -> None:
        threading.Event().wait(0.2)  # a callback still running when the write returns
        seen.set()

    zk.get("/watched", watch=slow)
    zk.set("/watched", b"changed")
    assert kazoo_private.after_watch_callbacks(zk, 5.0)
    assert seen.is_set()


def test_full_path_is_inside_the_chroot(zk: KazooClient, zk_hosts: str) -> None:
    chroot = zk_hosts[zk_hosts.index("/") :]
    assert kazoo_private.full_path(zk, "/jobs") == f"{chroot}/jobs"
