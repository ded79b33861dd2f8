"""A service outside held by hand and released, through daphne (issue 50): the holds page's form
and button (POST with CSRF, operator role), the overview's card, the job page's reason for the
wait, the API's list and actions, the audit log; a malformed name is a 400 and holds nothing."""

from __future__ import annotations

import re
import sqlite3
import urllib.error
from pathlib import Path
from typing import Any

import pytest
import requests

from queues.zk.batches import batch_create
from queues.zk.jobs import job_create, job_transition
from queues.zk.maintenance import service_hold_set, service_holds
from tests.core.helpers import snapshot
from tests.live.conftest import api_json, api_token, console_env, daphne, log_in

pytestmark = [pytest.mark.live_server, pytest.mark.django_db(transaction=True)]

USER, PASSWORD = "ops", "pw-" + "x" * 20


def _csrf(session: requests.Session, url: str) -> str:
    page = session.get(url, timeout=30)
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


def _post(session: requests.Session, base: str, path: str, data: dict[str, str]) -> Any:
    token = _csrf(session, f"{base}/holds/")
    return session.post(
        f"{base}{path}",
        data={**data, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{base}/holds/"},
        timeout=30,
        allow_redirects=False,
    )


def _audit(db: Path) -> list[tuple[str, str, str, str, int]]:
    with sqlite3.connect(db) as conn:
        return list(
            conn.execute(
                "SELECT action, kind, item_id, reason, ok FROM queues_auditentry "
                "WHERE kind = 'service' ORDER BY id"
            )
        )


def test_an_operator_holds_a_depositors_server_and_releases_it(
    zk: Any, zk_hosts: str, tmp_path: Path
) -> None:
    env = console_env(zk_hosts, tmp_path, user=USER, password=PASSWORD)
    batch = batch_create(zk, submission={"profile": "demo", "submitter": "t"})
    job = job_create(
        zk,
        bid=batch.bid,
        configuration={"profile": "demo", "payload_url": "https://files.example.org/a.txt"},
    )
    job_transition(zk, job, "Estimating")
    with daphne(env, tmp_path / "daphne.log") as base:
        session = log_in(base, USER, PASSWORD)

        # Refused whole: a name that is no service, and a hold without its reason.
        for data in (
            {"service": "files.example.org/../x:443", "reason": "down"},
            {"service": "storage", "reason": "down"},
            {"service": "depositor files.example.org:443", "reason": ""},
        ):
            assert _post(session, base, "/holds/service/", data).status_code == 400, data
        assert service_holds(zk) == {}

        answer = _post(
            session,
            base,
            "/holds/service/",
            {"service": "depositor files.example.org:443", "reason": "their <b>server</b> moves"},
        )
        assert answer.status_code == 303, answer.text[-500:]
        name = "depositor files.example.org:443"
        hold = service_holds(zk)[name]
        assert (hold.by, hold.reason) == (USER, "their <b>server</b> moves")

        page = session.get(f"{base}/holds/", timeout=30).text
        assert 'id="service-depositor-files-example-org-443"' in page
        assert "their &lt;b&gt;server&lt;/b&gt; moves" in page  # escaped
        overview = session.get(f"{base}/", timeout=30).text
        assert 'id="service-holds-card"' in overview and name in overview
        job_page = session.get(f"{base}/jobs/{job.jid}/", timeout=30).text
        assert 'id="service-wait"' in job_page
        assert f"Waiting before Estimating: {name} is held by {USER}" in job_page

        key = api_token(env, tmp_path / "key", user=USER, name="t")
        listed = api_json(f"{base}/api/holds", key)["services"]
        assert listed[name]["by"] == USER and listed[name]["reason"] == hold.reason

        answer = _post(session, base, "/holds/service/depositor:files.example.org:443/release/", {})
        assert answer.status_code == 303
        assert service_holds(zk) == {}

        # A hold posted with an end is refused as the API refuses it (a service's hold has none),
        # not placed without it.
        before = snapshot(zk)
        for until in ("2020-01-01T00:00", "2099-01-01T00:00"):
            answer = _post(
                session, base, "/holds/service/ezid/hold/", {"reason": "r", "until": until}
            )
            assert answer.status_code == 400, until
            assert "a service&#x27;s hold has no end" in answer.text
        assert snapshot(zk) == before  # nothing moved

        # The API opens and closes a breaker by hand too; a malformed name is its 400.
        api_json(f"{base}/api/holds/service/ezid/hold", key, {"reason": "EZID maintenance"})
        assert service_holds(zk)["ezid"].reason == "EZID maintenance"
        api_json(f"{base}/api/holds/service/ezid/release", key, {})
        assert service_holds(zk) == {}
        with pytest.raises(urllib.error.HTTPError) as refused:
            api_json(f"{base}/api/holds/service/depositor:x/hold", key, {"reason": "r"})
        assert refused.value.code in (400, 404)
        assert service_holds(zk) == {}

    assert [(*row[:3], row[4]) for row in _audit(tmp_path / "console.sqlite3")] == [
        ("hold", "service", "depositor:files.example.org:443", 1),
        ("release", "service", "depositor:files.example.org:443", 1),
        ("hold", "service", "ezid", 0),  # the two with an end, refused (and audited so)
        ("hold", "service", "ezid", 0),
        ("hold", "service", "ezid", 1),
        ("release", "service", "ezid", 1),
    ]


def test_a_breakers_hold_is_listed_with_its_reason(zk: Any) -> None:
    assert service_hold_set(
        zk, "callback hooks.example.org:8443", by="breaker", reason="breaker: 5 x 503"
    )
    assert not service_hold_set(zk, "callback:hooks.example.org:8443", by="someone")
    [(name, hold)] = service_holds(zk).items()
    assert (name, hold.by, hold.key) == (
        "callback hooks.example.org:8443",
        "breaker",
        "callback:hooks.example.org:8443",
    )
