"""An idle batched loop lists its folder once a poll, not twice (docs/benchmarks.md, "At
rest"): woken by its poll, a turn's first cycle listed the folder (the listing was older than
its age limit), and the turn then listed it again "fresh" although the folder's watch, set
before that listing, had not fired: 24 listings a minute of every state folder from an idle
``runconsumer all`` where 12 say as much. Jobs that arrive are still taken at once."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kazoo.client import KazooClient

from queues.core.states import JobState
from queues.daemons.pipeline import JobPipeline
from queues.zk import paths as zpaths

from .conftest import wait_for
from .test_batched import Step1, in_state, jobs_in

TURNS = 10
GET_CHILDREN = (8, 12)  # getChildren, getChildren2


def _listings(proxy: Any, folder: str) -> int:
    return sum(
        n for (op, path), n in proxy.paths.items() if op in GET_CHILDREN and path.endswith(folder)
    )


@pytest.mark.django_db
def test_idle_turns_list_the_folder_once_each(
    zk: KazooClient, proxy: Any, proxied_client: Any
) -> None:
    client = proxied_client()
    folder = zpaths.job_state_folder(JobState.ESTIMATING)
    loop = JobPipeline(Step1(zk=client, batch=2, poll=0.05))
    loop.begin()
    try:
        for _ in range(20):  # up to the first idle turn (it sets the folder's watch)
            if loop.turn():
                break
        assert loop._watch is not None and loop._watch.armed
        before = _listings(proxy, folder)
        for _ in range(TURNS):
            # A turn woken by the poll: the listing in hand is past its age by then.
            listing = loop.listing
            wait_for(lambda s=listing: time.monotonic() - s.listed_at >= s.age_limit(), every=0.05)
            assert loop.turn() > 0  # idle: nothing to do, the loop would wait
        listed = _listings(proxy, folder) - before
        print(f"{TURNS} idle turns: {listed} listings of {folder}")
        assert listed <= TURNS, listed

        # Jobs that arrive fire the watch; the next turns take them.
        jobs_in(zk, 3)
        wait_for(lambda: not loop._watch.armed)
        for _ in range(50):
            if in_state(zk, JobState.PROVISIONING) == 3:
                break
            loop.turn()
        assert in_state(zk, JobState.PROVISIONING) == 3
    finally:
        loop.end()
