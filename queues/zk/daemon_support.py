"""The few ZooKeeper primitives the consumer daemons need beyond the item modules.

Kept apart from ``batches``/``jobs`` so the contract modules stay as they are; the daemons
import these instead of kazoo.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    NoNodeError,
)

from . import paths
from .codecs import decode_json, encode_json
from .errors import Conflict, MalformedNode, NotFound


def batch_report_update(zk: KazooClient, bid: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Merge ``changes`` into ``/batches/BID/status-report``, checked against its version.

    Used for the reporting daemon's bookkeeping keys (which reporting round the report belongs
    to, whether its mail went out); every other key of the node is kept.
    """
    path = paths.batch_node(paths.bid(bid), "status-report")
    try:
        data, stat = zk.get(path)
    except NoNodeError as exc:
        raise NotFound(f"{path} does not exist") from exc
    report = decode_json(path, data)
    if not isinstance(report, dict):
        raise MalformedNode(path, "expected a JSON object")
    report.update(changes)
    try:
        zk.set(path, encode_json(report), version=stat.version)
    except BadVersionError as exc:
        raise Conflict(f"{path} changed while it was being updated") from exc
    return report


def job_configuration_update(zk: KazooClient, jid: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Merge ``changes`` into ``/jobs/JID/configuration`` (version-checked, other keys kept).

    The batch daemon writes a job's ``working_dir`` this way: the folder is named after the job
    ID, which exists only once the job has been created.
    """
    path = paths.job_node(paths.jid(jid), "configuration")
    try:
        data, stat = zk.get(path)
    except NoNodeError as exc:
        raise NotFound(f"{path} does not exist") from exc
    configuration = decode_json(path, data)
    configuration.update(changes)
    try:
        zk.set(path, encode_json(configuration), version=stat.version)
    except BadVersionError as exc:
        raise Conflict(f"{path} changed while it was being updated") from exc
    return configuration


class ChangeSignal:
    """Wakes an idle consumer when the children of its folder change.

    One ZooKeeper watch at a time is kept per signal (a watch fires once and is then re-armed),
    so an idle daemon costs one registered watch, not one per poll. The poll interval stays the
    fallback for what a children watch cannot see (a session that expired, a status change).
    """

    def __init__(self, zk: KazooClient, path: str) -> None:
        self._zk = zk
        self._path = path
        self._fired = threading.Event()
        self._armed = False
        self._lock = threading.Lock()

    @property
    def armed(self) -> bool:
        """Whether a watch is set and has not fired yet."""
        return self._armed

    def arm(self) -> None:
        with self._lock:
            if self._armed:
                return
            self._armed = True
        try:
            try:
                self._zk.get_children(self._path, watch=self._fire)
            except NoNodeError:
                self._zk.exists(self._path, watch=self._fire)
        except Exception:
            # Unreachable ZooKeeper: fall back to polling; the next arm() tries again.
            with self._lock:
                self._armed = False

    def _fire(self, _event: Any) -> None:
        with self._lock:
            self._armed = False
        self._fired.set()

    def wait(self, stop: threading.Event, timeout: float) -> bool:
        """Sleep until the folder changes, ``stop`` is set or ``timeout`` passes.

        Returns whether the folder changed.
        """
        self.arm()
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if self._fired.wait(min(remaining, 0.25)):
                break
        changed = self._fired.is_set()
        self._fired.clear()
        return changed
