"""Every admin page an operator works in, scanned by axe-core (axe-playwright-python,
which ships the engine) in Debian's chromium: no accessibility violation, in light and
dark mode (WCAG 2 A/AA rules, the ones axe reports by default)."""

from __future__ import annotations

import pytest

from tests.browser.conftest import PASSWORD
from tests.support.feedserver import admit_loopback, feed_server
from urlguard.hotpath.guard import reset_guard
from urlguard.models import AllowedHost, MistakeReport, ShortLink, Source, SpamRule
from urlguard.nodesync import sync
from urlguard.runtime import stats
from urlguard.writepath import changes

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def world(live_server, django_user_model, filter_path, settings):
    admit_loopback(settings)
    django_user_model.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    ShortLink.objects.create(slug="code", destination="https://popular-code.example/django")
    with feed_server() as feeds:
        feeds.serve("/hosts.txt", b"0.0.0.0 popular-code.example\n0.0.0.0 bad.example\n")
        feed = Source.objects.create(name="hosts", kind="feed", url=feeds.url("/hosts.txt"))
        from urlguard.feeds.refresh import refresh_source

        refresh_source(feed)
        sync.rebuild(str(filter_path))
        reset_guard()
        rule = SpamRule.objects.get(expression="popular-code.example/")
        report = MistakeReport.objects.create(
            destination="https://popular-code.example/django", expression=rule.expression, rule=rule
        )
        changes.add_rule("hand.example/path/", category="phishing")
        AllowedHost.objects.create(host="partner.example", note="ours")
        yield live_server.url, feed, rule, report
    reset_guard()


def _pages(feed, rule, report) -> list[str]:
    return [
        "/admin/",
        "/admin/urlguard/spamrule/",
        "/admin/urlguard/spamrule/add/",
        f"/admin/urlguard/spamrule/{rule.pk}/change/",
        "/admin/urlguard/spamrule/check/?url=https://popular-code.example/x",
        "/admin/urlguard/spamrule/dashboard/",
        "/admin/urlguard/source/?kind__exact=feed",
        "/admin/urlguard/source/add/",
        f"/admin/urlguard/source/{feed.pk}/change/",
        "/admin/urlguard/allowedhost/",
        "/admin/urlguard/allowedhost/add/",
        "/admin/urlguard/mistakereport/?status__exact=open",
        f"/admin/urlguard/mistakereport/{report.pk}/remove/",
        "/admin/urlguard/changeset/",
        "/admin/urlguard/hitevent/",
        "/admin/urlguard/shortlink/",
    ]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_admin_pages_have_no_axe_violations(page, world, scheme, shot):
    from axe_playwright_python.sync_playwright import Axe

    base, feed, rule, report = world
    page.emulate_media(color_scheme=scheme)
    page.goto(f"{base}/admin/login/")
    page.fill("#id_username", "boss")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#operator-summary")
    page.goto(f"{base}/code")  # one warning for the hit log
    stats.flush()
    axe = Axe()
    found: list[str] = []
    for path in _pages(feed, rule, report):
        page.goto(f"{base}{path}")
        for violation in axe.run(page).response["violations"]:
            for node in violation["nodes"][:3]:
                summary = " ".join(node.get("failureSummary", "").split())[:240]
                found.append(f"{path} {violation['id']} {node['target']}: {summary}")
    # Two job pages: a refresh, and a test fetch from the subscribe form.
    page.goto(f"{base}/admin/urlguard/source/{feed.pk}/change/")
    page.click("#refresh-now")
    page.wait_for_selector("#refresh-job .refresh-summary")
    job_pages = [page.url]
    page.goto(f"{base}/admin/urlguard/source/add/")
    page.fill("#id_name", "trial")
    page.select_option("#id_kind", "feed")
    page.fill("#id_url", feed.url)
    page.click("#test-fetch")
    page.wait_for_selector("#test-fetch-result", timeout=60_000)
    job_pages.append(page.url)
    for url in job_pages:
        page.goto(url)
        for violation in axe.run(page).response["violations"]:
            found.append(f"{url} {violation['id']}")
    assert not found, "\n".join(found)
