"""The operator's bad day in a real browser (Debian chromium via Playwright) against a
live server and a local feed server: a feed lists a popular host and starts blocking
short links; the admin's first page shows it, the refresh page names the links, the
host is allowlisted in one step and the links redirect again; a visitor's report
shows who listed the rule; a feed is tried with "test fetch" before subscribing; the
hit log lists each warning; and the add form proposes the spammer's own domain for a
www. URL. Screenshots go to tests/artifacts/."""

from __future__ import annotations

import pytest

from tests.browser.conftest import PASSWORD, login
from tests.support.feedserver import admit_loopback, feed_server
from urlguard.hotpath.guard import reset_guard
from urlguard.models import AllowedHost, MistakeReport, ShortLink, Source, SpamRule
from urlguard.nodesync import sync
from urlguard.runtime import stats

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def site(live_server, django_user_model, filter_path, settings):
    admit_loopback(settings)
    django_user_model.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    ShortLink.objects.create(slug="code", destination="https://popular-code.example/django")
    ShortLink.objects.create(slug="docs", destination="https://popular-code.example/docs")
    ShortLink.objects.create(slug="bad", destination="https://really-bad.example/x")
    sync.rebuild(str(filter_path))
    reset_guard()
    with feed_server() as feeds:
        feeds.serve("/hosts.txt", b"0.0.0.0 popular-code.example\n0.0.0.0 really-bad.example\n")
        yield live_server.url, feeds
    reset_guard()


def _status(page, url: str) -> int:
    return page.request.get(url, max_redirects=0).status


def _subscribe(page, base: str, url: str) -> None:
    page.goto(f"{base}/admin/urlguard/source/add/")
    page.fill("#id_name", "hosts")
    page.select_option("#id_kind", "feed")
    page.fill("#id_url", url)
    page.fill("#id_interval", "1 h")
    page.click("input[name=_continue]")
    page.wait_for_selector("#refresh-now")


def test_a_feed_that_blocks_a_popular_host_allowlisted_in_one_step(page, site, shot):
    base, feeds = site
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    login(page, base, landing="#operator-summary")
    _subscribe(page, base, feeds.url("/hosts.txt"))
    page.click("#refresh-now")
    page.wait_for_selector("#refresh-job .refresh-summary")
    impact = page.inner_text(".refresh-impact")
    assert "blocks 3 short links that were open: /code, /docs, /bad" in impact
    assert page.locator("text=The rescan of the short links that followed").count() == 1
    shot("bad-day-refresh-impact")
    assert _status(page, f"{base}/code") == 403

    page.goto(f"{base}/admin/")
    summary = page.inner_text("#operator-summary")
    assert "open mistake report" in summary and "warnings shown today" in summary
    shot("bad-day-index")

    page.goto(f"{base}/admin/urlguard/allowedhost/add/")
    page.fill("#id_host", "popular-code.example")
    page.fill("#id_note", "the hosts feed lists it by mistake")
    shot("bad-day-allowlist-add")
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist .success")
    message = page.inner_text(".messagelist")
    assert "Allowlisted popular-code.example." in message
    assert "1 feed listing withdrawn (hosts): popular-code.example/" in message
    assert "by hand" in page.inner_text("#result_list")
    shot("bad-day-allowlist-list")
    assert _status(page, f"{base}/code") == 302 and _status(page, f"{base}/docs") == 302
    assert _status(page, f"{base}/bad") == 403

    # The feed's next refresh, a 304 or not, keeps it out.
    page.goto(f"{base}/admin/urlguard/source/{Source.objects.get(name='hosts').pk}/change/")
    page.click("#refresh-now")
    page.wait_for_selector("#refresh-job .refresh-summary")
    assert not SpamRule.objects.filter(expression="popular-code.example/").exists()
    assert not errors, errors


def test_a_report_shows_who_listed_the_rule_and_offers_the_allowlist(page, site, shot):
    base, feeds = site
    login(page, base, landing="#operator-summary")
    _subscribe(page, base, feeds.url("/hosts.txt"))
    page.click("#refresh-now")
    page.wait_for_selector("#refresh-job .refresh-summary")
    page.goto(f"{base}/docs")
    page.click("text=Report a mistake")
    page.fill("#id_comment", "This is a code host.")
    page.click("button[type=submit]")
    page.wait_for_selector("#report-sent")
    page.goto(f"{base}/admin/")
    assert "1 open" in page.inner_text("#urlguard-entries")
    page.goto(f"{base}/admin/urlguard/mistakereport/?status__exact=open")
    row = page.locator("#result_list tbody tr").first
    assert "the feed hosts" in row.locator("td.field-listed_by").inner_text()
    shot("bad-day-report-queue")
    row.locator("a.report-remove").click()
    page.wait_for_selector("#relist-warning")
    assert "hosts still lists this rule" in page.inner_text("#relist-warning")
    assert "Would unblock 2 of the 2 short links" in page.inner_text(".impact-text")
    shot("bad-day-report-remove")
    page.click("#allowlist-instead")
    page.wait_for_selector(".messagelist .success")
    assert "Allowlisted popular-code.example" in page.inner_text(".messagelist")
    report = MistakeReport.objects.get()
    assert report.status == "allowlisted" and report.change_set is not None
    assert AllowedHost.objects.filter(host="popular-code.example").exists()
    assert _status(page, f"{base}/docs") == 302


def test_test_fetch_before_subscribing(page, site, shot):
    base, feeds = site
    feeds.serve("/mixed.txt", b"really-bad.example\nnot a host!\npopular-code.example/docs\n")
    login(page, base, landing="#operator-summary")
    page.goto(f"{base}/admin/urlguard/source/add/")
    page.fill("#id_name", "mixed")
    page.select_option("#id_kind", "feed")
    page.fill("#id_url", feeds.url("/mixed.txt"))
    page.fill("#id_interval", "15 min")
    shot("bad-day-subscribe-form")
    page.click("#test-fetch")
    page.wait_for_selector("#test-fetch-result", timeout=60_000)
    assert page.inner_text("#test-fetch-entries").startswith("2")
    assert page.inner_text("#test-fetch-refused") == "1"
    assert "Would block 2 short links" in page.inner_text(".impact-text")
    shot("bad-day-test-fetch")
    assert not Source.objects.filter(name="mixed").exists() and not SpamRule.objects.exists()
    page.click("#subscribe")
    assert page.input_value("#id_name") == "mixed" and page.input_value("#id_interval") == "15 min"
    page.click("input[name=_save]")
    page.wait_for_selector("#result_list")
    row = page.locator("#result_list tr", has_text="mixed")
    assert "every 15 min" in row.inner_text() and "mixed.txt" in row.inner_text()
    shot("bad-day-feeds-list")


def test_the_hit_log_lists_each_warning(page, site, shot):
    base, _ = site
    from urlguard.writepath import changes

    changes.add_rule("really-bad.example", category="phishing")
    login(page, base, landing="#operator-summary")
    page.goto(f"{base}/bad")
    stats.flush()
    page.goto(f"{base}/admin/urlguard/hitevent/")
    row = page.locator("#result_list tbody tr").first
    text = row.inner_text()
    assert "/bad" in text and "really-bad.example/" in text and "Phishing" in text
    shot("bad-day-hit-log")
    row.locator("td.field-from_where a").click()
    page.wait_for_selector("#result_list")
    assert "where=%2Fbad" in page.url or "where=/bad" in page.url


def test_a_www_url_proposes_the_spammers_own_domain(page, site, shot):
    base, _ = site
    login(page, base, landing="#operator-summary")
    page.goto(f"{base}/admin/urlguard/spamrule/add/")
    page.fill("#id_url", "https://www.mega-spam-deals.example/offers/today")
    page.wait_for_selector('input[name="expression"][value="mega-spam-deals.example/"]:checked')
    assert page.locator("fieldset.expression-group legend").inner_text() == "What to block:"
    shot("bad-day-www-default")


def test_a_long_expression_fits_a_phone(page, site, shot):
    base, _ = site
    from urlguard.writepath import changes

    rule = changes.add_rule(
        "paypal.com.login.secure-verify.account-update-center.example.com/signin/verify/"
        "index.php?session=abcdefabcdefabcdefabcdef",
        category="phishing",
    )
    login(page, base, landing="#operator-summary")
    page.set_viewport_size({"width": 390, "height": 844})
    for path in (f"/admin/urlguard/spamrule/{rule.pk}/change/", "/admin/urlguard/spamrule/"):
        page.goto(f"{base}{path}")
        wide = page.evaluate("() => document.documentElement.scrollWidth")
        shot("bad-day-390" + path.replace("/", "-").rstrip("-"))
        assert wide <= 390, f"{path} is {wide}px wide"
