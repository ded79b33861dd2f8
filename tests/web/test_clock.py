"""One clock (issue 25): every time shown, mailed or exported is in the console's zone, in one
form, with the exact UTC time on hover."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.core import mail
from django.template import Context, Template
from django.test import override_settings

from queues.core.clock import clock_text, exact
from queues.steps import notify

MOMENT = datetime(2026, 11, 25, 18, 4, 40, tzinfo=UTC)


def _render(value: object, precision: str = "") -> str:
    arg = f':"{precision}"' if precision else ""
    return Template("{% load console %}{{ v|when" + arg + " }}").render(Context({"v": value}))


@override_settings(TIME_ZONE="America/Los_Angeles")
@pytest.mark.parametrize(
    "value",
    [MOMENT, "2026-11-25T18:04:40+00:00", "2026-11-25T10:04:40-08:00", "2026-11-25 10:04:40 -0800"],
)
def test_a_time_in_any_form_it_is_kept_is_shown_one_way(value: object) -> None:
    # A datetime, ISO text (registrations, drains) or the contract's stamp (status nodes).
    assert _render(value) == (
        '<time datetime="2026-11-25T18:04:40+00:00" title="2026-11-25T18:04:40+00:00">'
        "2026-11-25 10:04:40 PST</time>"
    )
    assert "2026-11-25 10:04 PST</time>" in _render(value, "minutes")


@override_settings(TIME_ZONE="Europe/Berlin")
def test_the_zone_is_the_setting() -> None:
    assert clock_text(MOMENT) == "2026-11-25 19:04:40 CET"
    assert exact(MOMENT) == "2026-11-25T18:04:40+00:00"


def test_what_is_no_time_is_shown_as_it_is_and_nothing_as_nothing() -> None:
    assert _render(None) == "" and _render("") == ""
    assert _render("<b>soon</b>") == "&lt;b&gt;soon&lt;/b&gt;"


@override_settings(
    TIME_ZONE="America/Los_Angeles", EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend"
)
def test_the_summary_mail_says_its_times_in_the_same_zone_as_its_date_header() -> None:
    subject, body = notify.batch_summary(
        batch_id="bid0000000001",
        title="Letters",
        submitter="ada",
        profile_name="demo",
        report={
            "last_modified": "2026-11-25 10:04:40 -0800",
            "failed_jobs": [],
            "successful_jobs": ["jid0000000001"],
        },
        previous=None,
        state="Completed",
        console_url="https://console.example.org",
    )
    assert "Report:    report, 2026-11-25 10:04:40 PST" in body
    notify.send(["ada@example.org"], subject, body)
    (sent,) = mail.outbox
    header = sent.message()["Date"]
    assert header.endswith(("-0800", "-0700")), header  # the console's zone, not -0000


def _timed(text: object) -> str:
    return Template("{% load console %}{{ v|timed }}").render(Context({"v": text}))


@override_settings(TIME_ZONE="America/Los_Angeles")
def test_a_time_inside_a_sentence_gets_its_hover_and_the_rest_is_escaped() -> None:
    # The hour the clock goes back is written twice; its zone's name says which one it was.
    sentence = (
        "held since 2026-11-25 10:04 PST by <b>ada</b> & co; "
        "until 2026-11-01 01:30:00 PST, not 2026-11-01 01:30:00 PDT; Berlin 2026-11-25 10:04 CET"
    )
    assert _timed(sentence) == (
        'held since <time datetime="2026-11-25T18:04:00+00:00" title="2026-11-25T18:04:00+00:00">'
        "2026-11-25 10:04 PST</time> by &lt;b&gt;ada&lt;/b&gt; &amp; co; until "
        '<time datetime="2026-11-01T09:30:00+00:00" title="2026-11-01T09:30:00+00:00">'
        "2026-11-01 01:30:00 PST</time>, not "
        '<time datetime="2026-11-01T08:30:00+00:00" title="2026-11-01T08:30:00+00:00">'
        "2026-11-01 01:30:00 PDT</time>; Berlin 2026-11-25 10:04 CET"  # another zone's: as it is
    )
    assert _timed(None) == ""
    assert _timed("no time here, 10:04 alone") == "no time here, 10:04 alone"
