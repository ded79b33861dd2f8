"""A job's nodes written the way a test sets a case up (the outside world, an earlier step),
not as a consumer holding the job's lock: the consumers' writes are fenced by the lock
(``queues.zk.fence``) and refuse without it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kazoo.client import KazooClient

from queues.zk import paths
from queues.zk.codecs import encode_int, encode_json
from queues.zk.records import Job


def set_job_nodes(zk: KazooClient, job: Job, **values: Any) -> Job:
    """Write each of ``values`` (``space_needed`` an integer, the others JSON) to the job's node
    of that name, created when missing; the job with them."""
    for name, value in values.items():
        data = encode_int(value) if isinstance(value, int) else encode_json(value)
        path = paths.job_node(job.jid, name)
        if zk.exists(path) is None:
            zk.create(path, data)
        else:
            zk.set(path, data)
    return replace(job, **values)
