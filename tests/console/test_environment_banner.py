"""Every page names its environment (MRT_ENVIRONMENT): a band outside production."""

from __future__ import annotations

import pytest
from django.test import override_settings
from django.urls import reverse

from tests.browser import PHONE, SCREENSHOTS, logged_in

from .conftest import PASSWORD

pytestmark = pytest.mark.django_db

PAGES = ["overview", "batches", "jobs", "failed", "holds", "consumers", "audit", "tokens"]


@pytest.mark.parametrize("page", PAGES)
@override_settings(MRT_ENVIRONMENT="stage")
def test_a_stage_console_says_so_on_every_page(viewer, zk, page):
    html = viewer.get(reverse(page)).content.decode()
    band = (
        '<div class="env-band env-stage" id="environment" role="region" aria-label="Environment">'
        "STAGE · not production"
    )
    assert band in html
    assert "<title>[STAGE] " in html


@override_settings(MRT_ENVIRONMENT="dev-ada")
def test_an_unknown_name_is_shown_like_development(viewer, zk):
    html = viewer.get(reverse("overview")).content.decode()
    assert 'class="env-band env-development"' in html and "DEV-ADA · not production" in html


@override_settings(MRT_ENVIRONMENT="production")
def test_production_gets_a_quiet_label_and_no_band(viewer, zk):
    html = viewer.get(reverse("overview")).content.decode()
    assert "env-band" not in html and "[PRODUCTION]" not in html
    assert '<span class="env-label" id="environment">production</span>' in html


@override_settings(MRT_ENVIRONMENT="stage")
def test_the_login_page_names_the_environment_too(client):
    html = client.get(reverse("login")).content.decode()
    assert "STAGE · not production" in html


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_stage_band_is_on_screen_on_a_phone_in_either_colour_scheme(
    browser, live_server, make_user, settings, scheme
):
    settings.MRT_ENVIRONMENT = "stage"
    make_user("viewer", "eve")
    with logged_in(
        browser,
        live_server.url,
        "eve",
        PASSWORD,
        viewport=PHONE,
        color_scheme=scheme,
        is_mobile=True,
    ) as page:
        band = page.locator("#environment")
        box = band.bounding_box()
        assert box is not None and box["y"] < 5 and box["width"] >= 380
        colour = band.evaluate("e => getComputedStyle(e).backgroundColor")
        assert colour == "rgb(184, 92, 0)"  # the stage colour, whatever the scheme
        # It stays on screen when the page scrolls: an action far down is still "on stage".
        page.mouse.wheel(0, 3000)
        assert band.bounding_box()["y"] < 5
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"environment-stage-phone-{scheme}.png"))
