"""Failed jobs grouped by cause (issue 25, item 2): messages that differ only in numbers, URLs,
hosts, paths and IDs fall in one group; each group's count, batches, collections, first and
last failure and newest message; its resume and delete previewed by the bulk code and acting on
exactly its jobs; the same groups in /api/failed/causes; the message escaped."""

from __future__ import annotations

import pytest
from django.urls import reverse

from queues.console import failure_causes
from queues.core import clock
from queues.operator.audit import ApiToken
from queues.zk import index as zindex
from queues.zk import jobs, locks
from queues.zk.errors import NotFound

pytestmark = pytest.mark.django_db

DOWN = "Downloading: could not fetch {url}: HTTP {code} after {n} tries"
MARKUP = "<img src=x onerror=\"document.title='owned'\"><b>bold</b> at 12"
DIGEST = "Storing: digest mismatch for producer/{name}: expected {a} got {b}"


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (
            DOWN.format(url="https://a.example.org/x/1.zip", code=503, n=3),
            DOWN.format(url="http://b.example.edu:8080/y.zip?z=2", code=502, n=10),
        ),
        (
            DIGEST.format(name="a.txt", a="0" * 32, b="ab" * 16),
            DIGEST.format(name="dir/b.pdf", a="1f" * 20, b="e" * 40),
        ),
        (
            "store jid0000000042 of bid0000000007 refused by node 9501 at 10.0.0.5:8080",
            "store jid0000000043 of bid0000000011 refused by node 2111 at 10.0.0.9:8081",
        ),
        (
            "ark:/99999/fk4abc not found in inventory since 2026-11-25T18:00:01Z",
            "ark:/13030/m5xyz99 not found in inventory since 2026-11-26 07:12",
        ),
        (
            "java.io.IOException: /apps/ingest/queue/bid1/jid5/producer/x.txt (No such file)",
            "java.io.IOException: /tmp/other/y.txt (No such file)",
        ),
        (
            "mail to ops@ucop.edu failed at store-3.cdlib.org",
            "mail to a.b@example.org failed at ingest.example.edu",
        ),
    ],
)
def test_messages_differing_only_in_numbers_urls_ids_have_one_signature(one, other):
    assert failure_causes.signature(one) == failure_causes.signature(other)


def test_different_causes_have_different_signatures():
    signatures = {
        failure_causes.signature(m)
        for m in (
            DOWN.format(url="https://a.example.org/1.zip", code=503, n=3),
            DIGEST.format(name="a.txt", a="0" * 32, b="1" * 32),
            "java.io.IOException: /tmp/y.txt (No such file)",
            "java.net.SocketTimeoutException: Read timed out",
            "",
        )
    }
    assert len(signatures) == 5
    assert failure_causes.signature("  ") == failure_causes.NO_MESSAGE
    # A Java class name is not a host: the exception stays in the signature.
    assert "java.net.SocketTimeoutException" in failure_causes.signature(
        "java.net.SocketTimeoutException: Read timed out"
    )


@pytest.fixture
def two_causes(zk, make_job, make_batch):
    """Three download failures over two batches and two collections, two digest failures."""
    b1, b2, b3 = make_batch(profile="letters"), make_batch(profile="maps"), make_batch()
    down = [
        make_job(
            "Failed",
            batch=b1,
            profile="letters",
            message=DOWN.format(url="https://a.example.org/1.zip", code=503, n=3),
        ),
        make_job(
            "Failed",
            batch=b1,
            profile="letters",
            message=DOWN.format(url="https://a.example.org/2.zip", code=503, n=4),
        ),
        make_job(
            "Failed",
            batch=b2,
            profile="maps",
            message=DOWN.format(url="https://c.example.org/x.zip", code=500, n=1),
        ),
    ]
    digest = [
        make_job(
            "Failed",
            batch=b3,
            failed_at="Storing",
            message=DIGEST.format(name=f"f{i}.txt", a=f"{i}" * 32, b="9" * 32),
        )
        for i in range(2)
    ]
    return down, digest


def test_groups_have_their_counts_batches_collections_times_and_newest_message(
    zk, two_causes, viewer
):
    down, digest = two_causes
    causes = failure_causes.failure_causes()
    assert [g.count for g in causes.groups] == [3, 2]
    first, second = causes.groups
    assert first.step == "Downloading" and second.step == "Storing"
    assert first.signature == "Downloading: could not fetch <url>: HTTP <n> after <n> tries"
    assert first.batches == sorted({down[0].bid, down[2].bid})
    assert first.collections == ["letters", "maps"]
    assert second.batches == [digest[0].bid]
    assert first.first_seen == down[0].status.last_modified
    assert first.last_seen == down[2].status.last_modified
    assert first.sample == down[2].status.message and first.sample_jid == down[2].jid
    assert sorted(causes.jids(first.key)) == sorted(j.jid for j in down)
    assert sorted(causes.jids(second.key)) == sorted(j.jid for j in digest)

    html = viewer.get(reverse("failed-causes")).content.decode()
    assert html.count('class="card failed-cause"') == 2
    assert f'id="cause-{first.key}" data-key="{first.key}" data-count="3"' in html
    assert "5 failed jobs match, in 2 causes" in html
    # The failed list offers the grouping beside batch, collection and step.
    listed = viewer.get(reverse("failed")).content.decode()
    assert f'href="{reverse("failed-causes")}" id="group-by-cause"' in listed


def test_the_sample_message_and_signature_are_escaped(zk, make_job, viewer):
    make_job("Failed", message=MARKUP)
    html = viewer.get(reverse("failed-causes")).content.decode()
    assert "<img src=x" not in html and "<b>bold</b>" not in html
    assert "&lt;img src=x onerror=" in html and "&lt;b&gt;bold&lt;/b&gt;" in html


def test_a_group_follows_the_failed_folder(zk, two_causes, make_job, viewer):
    down, _digest = two_causes
    key = failure_causes.failure_causes().groups[0].key
    resumed = jobs.job_load(zk, down[0].jid)
    jobs.job_transition(zk, resumed, jobs.job_resume_state(resumed), admin=True)
    again = make_job("Failed", message=DOWN.format(url="https://z.example.org/9", code=504, n=2))
    zindex.for_client(zk).settle()  # the folder's watch has told the index of both changes
    causes = failure_causes.failure_causes()
    assert sorted(causes.jids(key)) == sorted([down[1].jid, down[2].jid, again.jid])
    assert causes.by_key[key].sample_jid == again.jid


def test_a_groups_resume_is_previewed_then_resumes_exactly_its_jobs(zk, two_causes, operator):
    down, digest = two_causes
    key = failure_causes.failure_causes().groups[0].key
    form = {"action": "resume", "scope": "filter", "cause": key}
    preview = operator.post(reverse("failed-causes-bulk"), form)
    assert preview.status_code == 200
    html = preview.content.decode()
    assert 'id="bulk-confirm"' in html and "3 Failed" in html
    assert all(j.jid in html for j in down) and not any(j.jid in html for j in digest)
    assert all(jobs.job_load(zk, j.jid).state == "Failed" for j in down)  # nothing done yet
    # The confirmation posts the same form back to the same address.
    assert f'name="cause" value="{key}"' in html
    done = operator.post(reverse("failed-causes-bulk"), {**form, "confirmed": "1"})
    assert "3 done, 0 skipped" in done.content.decode()
    assert all(jobs.job_load(zk, j.jid).state == "Downloading" for j in down)
    assert all(jobs.job_load(zk, j.jid).state == "Failed" for j in digest)


def test_a_groups_delete_needs_an_admin_and_a_preview(zk, two_causes, operator, admin):
    _down, digest = two_causes
    key = failure_causes.failure_causes().groups[1].key
    form = {"action": "delete", "scope": "filter", "cause": key}
    assert operator.post(reverse("failed-causes-bulk"), form).status_code == 403
    preview = admin.post(reverse("failed-causes-bulk"), form).content.decode()
    assert 'id="bulk-confirm"' in preview and "Delete 2" in preview
    assert all(jobs.job_load(zk, j.jid).state == "Failed" for j in digest)
    done = admin.post(
        reverse("failed-causes-bulk"), {**form, "confirmed": "1", "reason": "bad digests"}
    )
    assert "2 done, 0 skipped" in done.content.decode()
    for job in digest:
        with pytest.raises(NotFound):
            jobs.job_load(zk, job.jid)


def test_a_bad_cause_key_is_refused(zk, operator):
    answer = operator.post(
        reverse("failed-causes-bulk"), {"action": "resume", "scope": "filter", "cause": "../x"}
    )
    assert answer.status_code == 400


def test_the_page_offers_a_hold_of_the_groups_collections(
    zk, two_causes, make_job, operator, viewer
):
    make_job("Pending", profile="letters")
    zindex.for_client(zk).settle()
    html = operator.get(reverse("failed-causes")).content.decode()
    assert f'action="{reverse("collection-hold", args=["letters", "hold"])}"' in html
    assert 'Hold letters</button> <span class="small cause-hold-pending">1 of its jobs' in html
    answer = operator.post(
        reverse("collection-hold", args=["letters", "hold"]),
        {"reason": "depositor down", "next": reverse("failed-causes")},
    )
    assert answer.status_code == 303 and answer["Location"] == reverse("failed-causes")
    assert "letters" in locks.holds_list(zk).collections
    assert "cause-resume" in html and "cause-delete" not in html  # delete is an admin's
    seen = viewer.get(reverse("failed-causes")).content.decode()
    assert "cause-resume" not in seen and "collection-hold" not in seen


def test_the_api_lists_the_groups(zk, two_causes, make_user, client):
    down, _digest = two_causes
    _token, secret = ApiToken.issue(user=make_user("viewer", "api-viewer"), name="t")
    body = client.get("/api/failed/causes", HTTP_AUTHORIZATION=f"Bearer {secret}").json()
    assert body["total"] == 2 and body["jobs"] == 5
    top = body["items"][0]
    assert top["count"] == 3 and top["collections"] == ["letters", "maps"]
    assert top["sample"] == down[2].status.message and top["sample_job"] == down[2].jid
    assert top["first_seen"] == clock.exact(down[0].status.last_modified)
    filtered = client.get(
        "/api/failed/causes?profile=maps", HTTP_AUTHORIZATION=f"Bearer {secret}"
    ).json()
    assert [g["count"] for g in filtered["items"]] == [1]
    assert client.get("/api/failed/causes").status_code == 401


def test_a_new_failure_reads_only_its_own_status(zk, make_job, make_batch, viewer):
    batch = make_batch()
    for i in range(30):
        make_job("Failed", batch=batch, message=f"HTTP {500 + i % 4} from host{i}.example.org")
    assert viewer.get(reverse("failed-causes")).status_code == 200  # every status read once
    make_job("Failed", batch=batch, message="HTTP 502 from host99.example.org")
    zindex.for_client(zk).settle()
    statuses: list[str] = []
    original = zk._call

    def counting(request, async_object):
        for path in getattr(request, "full_paths", None) or [getattr(request, "path", "")]:
            if path.endswith("/status") and "/jobs/jid" in path:
                statuses.append(path)
        return original(request, async_object)

    zk._call = counting
    try:
        html = viewer.get(reverse("failed-causes")).content.decode()
    finally:
        zk._call = original
    assert 'data-count="31"' in html
    # The read index's read of the new job and this module's: none of the 30 read before.
    assert len(statuses) <= 2 and all(p.endswith("jid0000000031/status") for p in statuses)


NODE_DOWN = (
    "storing: storage service refused to add ark:/99999/fk4{n} on node 9501: "
    "HTTP 404 REQUESTED_ITEM_NOT_FOUND: node not found: 9501"
)


def test_a_storage_node_cause_offers_the_node_not_its_collections_nor_a_hold_in_place(
    zk, make_job, operator
):
    """Issue 53, item 6: a refusal of storage is held at the node; a hold in place is said."""
    for n in range(2):
        make_job("Failed", profile="letters", failed_at="Storing", message=NODE_DOWN.format(n=n))
    zindex.for_client(zk).settle()
    html = operator.get(reverse("failed-causes")).content.decode()
    assert "Hold storage node 9501…" in html and 'name="node" value="9501"' in html
    assert "Hold its collection" not in html and "Hold letters" not in html
    held = operator.post(reverse("node-hold-new"), {"node": "9501", "reason": "node down"})
    assert held.status_code == 303
    html = operator.get(reverse("failed-causes")).content.decode()
    assert "Hold storage node 9501…" not in html
    assert "Storage node 9501 is held by operator-user (node down)" in html


def test_a_collection_held_already_is_not_offered_again(zk, two_causes, operator):
    operator.post(
        reverse("collection-hold", args=["letters", "hold"]),
        {"reason": "depositor down", "next": reverse("failed-causes")},
    )
    assert "letters" in locks.holds_list(zk).collections
    html = operator.get(reverse("failed-causes")).content.decode()
    assert "letters is held already" in html
    assert f'action="{reverse("collection-hold", args=["letters", "hold"])}"' not in html
