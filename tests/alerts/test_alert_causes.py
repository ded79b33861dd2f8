"""Issue 53, item 3: an alert says its cause. A failures alert names its top causes, counted by
the grouping of ``/failed/causes/``, with a link that shows each of them there; an operator's own
storage-node hold does not page at once (a breaker's or an unexplained one does); a "resolved"
message says what is over, not the alert's words again. Real ZooKeeper, SMTP and webhook."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
from daemons.conftest import DEMO
from django.test import Client

from queues.console.failure_causes import failure_causes
from queues.core.states import JOB_STEPS
from queues.daemons.alerting import Evaluator, deliver_due
from queues.daemons.breakers import BREAKER
from queues.models import AlertEpisode
from queues.services import moves
from queues.zk.batches import batch_create
from queues.zk.jobs import job_create, job_transition
from queues.zk.maintenance import node_hold_set, window_set

from .conftest import Webhook, a_moment, later, mails_with, only

pytestmark = pytest.mark.django_db

QUIET = 60.0
DOWN = "storing: storage node 9501 is down (HTTP 503 from http://store.example.org:8080/add)"


def failed_in(zk: Any, step_index: int, message: str, profile: str = DEMO) -> str:
    """A job that failed in the step ``JOB_STEPS[step_index]`` with ``message``."""
    batch = batch_create(zk, submission={"profile": profile, "submitter": "tester"})
    job = job_create(zk, bid=batch.bid, configuration={"profile": profile, "submitter": "t"})
    for step in JOB_STEPS[1 : step_index + 1]:
        job = job_transition(zk, job, step)
    return job_transition(zk, job, "Failed", message=message).jid


def test_a_failures_alert_names_its_top_causes_with_counts_and_links(
    zk: Any, smtp: Any, webhook: Webhook, evaluator: Evaluator, settings: Any, viewer: Client
) -> None:
    settings.MRT_ALERT_WEBHOOK_FORMAT = "json"
    settings.MRT_CONSOLE_URL = "https://queue.example.org"
    storing = JOB_STEPS.index("Storing")
    for _ in range(4):
        failed_in(zk, storing, DOWN)
    for _ in range(2):
        failed_in(zk, 3, "downloading: HTTP 404 on payload")
    only("failures", threshold=5.0, quiet_seconds=QUIET)

    fired = evaluator.evaluate(zk=zk, now=a_moment())
    assert len(fired) == 1 and "alert failures" in fired[0]
    [episode] = AlertEpisode.objects.filter(kind="failures")
    assert episode.summary.startswith("6 jobs failed in the last 10 minutes, 4 of them Storing: ")
    assert deliver_due(now=a_moment()) == 2

    # The same grouping as the causes page: its keys, its counts.
    groups = {g.key: g for g in failure_causes(zk=zk).groups}
    assert sorted(g.count for g in groups.values()) == [2, 4]
    [body] = [p["json"] for p in webhook.posts]
    causes = body["causes"]
    assert [c["count"] for c in causes] == [4, 2]
    assert causes[0]["cause"].startswith("Storing: storing: storage node <n> is down")
    assert body["link"] == "https://queue.example.org/failed/causes/"
    [mail] = mails_with(smtp, "ALERT")
    assert "Top causes:" in mail["data"]
    for cause in causes:
        url = urlsplit(cause["url"])
        assert url.netloc == "queue.example.org" and url.path == "/failed/causes/"
        key = url.query.removeprefix("cause=")
        assert groups[key].count == cause["count"] == cause["total"]
        assert f"{cause['count']} x {cause['cause']}" in mail["data"].replace("=\r\n", "")
        # The link shows that cause alone, with its count and its jobs' actions.
        html = viewer.get(f"{url.path}?{url.query}").content.decode()
        assert html.count('class="card failed-cause"') == 1
        assert f'id="cause-{key}" data-key="{key}" data-count="{cause["count"]}"' in html
        assert 'id="cause-alone"' in html
    assert viewer.get("/failed/causes/?cause=../x").status_code == 400


def test_a_collection_alert_counts_its_own_failures_and_links_the_filtered_page(
    zk: Any, smtp: Any, evaluator: Evaluator, settings: Any, viewer: Client
) -> None:
    storing = JOB_STEPS.index("Storing")
    for _ in range(3):
        failed_in(zk, storing, DOWN, profile="letters")
    failed_in(zk, storing, DOWN, profile=DEMO)  # the same cause in another collection
    only("collection-failures", threshold=2.0, quiet_seconds=QUIET)
    assert len(evaluator.evaluate(zk=zk, now=a_moment())) == 1
    [episode] = AlertEpisode.objects.filter(kind="collection-failures")
    assert episode.key == "letters"
    assert "3 x Storing: storing: storage node <n> is down" in episode.detail
    assert "(3 failed jobs in all)" in episode.detail  # of this collection, not the 4 in all
    assert "/failed/causes/?profile=letters&cause=" in episode.detail
    assert "All causes: http" in episode.detail and "/failed/causes/?profile=letters" in (
        episode.detail
    )
    page = viewer.get("/alerts/").content.decode()
    assert '<a href="http' in page and "profile=letters&amp;cause=" in page  # links on the page


def test_an_operators_own_node_hold_does_not_page_at_once(
    zk: Any, smtp: Any, evaluator: Evaluator, settings: Any
) -> None:
    settings.MRT_ALERT_HAND_HOLD_AFTER = 600.0
    only("node-held", threshold=0.0, quiet_seconds=QUIET)
    node_hold_set(zk, 9501, by="olga", reason="node 9501 unreachable")
    t = a_moment()
    for step in (0, 5, 300, 590):
        assert evaluator.evaluate(zk=zk, now=later(t, step)) == []
    assert not AlertEpisode.objects.exists()
    # Forgotten: an hour later it pages, and says who held it and for how long.
    fired = evaluator.evaluate(zk=zk, now=later(t, 601))
    assert len(fired) == 1
    [episode] = AlertEpisode.objects.filter(kind="node-held")
    assert "held by olga for 10 min (node 9501 unreachable) and is not released" in episode.summary


def test_an_operators_node_hold_in_a_maintenance_window_is_left_to_the_window(
    zk: Any, evaluator: Evaluator, settings: Any
) -> None:
    settings.MRT_ALERT_HAND_HOLD_AFTER = 0.0
    only("node-held", threshold=0.0, quiet_seconds=QUIET)
    node_hold_set(zk, 9501, by="olga", reason="patch")
    window_set(zk, "node", "9501", until=later(a_moment(), 3600), reason="patch")
    assert evaluator.evaluate(zk=zk, now=later(a_moment(), 5)) == []


@pytest.mark.parametrize(
    ("by", "reason", "said"),
    [
        (BREAKER, "breaker: 5 x 503 from node 9501 in 12 s", "held by its breaker (breaker: 5 x"),
        ("", "", "held by nobody recorded (no reason given)"),
        ("someone", "", "held by someone (no reason given)"),
    ],
)
def test_a_breakers_or_unexplained_node_hold_pages_at_once(
    zk: Any, evaluator: Evaluator, settings: Any, by: str, reason: str, said: str
) -> None:
    settings.MRT_ALERT_HAND_HOLD_AFTER = 3600.0
    only("node-held", threshold=0.0, quiet_seconds=QUIET)
    node_hold_set(zk, 9501, by=by, reason=reason)
    assert len(evaluator.evaluate(zk=zk, now=a_moment())) == 1
    [episode] = AlertEpisode.objects.filter(kind="node-held")
    assert said in episode.summary


def test_the_resolved_message_says_the_node_is_no_longer_held_and_who_released_it(
    zk: Any, smtp: Any, webhook: Webhook, evaluator: Evaluator, make_user: Any
) -> None:
    only("node-held", threshold=0.0, quiet_seconds=QUIET)
    node_hold_set(zk, 9501, by=BREAKER, reason="breaker: 5 x 503 from node 9501 in 12 s")
    t = a_moment()
    assert len(evaluator.evaluate(zk=zk, now=t)) == 1
    olga = Client()
    olga.force_login(make_user("operator", "olga"))
    assert olga.post("/holds/node/9501/release/", {"reason": "back"}).status_code == 303
    cleared = a_moment()
    assert evaluator.evaluate(zk=zk, now=cleared) == []
    assert len(evaluator.evaluate(zk=zk, now=later(cleared, QUIET))) == 1
    deliver_due(now=later(cleared, QUIET))
    [done] = mails_with(smtp, "RESOLVED")
    assert "Resolved: storage node 9501 is no longer held: released by olga at " in done["data"]
    [post] = [p["json"]["text"] for p in webhook.posts if "RESOLVED" in p["json"]["text"]]
    subject = post.split("\n", 1)[0]
    assert "RESOLVED Storage node held: storage node 9501 is no longer held" in subject
    assert "is held" not in subject


def test_a_resume_of_the_failures_resolves_with_what_is_over(
    zk: Any, smtp: Any, evaluator: Evaluator
) -> None:
    jids = [failed_in(zk, 3, "downloading: HTTP 404") for _ in range(3)]
    only("failures", threshold=2.0, quiet_seconds=QUIET)
    t = a_moment()
    assert len(evaluator.evaluate(zk=zk, now=t)) == 1
    for jid in jids:
        moves.job_resume(jid=jid)
    assert evaluator.evaluate(zk=zk, now=later(t, 1)) == []
    assert len(evaluator.evaluate(zk=zk, now=later(t, 1 + QUIET))) == 1
    deliver_due(now=later(t, 1 + QUIET))
    [done] = mails_with(smtp, "RESOLVED")
    assert "failures in the last 10 minutes are back within the threshold" in done["data"]
