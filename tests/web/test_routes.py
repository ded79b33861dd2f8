"""URL patterns accept exactly the IDs of zk.paths and the operator actions of states.py."""

import pytest
from django.urls import Resolver404, resolve

from queues.core.states import ACCESS, BATCH, JOB


@pytest.mark.parametrize("action", JOB.actions)
def test_every_job_action_of_the_state_machine_has_a_page_and_an_api_route(action):
    assert resolve(f"/jobs/jid0000000001/{action}/").url_name == "job-action"
    assert resolve(f"/api/jobs/jid0000000001/{action}").url_name == "api-job-action"


@pytest.mark.parametrize(
    ("url", "name"),
    [
        *((f"/batches/bid0000000001/{a}/", "batch-action") for a in BATCH.actions),
        *((f"/access/large/qid0000000001/{a}/", "access-action") for a in ACCESS.actions),
        ("/holds/queue/access-large/release/", "queue-hold"),
        ("/holds/collection/merritt_demo_content/hold/", "collection-hold"),
        ("/api/holds/collection/a.b-c_d/release", "api-collection-hold"),
    ],
)
def test_valid_item_routes_resolve(url, name):
    assert resolve(url).url_name == name


@pytest.mark.parametrize(
    "url",
    [
        "/jobs/jid0000000001/frobnicate/",
        "/jobs/jid000000001/resume/",  # nine digits
        "/jobs/bid0000000001/resume/",
        "/batches/bid0000000001/resume/",  # not a batch action
        "/access/medium/qid0000000001/resume/",
        "/holds/queue/ingest2/hold/",
        "/holds/collection/../hold/",
        "/holds/collection/./hold/",
        "/holds/collection/a%2Fb/hold/",
    ],
)
def test_malformed_ids_and_unknown_actions_do_not_resolve(url):
    with pytest.raises(Resolver404):
        resolve(url)


@pytest.mark.parametrize(
    "url", ["/api/holds/collection/../release", "/api/jobs/jid000000001/resume", "/api/nosuch"]
)
def test_under_api_they_reach_no_endpoint_but_the_json_answer_for_them(url):
    # queues.web.api.unknown_path: a JSON 400 for the malformed ID, a JSON 404 for the rest.
    assert resolve(url).url_name == "unknown-api-path"
