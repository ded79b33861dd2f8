"""The ``/poster/`` door keeps the fields of mrt-ingest's current ``JerseyBase`` it used to drop
(``erc``, ``retainTargetURL``, ``size``: docs/merritt-poster.md) all the way into each job's
configuration, and a removed batch takes its uploads with it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from queues.core.states import BatchState
from queues.daemons.registry import DAEMONS
from queues.operator import archive
from queues.operator.audit import ApiToken
from queues.services import moves
from queues.zk.batches import batch_job_ids, batch_load, batch_transition
from queues.zk.jobs import jobs_load
from tests.console.test_poster import batch_state, exception, fields, post, submitted
from tests.core.helpers import snapshot

ERC = "who: Lovelace, Ada\nwhat: Letters on the Analytical Engine\nwhen: 1843"


@pytest.fixture(autouse=True)
def work_dir(settings: Any, tmp_path: Path) -> Path:
    settings.MRT_WORK_DIR = tmp_path / "work"
    return settings.MRT_WORK_DIR


@pytest.fixture
def key(make_user: Any) -> str:
    return ApiToken.issue(user=make_user("operator", "operator-poster"), name="poster")[1]


def _jobs(zk: Any, bid: str) -> list[Any]:
    jids = sorted({j for folder in batch_job_ids(zk, bid).values() for j in folder})
    return list(jobs_load(zk, jids))


def test_erc_retain_target_and_size_reach_every_job(zk, key) -> None:
    response = post(key, fields(erc=ERC, retainTargetURL="true", size="2048"))

    assert response.status_code == 200, response.content
    sub = submitted(zk, response).submission
    assert sub["erc"] == ERC
    assert sub["retainTargetURL"] == "true"
    assert sub["size"] == 2048  # a number, as Merritt's batch handler writes it
    assert DAEMONS["batch-pending"](zk=zk, poll=0.05).run_once()
    (job,) = _jobs(zk, response["X-Batch-ID"])
    assert job.configuration["erc"] == ERC
    assert job.configuration["retainTargetURL"] == "true"
    # The batch's size is the payload's, not the job's: it stays on the batch.
    assert "size" not in job.configuration
    # A job's date is Merritt's DateState text (ISO 8601), the batch's java.util.Date text.
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", job.configuration["submissionDate"]
    )
    assert re.fullmatch(r"[A-Z][a-z]{2} [A-Z][a-z]{2} .* \d{4}", sub["submissionDate"])


def test_retain_target_other_than_true_is_not_kept(zk, key) -> None:
    response = post(key, fields(retainTargetURL="false"))

    assert response.status_code == 200, response.content
    sub = submitted(zk, response).submission
    assert "retainTargetURL" not in sub and "erc" not in sub
    assert sub["size"] == 0  # Merritt writes 0 when no size was given


@pytest.mark.parametrize("size", ["2 KB", "²", "-1", "9223372036854775808", "9" * 5000])
def test_a_size_that_is_not_a_number_is_refused(zk, key, size) -> None:
    """'²' passed isdigit() and raised in int() (a 500); past a Java long Merritt cannot read it."""
    before = snapshot(zk)
    response = post(key, fields(size=size))

    assert response.status_code == 400
    assert f"size {size!r} is not a number of bytes" in exception(response)["detail"]
    assert snapshot(zk) == before


def _upload(zk: Any, key: str, settings: Any) -> tuple[Any, Path]:
    upload = SimpleUploadedFile("scan.tif", b"II*\x00 a scan", content_type="image/tiff")
    response = post(key, fields(url=None, file=upload))
    assert response.status_code == 200, response.content
    folder = Path(settings.MRT_WORK_DIR).resolve() / "poster" / batch_state(response)["batchID"]
    assert (folder / "scan.tif").is_file()
    return batch_load(zk, response["X-Batch-ID"]), folder


def test_deleting_a_batch_removes_its_uploads(zk, key, settings) -> None:
    batch, folder = _upload(zk, key, settings)
    _other, kept = _upload(zk, key, settings)
    batch_transition(zk, batch, BatchState.HELD, admin=True)

    moves.batch_delete(bid=batch.bid)

    assert not folder.exists()
    assert (kept / "scan.tif").is_file()  # another batch's upload is left alone


def test_archiving_a_batch_removes_its_uploads(zk, key, settings) -> None:
    batch, folder = _upload(zk, key, settings)
    batch_transition(zk, batch, BatchState.HELD, admin=True)
    batch = batch_load(zk, batch.bid)

    done, _removed, detail = archive.remove_archived(zk, batch, [])

    assert done, detail
    assert not folder.exists()
