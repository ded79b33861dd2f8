"""The console by keyboard alone, in a real Chromium: every main flow done with Tab, Shift+Tab,
Enter, Space, Escape and typing, never a click. At each stop on the way the focused control
must have a name and a visible focus indicator of the console's own (2 px or more), and after
an htmx swap, a page's reload or a closed disclosure the focus must be somewhere sensible: on
the control that acted if it is still there, else on the region that replaced it, never lost
to <body>. axe (test_accessibility_browser.py) checks none of this."""

from __future__ import annotations

import re
from typing import Any

import pytest

from queues.console import failed_reads
from queues.zk import batches
from queues.zk.maintenance import node_hold_set
from tests.browser import close_context, shot

from .conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LONG = (
    "downloading: 1 of 1 downloads failed: https://depositor.example.org/collections/letters/"
    "2026/volume-0007/scans/page-0001.tif: after 3 attempts the server kept answering with a "
    "body whose digest does not match the manifest: HTTP 404 at the end"
)

# What the focused element is: its tag, id, accessible name (as far as the page's own markup
# gives one: aria-label, aria-labelledby, its label, its text, its title) and its focus style.
FOCUSED = """() => {
  const el = document.activeElement;
  if (!el || el === document.body || el === document.documentElement) return null;
  const style = getComputedStyle(el);
  let name = el.getAttribute("aria-label") || "";
  const by = el.getAttribute("aria-labelledby");
  if (!name && by) {
    name = by.split(/\\s+/).map(i => (document.getElementById(i) || {}).textContent || "")
      .join(" ");
  }
  if (!name && el.labels && el.labels.length) {
    name = Array.from(el.labels).map(l => l.textContent).join(" ");
  }
  if (!name && !["INPUT", "SELECT", "TEXTAREA"].includes(el.tagName)) {
    name = el.innerText || el.textContent || "";
  }
  if (!name) name = el.getAttribute("title") || "";
  return {
    tag: el.tagName.toLowerCase(), id: el.id, name: name.trim().slice(0, 80),
    outline: style.outlineStyle, width: parseFloat(style.outlineWidth) || 0,
    shown: el.getClientRects().length > 0,
    html: el.outerHTML.slice(0, 160),
  };
}"""


def focused(page: Any) -> dict[str, Any]:
    """The focused element, checked: not <body>, named, on screen, its focus drawn."""
    info = page.evaluate(FOCUSED)
    assert info is not None, f"focus is lost to <body> on {page.url}"
    assert info["name"], f"a focused control has no name: {info['html']}"
    assert info["shown"], f"the focused element is not on screen: {info['html']}"
    assert info["outline"] not in ("none", "auto") and info["width"] >= 2, (
        f"no visible focus style of the console's own on {info['html']}: "
        f"outline {info['outline']} {info['width']}px"
    )
    return info


def is_focused(page: Any, selector: str) -> bool:
    return bool(page.evaluate("s => !!document.activeElement.matches(s)", selector))


def tab_to(
    page: Any, selector: str, *, back: bool | None = None, limit: int = 150
) -> dict[str, Any]:
    """Press Tab (Shift+Tab when ``back``; by default, whichever way the element is from the
    focus) until the element ``selector`` has focus, checking every stop."""
    if back is None:
        back = page.evaluate(
            """s => { const t = document.querySelector(s), a = document.activeElement;
               return !!t && !!a && a !== document.body
                 && !!(t.compareDocumentPosition(a) & Node.DOCUMENT_POSITION_FOLLOWING); }""",
            selector,
        )
    for _ in range(limit):
        page.keyboard.press("Shift+Tab" if back else "Tab")
        info = focused(page)
        if is_focused(page, selector):
            return info
    raise AssertionError(f"{selector} is not reachable by {'Shift+' if back else ''}Tab")


def focus_inside(page: Any, selector: str) -> dict[str, Any]:
    """The focus, after a swap or a reload: checked, and on or inside ``selector``."""
    page.wait_for_function(
        "s => document.activeElement && document.activeElement !== document.body"
        " && !!document.activeElement.closest(s)",
        arg=selector,
    )
    return focused(page)


def log_in(page: Any, url: str, name: str) -> None:
    page.goto(f"{url}/login/")
    # The user name field has the focus already (autofocus); the skip link is before it.
    assert focused(page)["id"] == "id_username"
    tab_to(page, "a.skip", back=True)
    tab_to(page, "#id_username")
    page.keyboard.type(name)
    tab_to(page, "#id_password")
    page.keyboard.type(PASSWORD)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{url}/")


@pytest.fixture
def keyboard_page(browser: Any, live_server: Any, make_user: Any) -> Any:
    make_user("admin", "kim")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    # A mouse would set the page's focus heuristics apart from a keyboard's: none is used.
    yield page
    close_context(context)


def test_log_in_skip_search_open_a_job_and_log_out(
    keyboard_page: Any, live_server: Any, make_batch: Any, make_job: Any
) -> None:
    page = keyboard_page
    batch = make_batch()
    first = make_job("Failed", batch=batch, profile="letters", message="HTTP 404")
    make_job("Pending", batch=batch, profile="letters")
    log_in(page, live_server.url, "kim")

    # The first Tab of a page is the skip link; Enter puts the focus on the page's content.
    page.keyboard.press("Tab")
    assert focused(page)["name"] == "Skip to content"
    page.keyboard.press("Enter")
    assert focus_inside(page, "#main")["id"] == "main"
    page.keyboard.press("Tab")
    assert page.evaluate("!!document.activeElement.closest('#main')")

    # "/" from anywhere but a field: the header's search; its results; a job opened from them.
    page.keyboard.press("/")
    assert focused(page)["id"] == "header-q"
    shot(page, "keyboard-search-focused")
    page.keyboard.type("letters")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*/search/\?q=letters$"))
    tab_to(page, f"#search-row-{first.jid} a[href$='/jobs/{first.jid}/']")
    page.keyboard.press("Enter")
    page.wait_for_url(f"{live_server.url}/jobs/{first.jid}/")

    # Log out: back up to the header's button.
    tab_to(page, "header .who button", back=True)
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*/login/"))
    assert page.locator("#id_username").count() == 1


def test_jobs_list_filter_row_action_bulk_action_and_open(
    keyboard_page: Any, live_server: Any, make_batch: Any, make_job: Any
) -> None:
    page = keyboard_page
    batch = make_batch()
    failed = [make_job("Failed", batch=batch, message=f"HTTP 404 {n}") for n in range(3)]
    long = make_job("Failed", batch=batch, message=LONG)
    make_job("Pending", batch=batch)
    log_in(page, live_server.url, "kim")
    page.goto(f"{live_server.url}/jobs/")

    # Filter by state: the select set by typing, the form sent from its button; the button
    # keeps the focus while the table alone is swapped.
    tab_to(page, "#id_state")
    page.keyboard.type("Failed")
    assert page.input_value("#id_state") == "Failed"
    tab_to(page, "form.filters button[type=submit]")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*state=Failed.*"))
    page.wait_for_function(
        "() => document.querySelectorAll('#job-table tr[data-state=Pending]').length === 0"
    )
    assert is_focused(page, "form.filters button[type=submit]")

    # A long message opens with Enter and closes with Escape, the focus back on its summary.
    summary = f"#job-row-{long.jid} details.msg > summary"
    tab_to(page, summary)
    page.keyboard.press("Enter")
    page.locator(f"#job-row-{long.jid} .msg-full").wait_for(state="visible")
    focused(page)
    page.keyboard.press("Escape")
    page.locator(f"#job-row-{long.jid} .msg-full").wait_for(state="hidden")
    assert is_focused(page, summary)
    focused(page)

    # A row's own action (htmx swaps the row): the focus stays in that row.
    tab_to(page, f"#job-row-{failed[0].jid} td.actions button")
    assert focused(page)["name"] == "Resume"
    page.keyboard.press("Enter")
    page.locator(f"#job-row-{failed[0].jid}:not([data-state=Failed])").wait_for()
    focus_inside(page, f"#job-row-{failed[0].jid}")
    shot(page, "keyboard-row-after-action")

    # A live refresh of the table while a row's button has the focus gives it back to the
    # same button (what live.js asks for when a watch fires).
    tab_to(page, f"#job-row-{failed[1].jid} td.actions button")
    page.evaluate(
        "() => { window.tableBefore = document.getElementById('job-table');"
        " htmx.trigger('#job-table', 'live-refresh'); }"
    )
    page.wait_for_function("() => document.getElementById('job-table') !== window.tableBefore")
    assert focus_inside(page, f"#job-row-{failed[1].jid} td.actions button")["name"] == "Resume"

    # Tick two rows with Space, go back to the bulk form, resume them (a few: done at once).
    for job in failed[1:]:
        tab_to(page, f"#job-row-{job.jid} input[type=checkbox]")
        page.keyboard.press("Space")
        assert page.is_checked(f"#job-row-{job.jid} input[type=checkbox]")
    tab_to(page, "#bulk-action", back=True)
    page.keyboard.type("resume")
    assert page.input_value("#bulk-action") == "resume"
    tab_to(page, "#bulk-form button[type=submit]")
    page.keyboard.press("Enter")
    page.wait_for_selector("#bulk-summary")
    assert "2 done, 0 skipped" in page.inner_text("#bulk-summary")

    # A job opened from the list.
    page.goto(f"{live_server.url}/jobs/?state=Failed")
    tab_to(page, f"#job-row-{long.jid} a[href$='/jobs/{long.jid}/']")
    page.keyboard.press("Enter")
    page.wait_for_url(f"{live_server.url}/jobs/{long.jid}/")


def test_failed_job_resume_then_delete_with_its_confirmation(
    keyboard_page: Any, live_server: Any, make_batch: Any, make_job: Any
) -> None:
    page = keyboard_page
    batch = make_batch()
    job = make_job("Failed", batch=batch, message="HTTP 404")
    doomed = make_job("Failed", batch=batch, message="HTTP 404")
    log_in(page, live_server.url, "kim")
    page.goto(f"{live_server.url}/jobs/{job.jid}/")

    # Resume (htmx swaps the job's body): the action's message is said by the live region and
    # the focus waits in the job's actions, not on <body>.
    tab_to(page, "#job-actions form:not(#job-resume-from) button")
    assert focused(page)["name"] == "Resume"
    page.keyboard.press("Enter")
    page.locator("#messages .message-success").wait_for()
    page.locator("#job-panel:not([data-state=Failed])").wait_for()
    # The group is named, so that a screen reader says where the focus is.
    assert focus_inside(page, "#job-actions")["name"] == "Actions on this job"
    shot(page, "keyboard-job-after-resume")
    # Tab goes on from there to what follows the actions.
    page.keyboard.press("Tab")
    focused(page)

    # Delete another: the link to its confirmation, the reason typed, the button pressed.
    page.goto(f"{live_server.url}/jobs/{doomed.jid}/")
    tab_to(page, "#job-actions a.danger[href*='/delete/']")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*/delete/.*"))
    tab_to(page, "#id_reason")
    page.keyboard.type("a test upload")
    tab_to(page, "#confirm-button")
    page.keyboard.press("Enter")
    page.locator("#messages .message-success").wait_for()
    assert doomed.jid in page.inner_text("#messages")


def test_batches_filter_release_a_batch_and_hold_its_collection(
    keyboard_page: Any, live_server: Any, zk: Any, make_batch: Any, make_job: Any
) -> None:
    """A batch has no hold of its own (Pending to Held is a hold's move: its collection's or
    the queue's); its Release is on its page, its collection's hold on the holds page."""
    page = keyboard_page
    batch = batches.batch_transition(zk, make_batch(profile="letters"), "Held")
    make_batch(profile="maps")
    log_in(page, live_server.url, "kim")
    page.goto(f"{live_server.url}/batches/")

    tab_to(page, "#id_profile")
    page.keyboard.type("letters")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*profile=letters.*"))
    page.wait_for_function(
        "() => !document.querySelector('#batch-table').innerText.includes('maps')"
    )
    assert is_focused(page, "#id_profile")
    tab_to(page, f"#batch-table a[href$='/batches/{batch.bid}/']")
    page.keyboard.press("Enter")
    page.wait_for_url(f"{live_server.url}/batches/{batch.bid}/")

    tab_to(page, "#batch-live .actions form[action$='/release/'] button")
    page.keyboard.press("Enter")
    page.locator("#messages .message-success").wait_for()
    assert batches.batch_load(zk, batch.bid).state == "Pending"

    # Its collection held from the holds page's form: Enter in the reason sends it, and the
    # focus stays on that field of the new panel.
    page.goto(f"{live_server.url}/holds/")
    tab_to(page, "#hold-profile")
    page.keyboard.type("letters")
    tab_to(page, "#hold-reason")
    page.keyboard.type("a bad payload server")
    page.keyboard.press("Enter")
    page.locator("#just-held").wait_for()
    assert focus_inside(page, "#holds-panel")["id"] == "hold-reason"


def test_holds_queue_and_node_with_their_forms(
    keyboard_page: Any, live_server: Any, zk: Any
) -> None:
    page = keyboard_page
    node_hold_set(zk, 9502, by="ops", reason="disk swap")
    log_in(page, live_server.url, "kim")
    page.goto(f"{live_server.url}/holds/")

    # Hold the ingest queue: its confirmation page, a reason, the button.
    tab_to(page, "#queue-ingest a.danger")
    page.keyboard.press("Enter")
    page.locator("#queue-hold-confirm").wait_for()
    tab_to(page, "#id_reason")
    page.keyboard.type("weekly redeploy")
    tab_to(page, "#confirm-button")
    page.keyboard.press("Enter")
    page.wait_for_url(f"{live_server.url}/holds/")
    assert "weekly redeploy" in page.inner_text("#queue-reason-ingest")

    # Release it (htmx swaps the whole panel): the focus stays in the queue's row.
    tab_to(page, "#queue-ingest button")
    page.keyboard.press("Enter")
    page.locator("#queue-ingest .badge:text('running')").wait_for()
    focus_inside(page, "#queue-ingest")

    # Hold a node from the form: Enter in its reason sends it; the focus comes back to the form.
    tab_to(page, "#node-number")
    page.keyboard.type("9501")
    tab_to(page, "#node-reason")
    page.keyboard.type("node 9501 down")
    page.keyboard.press("Enter")
    page.locator("#release-node-9501").wait_for()
    assert focus_inside(page, "#holds-panel")["id"] == "node-reason"

    # Release a node: its row is gone, so the focus goes to the table of held nodes.
    tab_to(page, "#release-node-9502", back=True)
    page.keyboard.press("Enter")
    page.locator("#node-9502").wait_for(state="detached")
    focus_inside(page, "#node-holds")
    shot(page, "keyboard-holds-after-node-release")


def test_failed_group_opened_then_a_bulk_delete_confirmed(
    keyboard_page: Any, live_server: Any, make_batch: Any, make_job: Any, monkeypatch: Any
) -> None:
    """/failed/: a group's jobs shown in place (htmx), the focus on that group; a row ticked
    and deleted through the bulk form and its confirmation page."""
    monkeypatch.setattr(failed_reads, "FAILED_ROWS_PER_PAGE", 2)
    batch = make_batch()
    doomed = make_job("Failed", batch=batch, message="HTTP 404")
    for _ in range(2):
        make_job("Failed", batch=batch, message="HTTP 404")
    page = keyboard_page
    log_in(page, live_server.url, "kim")
    page.goto(f"{live_server.url}/failed/?group=batch")

    group = f"#failed-group-{batch.bid}"
    tab_to(page, f"{group} h2 a[hx-get]")
    assert focused(page)["name"] == "show its jobs"
    page.keyboard.press("Enter")
    page.locator(f"{group} #job-row-{doomed.jid}").wait_for()
    focus_inside(page, group)

    tab_to(page, f"#job-row-{doomed.jid} input[type=checkbox]")
    page.keyboard.press("Space")
    tab_to(page, "#bulk-action", back=True)
    page.keyboard.type("delete")
    assert page.input_value("#bulk-action") == "delete"
    tab_to(page, "#bulk-reason")
    page.keyboard.type("a test upload")
    tab_to(page, "#bulk-apply")
    page.keyboard.press("Enter")
    page.locator("#bulk-confirm").wait_for()
    tab_to(page, "#confirm-button")
    page.keyboard.press("Enter")
    page.wait_for_selector("#bulk-summary")
    assert "1 done, 0 skipped" in page.inner_text("#bulk-summary")
