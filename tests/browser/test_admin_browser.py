"""The admin in a real browser (Debian chromium via Playwright) against a live server:
add a rule from a pasted URL with the live preview (a public suffix refused), see a
short link warned and then, after removing the rule, redirected, and both changes in
the audit trail; import a file with a refused line; open the
filter dashboard's chart. Screenshots of each page go to tests/artifacts/."""

from __future__ import annotations

import contextlib

import pytest
from playwright.sync_api import Error as PlaywrightError

from tests.browser.conftest import PASSWORD, login
from urlguard.hotpath.guard import reset_guard
from urlguard.models import ShortLink, SpamRule
from urlguard.nodesync import registry, sync
from urlguard.writepath import changes

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DESTINATION = "http://www.browser-spam.net/landing?utm=1"


@pytest.fixture
def site(live_server, django_user_model, filter_path):
    """A superuser, one short link, and an (empty) filter file the server's guard reads."""
    django_user_model.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    ShortLink.objects.create(slug="promo", destination=DESTINATION)
    sync.rebuild(str(filter_path))
    reset_guard()
    yield live_server.url
    reset_guard()


def _follow_short_link(page, base: str) -> None:
    page.goto(f"{base}/promo")


def _table_fits(page) -> None:
    """Every column of a change list is in sight (none scrolled out at 1280 px)."""
    hidden = page.evaluate(
        "() => { const r = document.querySelector('#changelist .results');"
        " return r.scrollWidth - r.clientWidth; }"
    )
    assert hidden <= 0, f"the change list is {hidden}px too wide"


def test_add_rule_block_remove_unblock(page, site, shot):
    login(page, site)
    # The tools sit in the main column with the URL guard entries (not floating beside
    # the "Recent actions" box), as wide as the app list.
    tools = page.locator("#content-main #urlguard-tools").bounding_box()
    apps = page.locator("#content-main #urlguard-entries").bounding_box()
    assert tools is not None and apps is not None and tools["width"] == apps["width"]
    shot("admin-index")

    page.goto(f"{site}/admin/urlguard/spamrule/add/")
    # A public suffix is refused, live, with the reason and what to do instead.
    page.fill("#id_url", "https://shop.co.uk.")
    page.fill("#id_url", "co.uk")
    page.wait_for_selector(".preview-error")
    assert "public suffix" in page.inner_text(".preview-error")
    assert page.locator('input[name="expression"]').count() == 0
    shot("add-rule-refused")
    # Logged out meanwhile (another tab, an expired session): the preview says so and
    # what to do, instead of going quiet.
    cookies = page.context.cookies()
    page.context.clear_cookies()
    page.fill("#id_url", "expired.example.org")
    page.wait_for_selector(".preview-error >> text=live preview is unavailable")
    page.context.add_cookies(cookies)
    page.fill("#id_url", DESTINATION)
    # The live preview (fetch) fills in the levels and the sample URLs.
    page.wait_for_selector('input[name="expression"][value="browser-spam.net/"]')
    page.check('input[name="expression"][value="browser-spam.net/"]')
    page.wait_for_function(
        "document.querySelector('.preview-expression') && "
        "document.querySelector('.preview-expression').textContent === "
        "'browser-spam.net/'"
    )
    blocked = page.locator(".preview-blocked li").all_inner_texts()
    allowed = page.locator(".preview-allowed li").all_inner_texts()
    assert DESTINATION in blocked
    assert "http://browser-spam.net.example.net/" in allowed
    shot("add-rule-preview")
    page.click('input[name="_save"]')
    page.wait_for_selector(".messagelist .success")
    assert "browser-spam.net/" in page.inner_text(".messagelist")
    _table_fits(page)
    shot("rule-changelist")
    assert SpamRule.objects.filter(expression="browser-spam.net/").exists()

    _follow_short_link(page, site)
    assert page.inner_text("#warning-title") == "This link leads to a site on our block list"
    assert "browser-spam.net" in page.content()
    shot("short-link-warning")

    page.goto(f"{site}/admin/urlguard/spamrule/")
    page.check('input[name="_selected_action"]')
    page.select_option('select[name="action"]', "delete_selected_rules")
    page.click('button[name="index"]')
    page.click('input[type="submit"][value^="Yes, delete"]')
    page.wait_for_selector(".delete-done")
    assert not SpamRule.objects.exists()

    # The audit trail: the addition and the removal, both by the one who made them.
    page.goto(f"{site}/admin/urlguard/changeevent/")
    rows = page.locator("#result_list tbody tr").all_inner_texts()
    assert len(rows) == 2
    assert all("browser-spam.net/" in row and "boss" in row for row in rows)
    assert {"add", "remove"} <= {word for row in rows for word in row.lower().split()}
    # Every column fits: "applied on" (which nodes have it) is not scrolled out of sight.
    _table_fits(page)
    assert "vm" in page.inner_text("#result_list td.field-applied_on")
    shot("change-log")

    # Redirected now. The destination does not exist (no internet, and Playwright's
    # routing does not see redirect targets): the browser's request for it is the proof.
    with page.expect_request(DESTINATION) as landed, contextlib.suppress(PlaywrightError):
        _follow_short_link(page, site)
    assert landed.value.redirected_from is not None
    assert landed.value.redirected_from.url == f"{site}/promo"


def test_import_with_a_refused_line(page, site, shot, tmp_path):
    feed = tmp_path / "feed.txt"
    feed.write_text("# feed\nimport-one.example.com\n0.0.0.0 import-two.example.net\nco.uk\n")
    login(page, site)
    page.goto(f"{site}/admin/urlguard/spamrule/import/")
    shot("import-upload")
    page.set_input_files("#id_file", str(feed))
    page.click('input[type="submit"]')
    page.wait_for_selector("#refused-lines")
    assert page.inner_text(".count-new") == "2"
    assert page.inner_text(".count-refused") == "1"
    reason = page.inner_text("#refused-lines td.reason")
    assert "public suffix" in reason
    shot("import-preview")
    assert not SpamRule.objects.exists()
    page.click('input[type="submit"][value^="Commit"]')
    page.wait_for_selector(".import-done")
    assert "Added 2 rules" in page.inner_text(".import-done")
    page.wait_for_selector("#rescan-result")
    assert "Scanned 1 link in" in page.inner_text("#rescan-result")
    shot("import-done")
    assert SpamRule.objects.count() == 2


@pytest.fixture
def small_filter(settings, filter_path):
    """Stages of 1,000 rules, so a few thousand rules make a chart of several bars."""
    settings.URLGUARD = {**settings.URLGUARD, "FILTER_CAPACITY": 1000}


def test_dashboard_chart_check_and_rescan_pages(page, small_filter, site, shot):
    changes.add_rules([f"bulk{i}.example.com" for i in range(2500)], source="test")
    login(page, site)
    page.goto(f"{site}/admin/urlguard/spamrule/add/")
    page.fill("#id_url", "dash-spam.org")
    page.wait_for_selector('input[name="expression"]:checked')
    page.click('input[name="_save"]')
    page.wait_for_selector(".messagelist .success")

    page.goto(f"{site}/admin/urlguard/spamrule/dashboard/")
    stages = registry.get_filter().info()["stages"]
    assert page.locator("svg.stage-chart rect.bar").count() == len(stages) >= 2
    assert page.locator("#stages tbody tr").count() == len(stages)
    shot("dashboard")
    page.click('input[name="rebuild"]')
    page.wait_for_selector(".messagelist .success")
    assert "Rebuild finished" in page.inner_text(".messagelist")
    shot("dashboard-after-rebuild")

    page.goto(f"{site}/admin/urlguard/spamrule/check/")
    page.fill("#id_url", "HTTPS://Sub.Dash-Spam.org/a/../b?x=1")
    page.click('input[type="submit"][value="Check"]')
    page.wait_for_selector("#verdict")
    assert "Verdict: blocked" in page.inner_text("#verdict")
    assert page.inner_text("#canonical") == "https://sub.dash-spam.org/b?x=1"
    shot("check-url")

    ShortLink.objects.create(slug="dash", destination="https://www.dash-spam.org/promo?id=1")
    page.goto(f"{site}/admin/urlguard/shortlink/rescan/")
    page.click('input[type="submit"][value="Rescan all short links now"]')
    page.wait_for_selector(".rescan-summary")
    assert "1 link points to spam" in page.inner_text(".rescan-summary")
    assert page.locator("#rescan-hits tbody tr").count() == 1
    shot("rescan")
    page.click('input[type="submit"][value="Disable selected links"]')
    page.wait_for_selector(".messagelist .success")
    assert "Disabled 1 short link" in page.inner_text(".messagelist")
    assert ShortLink.objects.get(slug="dash").disabled
    page.goto(f"{site}/admin/urlguard/shortlink/")
    shot("short-links")
    _table_fits(page)
    # The link just disabled says so, in sight.
    assert page.locator("#result_list td.field-disabled img[alt='True']").count() == 1
