"""The few ZooKeeper primitives the consumer daemons need beyond the item modules.

Kept apart from ``batches``/``jobs`` so the contract modules stay as they are; the daemons
import these instead of kazoo.
"""

from __future__ import annotations

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
