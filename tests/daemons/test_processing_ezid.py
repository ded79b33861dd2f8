"""Processing tells EZID about every object's ARK, as Merritt's ingest does (``HandlerMinter``
updates the identifier after it is settled, whoever minted it; ``MintUtil`` creates it when EZID
does not hold it), with the depositor's own ERC and ``retainTargetURL`` from the poster door."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from queues.chaos.standins import EzidStandIn, running
from queues.daemons.processing import Processing
from queues.daemons.workfolder import object_dir
from queues.models import InventoryObject
from queues.zk.jobs import job_load

from .conftest import make_job

pytestmark = pytest.mark.django_db

TARGET = "https://merritt.example.org"


@pytest.fixture
def ezid(settings) -> Iterator[EzidStandIn]:
    with running(EzidStandIn("apitest", "s3cret")) as stand_in:
        settings.MRT_EZID_URL = stand_in.url
        settings.MRT_EZID_USER, settings.MRT_EZID_PASSWORD = "apitest", "s3cret"
        settings.MRT_EZID_TARGET_URL = TARGET
        yield stand_in


def _downloaded(zk, configuration=None, **kw):
    job = make_job(
        zk,
        {
            "payload_url": "http://x/a.txt",
            "type": "file",
            "filename": "a.txt",
            **(configuration or {}),
        },
        state="Processing",
        **kw,
    )
    producer = object_dir(job) / "producer"
    producer.mkdir(parents=True)
    (producer / "a.txt").write_text("content")
    return job


def test_an_ark_the_depositor_gave_is_created_in_ezid_with_their_erc(zk, ezid) -> None:
    given = "ark:/99999/fk4given"
    job = _downloaded(
        zk,
        {"erc": "erc.who: Doe, Jane\nerc.what: Field notes", "retainTargetURL": "true"},
        identifiers={"primary_id": given, "local_id": []},
    )

    assert Processing(zk=zk).run_once()

    done = job_load(zk, job.jid)
    assert done.state == "Storing", done.status.message
    update, create = ezid.seen()
    assert (update.method, update.path) == ("POST", f"/id/{given}")
    assert (create.method, create.path) == ("PUT", f"/id/{given}")
    # The depositor's ERC in place of the record; no _target: they asked to keep theirs.
    assert ezid.identifiers[given] == {"erc.who": "Doe, Jane", "erc.what": "Field notes"}


def test_an_ark_found_by_local_id_is_updated_with_its_target(zk, ezid) -> None:
    known = "ark:/99999/fk4known"
    InventoryObject.objects.create(ark=known, local_id="loc-1")
    ezid.identifiers[known] = {"_target": "https://old.example.org/x"}
    job = _downloaded(
        zk,
        identifiers={"primary_id": "", "local_id": ["loc-1"]},
        metadata={"erc_who": "Ann", "erc_what": "Title"},
    )

    assert Processing(zk=zk).run_once()

    assert job_load(zk, job.jid).primary_id == known
    (update,) = ezid.seen()
    assert (update.method, update.path) == ("POST", f"/id/{known}")
    described = ezid.identifiers[known]
    assert described["_target"] == f"{TARGET}/m/ark%253A%252F99999%252Ffk4known"
    assert described["erc"] == f"who: Ann\nwhat: Title\nwhere: {known}\nwhere: loc-1\n"


def test_ezid_refusing_the_consoles_credentials_is_a_wait_not_a_failure(zk, ezid, settings) -> None:
    """EZID's 401 (``error: unauthorized``) is about the console's account, which every job
    would meet: the job waits in Processing for a later try, EZID's breaker holds the rest."""
    from queues.zk.maintenance import service_holds

    settings.MRT_EZID_PASSWORD = "wrong"
    job = _downloaded(zk, identifiers={"primary_id": "ark:/99999/fk4given", "local_id": []})

    Processing(zk=zk).run_once()

    waiting = job_load(zk, job.jid)
    assert waiting.state == "Processing", waiting.status.message
    assert "waiting to try again" in waiting.status.message
    assert "unauthorized" in waiting.status.message
    assert [r.method for r in ezid.seen()] == ["POST"]  # no create after a 401
    assert "refuses the console" in service_holds(zk)["ezid"].reason


def test_ezid_forbidding_an_identifier_fails_the_job_saying_so(zk, ezid) -> None:
    """EZID's 403 for an identifier (one another account owns) is about that identifier."""
    from queues.chaos.standins import Answer

    forbidden = Answer(403, b"error: forbidden\n", "text/plain; charset=UTF-8")
    ezid.refuse_next(forbidden)
    ezid.refuse_next(forbidden)
    job = _downloaded(zk, identifiers={"primary_id": "ark:/99999/fk4given", "local_id": []})

    Processing(zk=zk).run_once()

    failed = job_load(zk, job.jid)
    assert failed.state == "Failed"
    assert "cannot describe ark:/99999/fk4given in EZID" in failed.status.message
    assert "forbidden" in failed.status.message
