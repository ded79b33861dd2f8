"""Issue 53, item 6, the smaller ones: the node-hold field suggests the nodes the console knows;
a batch or job with nothing to do says so in words that read, with what does fit; the inline
bulk result says its count once and links its items; the maintenance-window mark renders in
Chromium (U+23F2 was an empty box in Debian's fonts)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from console.conftest import PASSWORD
from queues.services import hold_moves
from queues.zk import batches
from tests.browser import logged_in

pytestmark = pytest.mark.django_db


def test_the_node_hold_field_offers_the_nodes_the_console_knows(zk: Any, operator: Any) -> None:
    hold_moves.node_hold(node="9777", reason="patch", by="olga")
    html = operator.get("/holds/").content.decode()
    assert 'list="known-nodes"' in html
    datalist = html[html.index('<datalist id="known-nodes">') :]
    datalist = datalist[: datalist.index("</datalist>")]
    options = dict(re.findall(r'<option value="(\d+)">([^<]*)</option>', datalist))
    # 9501 from the collection profiles (with the collections that name it); 9777 held.
    assert "merritt_demo_content" in options["9501"]
    assert options["9777"] == "held or in a window"


def test_a_batch_with_nothing_to_do_says_so_and_offers_its_jobs(
    zk: Any, make_batch: Any, viewer: Any
) -> None:
    batch = make_batch()
    for state in ("Processing", "Reporting", "Failed", "UpdateReporting"):
        batches.batch_transition(zk, batches.batch_load(zk, batch.bid), state, admin=True)
    html = viewer.get(f"/batches/{batch.bid}/").content.decode()
    words = html[html.index('id="no-actions"') :]
    words = words[: words.index("</span>")]
    assert "a UpdateReporting" not in html
    assert "No action applies to this batch while it is UpdateReporting (for your role)" in words
    assert "it moves on by itself once its report is written" in words
    assert f'href="/jobs/?bid={batch.bid}"' in words and f'href="/failed/?bid={batch.bid}"' in words


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_maintenance_window_mark_renders_in_chromium(
    browser: Any, live_server: Any, make_user: Any, zk: Any
) -> None:
    make_user("operator", "olga")
    until = datetime.now(UTC) + timedelta(hours=1)
    hold_moves.node_hold(node="9501", reason="patch", by="olga", until=until)
    with logged_in(browser, live_server.url, "olga", PASSWORD) as page:
        page.goto(f"{live_server.url}/holds/")
        mark = page.locator("[data-window] svg.glyph").first
        box = mark.bounding_box()
        assert box is not None and box["width"] >= 8 and box["height"] >= 8
        # Drawn, not empty: the stopwatch's strokes cover some of its box.
        drawn = page.evaluate(
            """() => {
                const svg = document.querySelector('[data-window] svg.glyph');
                const r = svg.getBoundingClientRect();
                const c = document.createElement('canvas');
                c.width = 32; c.height = 32;
                const img = new Image();
                const xml = new XMLSerializer().serializeToString(svg)
                    .replace('currentColor', '#000').replace('currentColor', '#000');
                return new Promise(done => {
                    img.onload = () => {
                        const g = c.getContext('2d');
                        g.drawImage(img, 0, 0, 32, 32);
                        const px = g.getImageData(0, 0, 32, 32).data;
                        let ink = 0;
                        for (let i = 3; i < px.length; i += 4) if (px[i] > 0) ink++;
                        done(ink);
                    };
                    img.src = 'data:image/svg+xml;charset=utf-8,' + encodeURIComponent(
                        xml.includes('xmlns') ? xml : xml.replace('<svg', '<svg xmlns="http://www.w3.org/2000/svg"'));
                });
            }"""
        )
        assert drawn > 40, drawn
        assert "⏲" not in page.inner_text("body")
