"""A malformed registration node under /mrt-console/consumers (written by anything that reaches
the ensemble) is shown as a bad row saying what is wrong; /consumers/, /api/consumers and the
pages that read registrations keep answering for everyone (issue 23, item 8)."""

from __future__ import annotations

import json

import pytest

from queues.daemons.registration import ProcessObserver
from queues.zk import client as zkmod
from queues.zk import consumers as zconsumers

from .conftest import SlowStep

pytestmark = pytest.mark.django_db

BAD = {
    "bad-1": json.dumps(
        {"host": "bad.example", "pid": 1, "publish_seconds": "x", "threads": "none", "steps": [3]}
    ).encode(),
    "garbage-2": b"\xff not json",
    "list-3": b"[1, 2, 3]",
    # Valid JSON, but no text: the page could not be written out with it (a 500 before).
    "surrogate-4": b'{"host": "x\\ud800y", "pid": 4}',
}


@pytest.fixture
def registrations(zk, zk_hosts):
    """One good process beside four bad nodes."""
    other = zkmod.connect(zk_hosts)
    observer = ProcessObserver(
        other, [SlowStep(zk=other)], record=False, publish_seconds=0.2, host="good", pid=5
    )
    observer.start()
    for name, body in BAD.items():
        zk.create(f"{zconsumers.CONSUMERS}/{name}", body, ephemeral=True)
    yield
    observer.stop()
    other.stop()
    other.close()


def test_a_bad_registration_is_a_row_saying_what_is_wrong(zk, registrations, viewer) -> None:
    response = viewer.get("/consumers/")
    assert response.status_code == 200
    page = response.content.decode()
    assert 'id="consumer-good-5"' in page and 'id="bad-good-5"' not in page
    bad = page[page.index('id="bad-bad-1"') :]
    bad = bad[: bad.index("</p>")]
    assert "publish_seconds is not a positive number: &#x27;x&#x27;" in bad
    assert "threads is not a list of thread entries" in bad
    assert "steps is not a list of strings" in bad
    # The good fields of the bad node are still shown.
    assert "bad.example · pid 1" in page
    assert 'id="bad-garbage-2"' in page and "not valid JSON" in page
    assert 'id="bad-list-3"' in page and "expected a JSON object, found list" in page
    assert 'id="bad-surrogate-4"' in page and "lone surrogate" in page
    # The htmx refresh of the same part, and the stuck-job list that names holders.
    assert viewer.get("/consumers/", HTTP_HX_REQUEST="true").status_code == 200
    assert viewer.get("/stuck/").status_code == 200


def test_the_api_lists_a_bad_registration_with_its_error(registrations, make_user) -> None:
    from django.test import Client

    from queues.operator.audit import ApiToken

    _token, key = ApiToken.issue(user=make_user("viewer", "api-viewer"), name="t")
    response = Client().get("/api/consumers", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200
    entries = {e["name"]: e for e in response.json()["consumers"]}
    assert sorted(entries) == ["bad-1", "garbage-2", "good-5", "list-3", "surrogate-4"]
    assert "lone surrogate" in entries["surrogate-4"]["error"]
    assert "error" not in entries["good-5"]
    assert "publish_seconds is not a positive number: 'x'" in entries["bad-1"]["error"]
    assert "publish_seconds" not in entries["bad-1"] and entries["bad-1"]["host"] == "bad.example"
    assert entries["list-3"]["error"].endswith("expected a JSON object, found list")


def test_registration_check_keeps_good_fields_and_names_bad_ones() -> None:
    data, problems = zconsumers.registration_check(
        {
            "host": "h",
            "pid": True,
            "publish_seconds": float("inf"),
            "locks": ["/jobs/jid0000000001/lock"],
            "locks_count": 0,
            "drain": {"by": ["x"]},
            "unknown": 1,
        }
    )
    assert data == {"host": "h", "locks_count": 0}
    assert problems == [
        "pid is not a whole number: True",
        "publish_seconds is not a positive number: inf",
        "drain is not an object of strings: {'by': ['x']}",
        "locks_count is smaller than the locks listed",
    ]
