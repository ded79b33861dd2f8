"""One clock, proven (issue 53, item 4): in a zone that is not UTC, every page, flash, audit
detail, mail, alert and CSV export writes a time one way (``2026-11-25 10:04:40 PST``, or a day
``2026-11-25``), every ``<time>`` carries the exact UTC time on hover, and every time the API
answers is one ISO-8601 form (``2026-11-25T18:04:40+00:00``). Real ZooKeeper, SMTP and webhook.

The detector finds any written time (ISO with or without ``T``, with an offset, a zone name or
none, a mail's RFC 2822 date, a bare time of day) and checks it against the one form, so a page
that writes a time another way fails whatever the way is."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from typing import Any

import pytest
from alerts.conftest import Webhook, mails_with, only, smtp, webhook  # noqa: F401 - fixtures
from django.test import Client
from django.urls import reverse

from queues.console import backlog
from queues.daemons.alerting import Evaluator, deliver_due, digest_draft, write_messages
from queues.daemons.breakers import BREAKER
from queues.services import hold_moves
from queues.steps import notify
from queues.zk import batches
from queues.zk.maintenance import node_hold_set

pytestmark = pytest.mark.django_db

ZONE = "America/Los_Angeles"
# The one written form: a time to the second or minute with the zone's name, or a day.
ONE_FORM = re.compile(r"\d{4}-\d{2}-\d{2}(?: \d{2}:\d{2}(?::\d{2})? P[SD]T)?")
# The API's one form, and the hover's: UTC, to the second.
EXACT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\+00:00")
# Any time written any way: ISO-ish (with T or a space, seconds, fractions, Z, an offset or a
# zone name), an RFC 2822 date, a bare time of day.
ANY_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?"
    r"(?: ?(?:Z|[+-]\d{2}:?\d{2}|[A-Z]{2,5})\b)?)?"
    r"|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{1,2} \w{3} \d{4} \d{2}:\d{2}(?::\d{2})?(?: [+-]\d{4})?"
    r"|\b\d{1,2}:\d{2}(?::\d{2})?\b"
)


def people_times(text: str) -> list[str]:
    """The times in ``text`` that are not in the one form."""
    return [m.group(0) for m in ANY_TIME.finditer(text) if not ONE_FORM.fullmatch(m.group(0))]


class Reader(HTMLParser):
    """A page's text as a person reads it (not scripts, styles, form values or URLs), and every
    ``<time>`` with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.times: list[dict[str, str | None]] = []
        self.titles: list[str] = []
        self.bare: list[str] = []  # text outside every ``<time>``, where no hover can be
        self._skip = 0
        self._skipping: list[str] = []
        self._in_time = 0
        self._svg = 0
        self._svg_title: list[str] | None = None
        self._label: list[str] | None = None
        self._label_hover: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # A record shown as ZooKeeper stores it (``<pre data-verbatim>``) is Merritt's text.
        if tag in ("script", "style") or (tag == "pre" and "data-verbatim" in dict(attrs)):
            self._skip += 1
            self._skipping.append(tag)
            return
        if tag == "time":
            self.times.append(dict(attrs))
            self._in_time += 1
        # In an SVG the hover is a ``<title>``: a label's own (its exact time), or a shape's
        # (read on hovering, so a hover itself).
        if tag == "svg":
            self._svg += 1
        elif self._svg and tag == "text":
            self._label = []
            self._label_hover = None
        elif self._svg and tag == "title":
            self._svg_title = []
        for name, value in attrs:
            if name in ("title", "aria-label", "placeholder") and value and tag != "time":
                self.titles.append(value)

    def handle_endtag(self, tag: str) -> None:
        if tag == "time" and self._in_time:
            self._in_time -= 1
        if tag == "svg" and self._svg:
            self._svg -= 1
        elif tag == "title" and self._svg_title is not None:
            hover = "".join(self._svg_title)
            self._svg_title = None
            if self._label is not None:  # a label's hover: its exact time, not a reader's text
                self._label_hover = hover
                self.times.append({"title": hover, "datetime": hover})
            else:
                self.text.append(hover)
        elif tag == "text" and self._label is not None:
            label = " ".join(self._label)
            self.text.append(label)
            if self._label_hover is None:
                self.bare.append(label)
            self._label = None
        if self._skipping and tag == self._skipping[-1]:
            self._skipping.pop()
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        if self._svg_title is not None:
            self._svg_title.append(data)
        elif self._label is not None:
            self._label.append(data)
        else:
            self.text.append(data)
            if not self._in_time:
                self.bare.append(data)


def check_page(html: str, where: str) -> int:
    """Asserts the one form on a page; how many times it shows."""
    reader = Reader()
    reader.feed(html)
    text = " ".join(reader.text)
    assert people_times(text) == [], (where, people_times(text))
    for title in reader.titles:
        assert people_times(title) == [], (where, title)
    for attrs in reader.times:
        assert EXACT.fullmatch(attrs.get("title") or ""), (where, attrs)
        assert attrs.get("datetime") == attrs.get("title"), (where, attrs)
    # Every time of day a person reads, in a sentence too, is a ``<time>`` with its exact UTC
    # time on hover (a day alone is a day, not a moment).
    bare = [t for t in ONE_FORM.findall(" ".join(reader.bare)) if " " in t]
    assert bare == [], (where, "times without a hover", bare)
    return len(ONE_FORM.findall(text))


# Records the API copies as ZooKeeper holds them (Merritt's own stamps inside): not the API's
# words, so not its clock.
VERBATIM = {"status", "configuration", "identifiers", "metadata", "inventory", "store"}
VERBATIM_ANSWERS = {"status_report"}


def api_times(value: Any, path: str = "") -> list[tuple[str, str]]:
    """Every string in an API answer that holds a time, with where it is."""
    found = []
    if isinstance(value, dict):
        for key, item in value.items():
            if key in VERBATIM | VERBATIM_ANSWERS:
                continue
            found += api_times(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += api_times(item, f"{path}[{i}]")
    elif isinstance(value, str) and ANY_TIME.search(value) and re.search(r"\d{4}-\d{2}", value):
        found.append((path, value))
    return found


@pytest.fixture
def in_another_zone(settings: Any) -> None:
    settings.TIME_ZONE = ZONE
    backlog.clear_cache()  # its hour labels, written in the zone of an earlier test


def test_every_page_mail_alert_and_export_writes_a_time_one_way(
    in_another_zone: None,
    zk: Any,
    admin: Client,
    make_job: Any,
    make_batch: Any,
    make_access: Any,
    token_for: Any,
    smtp: Any,  # noqa: F811
    webhook: Webhook,  # noqa: F811
    settings: Any,
    tmp_path: Any,
) -> None:
    # Items in every kind of state, a report, holds with windows, a storage-node hold.
    batch = make_batch()
    failed = make_job("Failed", batch=batch, message="HTTP 404 on payload")
    done = make_job("Completed", batch=batch)
    held = make_job("Held")
    make_job("Pending")
    make_access("Failed")
    batches.batch_write_report(
        zk, batches.batch_load(zk, batch.bid), failed=[failed.jid], successful=[done.jid]
    )
    stamp = datetime.now(UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S %z")  # as ZooKeeper keeps it
    subject, body = notify.batch_summary(
        batch_id=batch.bid,
        title="Letters",
        submitter="ada",
        profile_name="demo",
        report={
            "last_modified": stamp,
            "failed_jobs": [failed.jid],
            "successful_jobs": [done.jid],
        },
        previous=None,
        state="Completed",
        console_url="https://console.example.org",
    )
    # The summary mail, as the batch page shows it (from the file mail backend) and as sent.
    smtp_backend = settings.EMAIL_BACKEND
    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    settings.EMAIL_FILE_PATH = tmp_path / "mail"
    notify.send(["ada@example.org"], subject, body)
    page = admin.get(f"/batches/{batch.bid}/").content.decode()
    assert 'class="mail"' in page
    assert check_page(page, "the batch page with its mail") >= 2
    settings.EMAIL_BACKEND = smtp_backend
    notify.send(["ada@example.org"], subject, body)
    later = (datetime.now(UTC) + timedelta(hours=2)).astimezone().strftime("%Y-%m-%dT%H:%M")
    # Flashes and audit details: holds with an end, placed through the pages.
    answer = admin.post(
        "/holds/node/", {"node": "9502", "reason": "patch", "until": later}, follow=True
    )
    assert answer.status_code == 200
    shown = check_page(answer.content.decode(), "the flash of a node hold")
    assert shown >= 1  # the flash and the window say when it ends
    hold_moves.collection_hold(profile="letters")
    node_hold_set(zk, 9501, by=BREAKER, reason="breaker: 5 x 503 from node 9501 in 12 s")
    admin.post(reverse("job-action", args=[held.jid, "release"]), {"reason": "go"})
    admin.post(f"/notes/job/{failed.jid}/", {"text": "looked at it"})
    # An alert fired, its mails and webhook posts sent, and a digest.
    only("node-held", threshold=0.0, quiet_seconds=60.0)
    evaluator = Evaluator(name="clock")
    assert evaluator.evaluate(zk=zk, now=datetime.now(UTC))
    write_messages(digest_draft(datetime.now(UTC)), datetime.now(UTC))
    deliver_due(now=datetime.now(UTC) + timedelta(seconds=1))

    pages = [
        "/",
        "/jobs/",
        f"/jobs/{failed.jid}/",
        f"/jobs/{done.jid}/",
        "/batches/",
        f"/batches/{batch.bid}/",
        "/failed/",
        "/failed/causes/",
        "/reports/",
        "/holds/",
        "/access/",
        "/consistency/",
        "/audit/",
        "/tokens/",
        "/consumers/",
        "/history/",
        "/stuck/",
        "/alerts/",
        "/collections/",
        "/collections/letters/",
        "/bulk/",
        f"/search/?q={failed.bid}&scope=",
    ]
    counted = 0
    for url in pages:
        response = admin.get(url)
        assert response.status_code in (200, 302), (url, response.status_code)
        if response.status_code == 200:
            counted += check_page(response.content.decode(), url)
    assert counted >= 15  # the pages do show times: the check looked at them

    # Mails (the batch summary, the alert, the digest) and the webhook's text.
    texts = [re.split(r"\r?\n\r?\n", m["data"], maxsplit=1)[1] for m in smtp.messages]
    texts += [p["json"]["text"] for p in webhook.posts]
    assert len(texts) >= 3
    for text in texts:
        assert people_times(text) == [], text
    assert all(re.search(r" P[SD]T\b", t) for t in texts)  # each says its times, in the zone
    assert people_times(body) == [], body

    # The CSV export a person opens; the JSON export and the API, the one ISO form.
    rows = list(
        csv.DictReader(io.StringIO(admin.get(f"/reports/{batch.bid}.csv").content.decode()))
    )
    assert rows and all(ONE_FORM.fullmatch(r["report"]) for r in rows), rows
    exported = json.loads(admin.get(f"/reports/{batch.bid}.json").content)
    assert EXACT.fullmatch(exported["report"]), exported["report"]

    api = Client(**token_for("viewer"))
    answers = [
        "/api/overview",
        "/api/jobs",
        f"/api/jobs/{failed.jid}",
        "/api/failed",
        "/api/failed/causes",
        "/api/batches",
        f"/api/batches/{batch.bid}",
        "/api/access",
        "/api/holds",
        "/api/reports",
        "/api/consistency",
        "/api/audit",
        "/api/consumers",
        "/api/caps",
        f"/api/notes?kind=job&item={failed.jid}",
    ]
    seen = 0
    for url in answers:
        response = api.get(url)
        assert response.status_code == 200, (url, response.content[:300])
        for where, value in api_times(json.loads(response.content)):
            if ANY_TIME.fullmatch(value):  # a field that is a time: the API's form
                assert EXACT.fullmatch(value), (url, where, value)
                seen += 1
            else:  # words for people (an audit entry's detail): the people's form
                assert people_times(value) == [], (url, where, value)
    assert seen >= 8  # created times, holds, windows, audit entries, notes
