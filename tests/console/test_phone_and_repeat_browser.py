"""Issue 15's last two defects in a real Chromium: a Resume offered on a failure that will repeat
as it is says so beside the button, and on a phone (390 x 844) the job tables keep their action
buttons on screen and the state diagrams stay readable."""

from __future__ import annotations

import pytest

from tests.browser import PHONE, logged_in, shot

from .conftest import PASSWORD

DIGEST = (
    "downloading: 1 of 1 downloads failed: https://depositor.example.org/letters/a.pdf: "
    "sha256 digest 9ab1c0 does not match 0f3c77"
)
CONNECTION = "downloading: https://depositor.example.org/letters/b.pdf: connection failed"
TABLET = {"width": 700, "height": 1000}


@pytest.fixture
def phone_page(browser, live_server, make_user):
    make_user("admin", "pia")
    with logged_in(browser, live_server.url, "pia", PASSWORD, viewport=PHONE) as page:
        yield page


@pytest.mark.parametrize(
    ("message", "words"),
    [
        (DIGEST, "the digest does not match"),
        ("https://d.example.org/x.pdf: HTTP 404 Not Found", "HTTP 404"),
        ("1 of 2 downloads failed: https://d.example.org/x: HTTP 410 Gone", "HTTP 410"),
        (
            "https://10.0.0.1/x: host 10.0.0.1 resolves to 10.0.0.1, a private address, "
            "which is not fetched for depositors",
            "not fetched for depositors",
        ),
        ("manifest line 3: file name '../etc/passwd' contains '..'", "file name"),
        (
            "container https://d/x.zip: x.zip: member 'a' is a symlink; links are not accepted "
            "in containers (unpack them into plain files)",
            "links",
        ),
        ("https://d/x: the object is larger than the per-object limit of 10 bytes", "limit"),
        ("container https://d/x.zip: x.zip: member 'C:/a' is absolute", "file name"),
        (
            "container https://d/x.zip: x.zip unpacks to more than 100 times its packed size of "
            "10 bytes (the compression-ratio limit)",
            "compression-ratio",
        ),
    ],
)
def test_will_repeat_recognises_failures_a_resume_repeats(message, words):
    from queues.templatetags.console import will_repeat

    sentence = will_repeat(message)
    assert sentence.startswith("This failure will repeat") and words in sentence


@pytest.mark.parametrize(
    "message",
    [
        CONNECTION,
        "",
        None,
        "https://d/x: HTTP 503 Service Unavailable",
        "minting: EZID answered HTTP 404 to mint",  # not the depositor's server
        "storing: storage service unreachable",
        "Not resumable: pending: manifest digest mismatch",  # refused by the service instead
    ],
)
def test_will_repeat_is_silent_on_failures_a_resume_may_fix(message):
    from queues.templatetags.console import will_repeat

    assert will_repeat(message) == ""


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_resume_beside_a_failure_that_will_repeat_says_so(operator_page, live_server, make_job):
    page = operator_page
    digest = make_job("Failed", message=DIGEST)
    flaky = make_job("Failed", message=CONNECTION)

    page.goto(f"{live_server.url}/jobs/{digest.jid}/")
    actions = page.locator("#job-actions")
    assert actions.locator("button:text-is('Resume')").is_visible()  # still offered
    note = actions.locator(".repeat-note")
    assert note.is_visible()
    text = note.inner_text()
    assert "will repeat unless the depositor's server changes" in text
    assert "digest does not match" in text
    shot(page, "repeat-note-job")

    page.goto(f"{live_server.url}/jobs/{flaky.jid}/")
    assert page.locator("#job-actions button:text-is('Resume')").is_visible()
    assert page.locator("#job-actions .repeat-note").count() == 0

    for url in ("/failed/", "/jobs/?state=Failed"):
        page.goto(f"{live_server.url}{url}")
        row = page.locator(f"#job-row-{digest.jid}")
        cell = row.locator("td.actions")
        assert cell.locator("button:text-is('Resume')").is_visible(), url
        assert "digest does not match" in cell.locator(".repeat-note").inner_text(), url
        flaky_row = page.locator(f"#job-row-{flaky.jid}")
        assert flaky_row.locator("button:text-is('Resume')").is_visible(), url
        assert flaky_row.locator(".repeat-note").count() == 0, url
    shot(page, "repeat-note-failed")


WIDE = """limit => [...document.body.querySelectorAll('*')]
    .filter(e => e.getBoundingClientRect().right > limit)
    .filter(e => !e.parentElement.closest('.table-wrap, .diagram-wrap')
                 || ['absolute', 'fixed'].includes(getComputedStyle(e).position))
    .slice(0, 8).map(e => e.tagName + (e.id ? '#' + e.id : '') + '.' + e.className)"""


def _page_fits(page, viewport=PHONE) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    limit = viewport["width"] + 1
    assert width <= limit, f"{width} px wide: {page.evaluate(WIDE, limit)}"


def _on_screen(locator, viewport=PHONE) -> None:
    # Not scrolled into view: that would scroll a table's wrapper sideways and hide the defect.
    assert locator.is_visible()
    box = locator.bounding_box()
    assert box is not None
    assert box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"], box


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_job_tables_keep_their_buttons_on_a_phone(phone_page, live_server, make_batch, make_job):
    page = phone_page
    batch = make_batch()
    job = make_job("Failed", batch=batch, message=DIGEST)
    make_job("Failed", batch=batch, message=CONNECTION)
    shots = {"/failed/": "phone-failed", "/jobs/?state=Failed": "phone-jobs-failed"}
    shots[f"/batches/{batch.bid}/"] = "phone-batch"
    for url, name in shots.items():
        page.goto(f"{live_server.url}{url}")
        row = page.locator(f"#job-row-{job.jid}")
        _on_screen(row.locator("button:text-is('Resume')"))
        _on_screen(row.locator("a:has-text('Delete')"))
        _page_fits(page)
        shot(page, name)
    # A tablet: the table scrolls inside its wrapper, the actions column stays in sight.
    page.set_viewport_size(TABLET)
    page.goto(f"{live_server.url}/jobs/?state=Failed")
    _page_fits(page, TABLET)
    _on_screen(page.locator(f"#job-row-{job.jid} button:text-is('Resume')"), TABLET)
    shot(page, "tablet-jobs-failed")


def _diagram_scale(page, selector: str) -> dict:
    return page.eval_on_selector(
        selector,
        """svg => {
            const box = svg.getBoundingClientRect();
            const name = svg.querySelector('text.name');
            const font = parseFloat(getComputedStyle(name).fontSize);
            const scale = box.width / svg.viewBox.baseVal.width;
            return {scale, font: font * scale, width: box.width};
        }""",
    )


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_state_diagrams_stay_readable_on_a_phone(phone_page, live_server, make_batch, make_job):
    page = phone_page
    batch = make_batch()
    job = make_job("Failed", batch=batch, message=DIGEST)
    for url, name in (
        ("/", "phone-overview"),
        (f"/batches/{batch.bid}/", None),
        (f"/jobs/{job.jid}/", "phone-job"),
    ):
        page.goto(f"{live_server.url}{url}")
        if page.locator("#batch-diagrams").count():  # below the jobs, folded: open them
            page.click("#batch-diagrams summary")
        for index in range(page.locator("svg.diagram").count()):
            svg = f"(//*[local-name()='svg' and contains(@class,'diagram')])[{index + 1}]"
            measured = _diagram_scale(page, f"xpath={svg}")
            assert measured["scale"] >= 0.6, (url, index, measured)
            assert measured["font"] >= 10, (url, index, measured)
        _page_fits(page)
        if name:
            shot(page, name)
