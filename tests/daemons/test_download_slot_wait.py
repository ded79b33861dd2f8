"""A Downloading job passed over because its depositor's server is at MRT_DOWNLOADS_PER_HOST
says so on its page (issue 25 item 8): it waited with no word about why."""

from __future__ import annotations

from typing import Any

import pytest
from django.template import Context, Template

from queues.daemons.downloading import Downloading
from queues.daemons.fetching import HOST_SLOTS, SERVER_KEYS, ServerKeys
from queues.daemons.registration import ProcessObserver
from queues.services.depositors import depositor_policy
from queues.steps.netpolicy import FetchPolicy, FetchRefused
from queues.zk import consumers as zconsumers
from queues.zk.jobs import job_load

from .conftest import FileServer, make_job

pytestmark = pytest.mark.django_db


def _page_part(jid: str, state: str) -> str:
    template = Template("{% load incident_tags %}{% download_slot_wait jid state %}")
    return template.render(Context({"jid": jid, "state": state}))


def test_a_job_passed_over_for_its_servers_cap_says_so_on_its_page(
    zk, files: FileServer, settings
) -> None:
    settings.MRT_DOWNLOADS_PER_HOST = 1
    url = files.put("a.txt", "a")
    job = make_job(zk, {"payload_url": url, "type": "file"}, state="Downloading")
    server = SERVER_KEYS.key(job.configuration["payload_url"], depositor_policy())
    assert HOST_SLOTS.try_take(server, 1)  # another download from that server under way
    try:
        daemon = Downloading(zk=zk, poll=0.05)
        assert not daemon.run_once()
        assert job_load(zk, job.jid).state == "Downloading"
        observer = ProcessObserver(zk, [daemon], record=False, host="dl1", pid=9)
        entry = observer.snapshot()
        assert entry["slot_waits"] == {job.jid: server}
        zconsumers.consumer_publish(zk, "dl1-9", entry)
        html = _page_part(job.jid, "Downloading")
        assert 'id="slot-wait"' in html and "dl1-9 passes it over" in html and server in html
    finally:
        HOST_SLOTS.give_back(server)
    # Taken once the slot is free: the page no longer says it waits.
    assert Downloading(zk=zk, poll=0.05).run_once()
    assert job_load(zk, job.jid).state == "Processing"
    zconsumers.consumer_publish(zk, "dl1-9", observer.snapshot())
    assert 'id="slot-wait"' not in _page_part(job.jid, "Downloading")


def test_a_refused_hosts_server_key_is_remembered_as_an_address_is() -> None:
    """A refused (or unresolvable) host counts under its name as written; its jobs are looked at
    as often as any, and the resolver is not asked again for each of them."""
    asked: list[str] = []

    class Refusing(FetchPolicy):
        def resolve(self, url: str) -> Any:
            asked.append(url)
            raise FetchRefused(url, "refused for the test")

    keys = ServerKeys()
    policy = Refusing()
    url = "http://refused.example.invalid/a.bin"
    assert keys.key(url, policy) == keys.key(url, policy) == "refused.example.invalid"
    assert asked == [url]
