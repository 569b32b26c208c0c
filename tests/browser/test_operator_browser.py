"""The operator's side in a real browser: the confirmation a popular or own host needs,
the impact numbers in the add and import previews against seeded short links, the
layout at 1280 px (columns in sight, verdict whole, the product's title and icon,
formatted times), and host names on the warning page that wrap only between labels.
Screenshots go to tests/artifacts/."""

from __future__ import annotations

import pytest

from urlguard import changes, sync
from urlguard.guard import reset_guard
from urlguard.models import NodeStatus, ShortLink, SpamRule

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"
LONG_SOURCE = "import:phishing-feed-2026-11-23-openphish-community-edition.txt"


@pytest.fixture
def site(live_server, django_user_model, filter_path):
    django_user_model.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    for i in range(6):
        ShortLink.objects.create(
            slug=f"form{i}", destination=f"https://docs.google.com/forms/d/{i}/viewform"
        )
    for i in range(3):
        ShortLink.objects.create(
            slug=f"shop{i}",
            destination=f"https://www.cheap-pills-online-pharmacy.example/offer/{i}?utm_campaign=black-friday-{i}",
        )
    sync.rebuild(str(filter_path))
    reset_guard()
    yield live_server.url
    reset_guard()


def _login(page, base: str) -> None:
    page.goto(f"{base}/admin/login/")
    page.fill("#id_username", "boss")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#urlguard-tools")


def _table_fits(page) -> None:
    hidden = page.evaluate(
        "() => { const r = document.querySelector('#changelist .results');"
        " return r.scrollWidth - r.clientWidth; }"
    )
    assert hidden <= 0, f"the change list is {hidden}px too wide"


def test_a_popular_host_needs_a_confirmation_and_the_preview_shows_the_impact(page, site, shot):
    _login(page, site)
    page.goto(f"{site}/admin/urlguard/spamrule/add/")
    page.fill("#id_url", "https://docs.google.com/forms/d/3/viewform")
    # Proposed: the one form, not google.com; its impact is one link.
    page.wait_for_selector(
        'input[name="expression"][value="docs.google.com/forms/d/3/viewform"]:checked'
    )
    page.wait_for_selector(".impact-text")
    assert (
        page.inner_text(".impact-text")
        == "Would block 1 short link (0 clicks in the last 30 days)."
    )
    assert page.locator("#confirm-row").is_hidden()
    shot("operator-add-narrow")
    page.check('input[name="expression"][value="google.com/"]')
    page.wait_for_function(
        "document.querySelector('.impact-text') && "
        "document.querySelector('.impact-text').textContent.startsWith('Would block 6 short links')"
    )
    assert page.locator("#confirm-row").is_visible()
    assert "popular site" in page.inner_text("#confirm-reasons")
    shot("operator-add-popular")
    page.click('input[name="_save"]')
    page.wait_for_selector("#confirm-row .errorlist")
    assert not SpamRule.objects.exists()
    shot("operator-add-popular-refused")
    page.check("#id_confirm")
    page.click('input[name="_save"]')
    page.wait_for_selector(".messagelist .success")
    assert SpamRule.objects.filter(expression="google.com/").exists()


def test_own_host_needs_a_confirmation(page, site, shot, settings):
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "go.short.example"]
    _login(page, site)
    page.goto(f"{site}/admin/urlguard/spamrule/add/")
    page.fill("#id_url", "https://go.short.example/abc")
    page.wait_for_selector('input[name="expression"][value="go.short.example/"]:checked')
    page.wait_for_selector("#confirm-reasons li[data-code=own-host]")
    assert "this service's own host" in page.inner_text("#confirm-reasons")
    shot("operator-add-own-host")
    page.click('input[name="_save"]')
    page.wait_for_selector("#confirm-row .errorlist")
    assert not SpamRule.objects.exists()


def test_import_preview_shows_the_impact(page, site, shot, tmp_path):
    changes.add_rule("www.cheap-pills-online-pharmacy.example/offer/", category="spam")
    feed = tmp_path / "feed.txt"
    feed.write_text(
        "cheap-pills-online-pharmacy.example\nforms-spam.example.org\nbad_host!.example\n"
    )
    _login(page, site)
    page.goto(f"{site}/admin/urlguard/spamrule/import/")
    page.set_input_files("#id_file", str(feed))
    page.click('input[type="submit"]')
    page.wait_for_selector(".impact-text")
    assert page.inner_text(".impact-text") == (
        "Would block 3 short links (0 clicks in the last 30 days); "
        "3 of them already blocked by another rule."
    )
    assert page.locator(".impact-other").count() == 3
    assert page.locator("#download-refused").is_visible()
    shot("operator-import-impact")


def test_layout_at_1280(page, site, shot):
    changes.add_rules(
        [
            f"paypal.com.login.secure-verify{i}.account-update-center.example{i}.com/signin/verify/index.php?session=abcdef{i}"
            for i in range(30)
        ],
        source=LONG_SOURCE,
        category="phishing",
    )
    changes.add_rule("cheap-pills-online-pharmacy.example/", category="spam")
    NodeStatus.objects.create(
        node="node-a", filter_path="/x", applied_seq=1, last_rebuild_seconds=0.009877661000246007
    )
    _login(page, site)
    assert "URL guard" in page.title() and "Django" not in page.content()
    icon = page.get_attribute('link[rel="icon"]', "href")
    assert icon and page.request.get(f"{site}{icon}").status == 200
    assert page.request.get(f"{site}/favicon.ico").status == 200
    for path, name in [
        ("/admin/urlguard/spamrule/", "operator-rules-1280"),
        ("/admin/urlguard/shortlink/", "operator-links-1280"),
        ("/admin/urlguard/changeevent/", "operator-changelog-1280"),
    ]:
        page.goto(f"{site}{path}")
        _table_fits(page)
        shot(name)
    # The verdict is whole: the rule's expression, not cut mid-word.
    page.goto(f"{site}/admin/urlguard/shortlink/?q=shop0")
    verdict = page.inner_text("td.field-verdict")
    assert "blocked (Spam)" in verdict and "cheap-pills-online-pharmacy.example/" in verdict
    page.goto(f"{site}/admin/urlguard/nodestatus/")
    assert page.inner_text("td.field-rebuild_took") == "9.9 ms"
    rule = SpamRule.objects.get(expression="cheap-pills-online-pharmacy.example/")
    page.goto(f"{site}/admin/urlguard/spamrule/{rule.pk}/change/")
    added = page.inner_text(".field-added_at_text .readonly")
    assert added.startswith(f"{rule.created:%Y-%m-%d}") and "UTC" in added
    shot("operator-rule-change")


def test_warning_page_host_wraps_only_between_labels(page, site, shot):
    changes.add_rule("cheap-pills-online-pharmacy.example/", category="spam")
    page.set_viewport_size({"width": 320, "height": 800})
    page.goto(f"{site}/shop1")
    host = page.locator(".lead .host").first
    assert host.inner_text() == "www.cheap-pills-online-pharmacy.example"
    # Each label stays on one line (one line box per label).
    heights = page.evaluate(
        "() => [...document.querySelectorAll('.lead .host .label')].map("
        "s => s.getClientRects().length)"
    )
    assert heights and all(n == 1 for n in heights)
    shot("operator-warning-narrow")
