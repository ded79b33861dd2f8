"""The batch list counts each batch's jobs per job state, not just per batch folder."""

import pytest

from queues.operator.audit import ApiToken
from queues.zk import batches, jobs


@pytest.fixture
def mixed_batch(zk):
    batch = batches.batch_create(zk, submission={"profile": "demo", "submitter": "s"})
    made = [jobs.job_create(zk, bid=batch.bid, configuration={"profile": "demo"}) for _ in range(4)]
    estimating = jobs.job_transition(zk, made[1], "Estimating")
    jobs.job_transition(zk, estimating, "Failed", message="no")
    jobs.job_transition(zk, jobs.job_transition(zk, made[2], "Estimating"), "Provisioning")
    jobs.job_transition(zk, made[3], "Estimating")
    return batch


def test_batch_list_shows_jobs_per_state(viewer, mixed_batch):
    html = viewer.get("/batches/").content.decode()
    row = html[html.index(f'id="batch-row-{mixed_batch.bid}"') :]
    row = row[: row.index("</tr>")]
    cell = row[row.index('class="job-states"') :]
    for state in ("Pending", "Estimating", "Provisioning", "Failed"):
        assert f"state={state}&amp;bid={mixed_batch.bid}" in cell
    assert "Completed" not in cell


def test_api_batch_list_counts_jobs_per_state(client, make_user, mixed_batch):
    _token, key = ApiToken.issue(user=make_user("viewer", "api-reader"), name="test")
    data = client.get("/api/batches", HTTP_AUTHORIZATION=f"Bearer {key}").json()
    (row,) = [r for r in data["items"] if r["id"] == mixed_batch.bid]
    assert row["job_states"] == {"Pending": 1, "Estimating": 1, "Provisioning": 1, "Failed": 1}
