"""The sources admin in a real browser (Debian chromium via Playwright) against a live
server and a local feed server: subscribe to a feed from the add form, refresh it
now and watch the job page, see its health in the list and on the dashboard, a
90% shrink held and then accepted, and a rule's sources on its page. Screenshots go
to tests/artifacts/."""

from __future__ import annotations

import pytest

from tests.browser.conftest import PASSWORD, login
from tests.support.feedserver import admit_loopback, feed_server
from urlguard.models import Source, SpamRule

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

HOSTS = [f"h{i}.feed-browser.example" for i in range(10)]


@pytest.fixture
def site(live_server, django_user_model, nudges, settings):
    admit_loopback(settings)
    django_user_model.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    with feed_server() as feeds:
        feeds.serve("/list.txt", "".join(f"{h}\n" for h in HOSTS).encode())
        yield live_server.url, feeds


def _table_fits(page) -> None:
    hidden = page.evaluate(
        "() => { const r = document.querySelector('#changelist .results');"
        " return r.scrollWidth - r.clientWidth; }"
    )
    assert hidden <= 0, f"the change list is {hidden}px too wide"


def test_subscribe_refresh_hold_and_accept(page, site, shot):
    base, feeds = site
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    login(page, base, landing=None)

    page.goto(f"{base}/admin/urlguard/source/add/")
    page.fill("#id_name", "browser-feed")
    page.select_option("#id_kind", "feed")
    page.fill("#id_url", feeds.url("/list.txt"))
    page.select_option("#id_format", "urls")
    page.select_option("#id_category", "malware")
    page.fill("#id_interval", "600")
    shot("feeds-add")
    page.click("input[name=_continue]")
    page.wait_for_selector("#refresh-now")

    page.click("#refresh-now")
    page.wait_for_selector("#refresh-job .refresh-summary")
    assert "browser-feed: ok: 10 entries" in page.inner_text("#refresh-job")
    shot("feeds-refresh-job")
    assert SpamRule.objects.count() == 10

    page.goto(f"{base}/admin/urlguard/source/")
    row = page.locator("#result_list tr", has_text="browser-feed")
    assert "OK" in row.locator(".feed-health").inner_text()
    _table_fits(page)
    shot("feeds-list")

    feeds.serve("/list.txt", f"{HOSTS[0]}\n".encode())
    page.goto(f"{base}/admin/urlguard/source/{Source.objects.get(name='browser-feed').pk}/change/")
    page.click("#refresh-now")
    page.wait_for_selector("#refresh-job .errornote")
    assert "Nothing was applied" in page.inner_text("#refresh-job")
    shot("feeds-held")
    assert SpamRule.objects.count() == 10
    page.goto(f"{base}/admin/urlguard/source/")
    assert "would remove 9" in page.inner_text("#result_list")

    page.goto(f"{base}/admin/urlguard/source/{Source.objects.get(name='browser-feed').pk}/change/")
    page.click("#accept-shrink")
    page.wait_for_selector("#refresh-job .refresh-summary")
    assert SpamRule.objects.count() == 1

    rule = SpamRule.objects.get()
    page.goto(f"{base}/admin/urlguard/spamrule/{rule.pk}/change/")
    assert "browser-feed" in page.inner_text(".field-listed_by")
    shot("feeds-rule-sources")

    page.goto(f"{base}/admin/urlguard/spamrule/dashboard/")
    assert "browser-feed" in page.inner_text("#feeds")
    shot("feeds-dashboard")
    assert not errors, errors
