"""The sources admin (health, add/edit, refresh now with its job page, accepting a
held shrink, history, allowlisted hosts), a rule's sources on its page and as a list
filter, the dashboard's feed panel, and the allowlist warning on a rule added by hand."""

from __future__ import annotations

import re
import threading
from html import unescape

import pytest
from django.urls import reverse

from tests.support.feedserver import admit_loopback, feed_server
from urlguard.models import AdminJob, AllowedHost, Source, SpamRule
from urlguard.writepath import changes

pytestmark = pytest.mark.django_db

SOURCE_EDITOR = ("view_source", "change_source", "add_source", "view_spamrule")


@pytest.fixture(autouse=True)
def _quiet(quiet):
    pass


@pytest.fixture
def server(settings):
    admit_loopback(settings)
    with feed_server() as feeds:
        yield feeds


@pytest.fixture
def feed(server):
    url = server.serve("/l", b"a.example\nb.example\nc.example\n")
    return Source.objects.create(name="feed-a", kind="feed", url=url)


def refresh(client, source, committed, **data):
    with committed():
        response = client.post(reverse("admin:urlguard_source_refresh", args=[source.pk]), data)
    assert response.status_code == 302, response.content[:300]
    return client.get(response["Location"])


def test_sources_list_shows_health_and_counts(make_staff, feed, committed):
    client = make_staff(*SOURCE_EDITOR)
    html = client.get(reverse("admin:urlguard_source_changelist")).content.decode()
    assert "feed-a" in html and "never refreshed" in html and "feed-never" in html
    refresh(client, feed, committed)
    html = client.get(reverse("admin:urlguard_source_changelist")).content.decode()
    assert "feed-ok" in html and "?listed_by=" in html
    assert ">3<" in html  # rules listed


def test_refresh_now_runs_a_job_with_its_page(make_staff, feed, committed):
    client = make_staff(*SOURCE_EDITOR)
    page = refresh(client, feed, committed)
    html = page.content.decode()
    assert page.status_code == 200 and "feed-a: ok: 3 entries" in html
    job = AdminJob.objects.get(kind="refresh")
    assert job.state == "done" and job.params["name"] == "feed-a"
    assert SpamRule.objects.count() == 3
    status = client.get(reverse("admin:urlguard_source_refresh_status", args=[job.pk])).json()
    assert status["finished"] and status["state"] == "done"
    # The source page: history and the refresh button.
    html = client.get(reverse("admin:urlguard_source_change", args=[feed.pk])).content.decode()
    assert 'id="refresh-now"' in html and "feed-history" in html and "3 added, none removed" in html


@pytest.mark.django_db(transaction=True)
def test_refresh_now_returns_at_once_and_the_runner_refreshes(make_staff, feed, monkeypatch):
    """The embedded default (Celery eager, no broker): the request only queues the
    job; the runner thread does the refresh (a first load outlasts any request)."""
    from urlguard.feeds import tasks
    from urlguard.jobs import dispatch

    monkeypatch.setattr("urlguard.celery.in_process", lambda: True)
    monkeypatch.setattr(dispatch, "_memory_database", lambda: False)
    runner = dispatch._Runner()
    monkeypatch.setattr(dispatch, "runner", runner)
    ran_on = []

    def refresh_source(*args, **kwargs):
        ran_on.append(threading.current_thread().name)
        return real(*args, **kwargs)

    real = tasks.refresh_source
    monkeypatch.setattr(tasks, "refresh_source", refresh_source)
    client = make_staff(*SOURCE_EDITOR)
    response = client.post(reverse("admin:urlguard_source_refresh", args=[feed.pk]))
    assert threading.current_thread().name not in ran_on
    job = AdminJob.objects.get(kind="refresh")
    assert response.status_code == 302
    assert response["Location"] == reverse(
        "admin:urlguard_source_refresh_job", args=[feed.pk, job.pk]
    )
    runner.join()
    assert ran_on == ["urlguard-admin-jobs"]
    job.refresh_from_db()
    assert job.state == "done" and job.message.startswith("feed-a: ok: 3 entries"), job.message
    assert job.owner and job.result["added"] == 3 and SpamRule.objects.count() == 3
    html = client.get(response["Location"]).content.decode()
    assert "feed-a: ok: 3 entries" in html


def test_a_held_shrink_is_shown_and_accepted(make_staff, server, committed):
    hosts = "".join(f"h{i}.example\n" for i in range(10)).encode()
    feed = Source.objects.create(name="f", kind="feed", url=server.serve("/l", hosts))
    client = make_staff(*SOURCE_EDITOR)
    refresh(client, feed, committed)
    server.serve("/l", b"h0.example\n")
    html = refresh(client, feed, committed).content.decode()
    assert "Nothing was applied" in html and "Accept the shrink" in html
    assert SpamRule.objects.count() == 10
    listing = client.get(reverse("admin:urlguard_source_changelist")).content.decode()
    assert "would remove 9" in listing and "feed-held" in listing
    page = client.get(reverse("admin:urlguard_source_change", args=[feed.pk])).content.decode()
    assert 'id="accept-shrink"' in page
    refresh(client, feed, committed, accept_shrink="1")
    assert SpamRule.objects.count() == 1


def test_accept_held_shrink_action(make_staff, server, committed):
    hosts = "".join(f"h{i}.example\n" for i in range(10)).encode()
    feed = Source.objects.create(name="f", kind="feed", url=server.serve("/l", hosts))
    client = make_staff(*SOURCE_EDITOR)
    refresh(client, feed, committed)
    server.serve("/l", b"h0.example\n")
    refresh(client, feed, committed)
    with committed():
        response = client.post(
            reverse("admin:urlguard_source_changelist"),
            {"action": "accept_held_shrink", "_selected_action": [feed.pk]},
        )
    assert response.status_code == 302
    assert SpamRule.objects.count() == 1


def test_an_impact_hold_is_accepted_for_its_impact_only(make_staff, server, committed, settings):
    """The buttons send the flag of what the refresh was held for; a fetch that is
    both a shrink and over CONFIRM_IMPACT_LINKS is accepted one hold at a time."""
    from urlguard.models import ShortLink

    settings.URLGUARD = {**settings.URLGUARD, "CONFIRM_IMPACT_LINKS": 1}
    for i in range(2):
        ShortLink.objects.create(slug=f"s{i}", destination=f"https://x{i}.example/")
    hosts = "".join(f"h{i}.example\n" for i in range(10)).encode()
    feed = Source.objects.create(name="f", kind="feed", url=server.serve("/l", hosts))
    client = make_staff(*SOURCE_EDITOR)
    refresh(client, feed, committed)
    server.serve("/l", b"x0.example\nx1.example\n")
    html = refresh(client, feed, committed).content.decode()
    assert "Accept the shrink" in html and 'name="accept_impact"' not in html
    html = refresh(client, feed, committed, accept_shrink="1").content.decode()
    assert "CONFIRM_IMPACT_LINKS" in html and 'id="accept-impact"' in html
    assert 'name="accept_impact"' in html and 'name="accept_shrink"' in html  # carried
    assert SpamRule.objects.count() == 10
    page = client.get(reverse("admin:urlguard_source_change", args=[feed.pk])).content.decode()
    assert 'id="accept-impact"' in page and 'id="accept-shrink"' not in page
    # The impact alone, from the feed's page: still held for the shrink.
    html = refresh(client, feed, committed, accept_impact="1").content.decode()
    assert "FEED_SHRINK_THRESHOLD" in html and SpamRule.objects.count() == 10
    assert (
        AdminJob.objects.filter(kind="refresh").order_by("-pk")[0].params["accept_impact"] is True
    )
    refresh(client, feed, committed, accept_shrink="1", accept_impact="1")
    assert SpamRule.objects.count() == 2


def test_accept_held_action_accepts_an_impact_hold(make_staff, server, committed, settings):
    from urlguard.models import ShortLink

    settings.URLGUARD = {**settings.URLGUARD, "CONFIRM_IMPACT_LINKS": 1}
    for i in range(2):
        ShortLink.objects.create(slug=f"s{i}", destination=f"https://x{i}.example/")
    feed = Source.objects.create(
        name="f", kind="feed", url=server.serve("/l", b"x0.example\nx1.example\n")
    )
    client = make_staff(*SOURCE_EDITOR)
    refresh(client, feed, committed)
    assert not SpamRule.objects.exists()
    with committed():
        response = client.post(
            reverse("admin:urlguard_source_changelist"),
            {"action": "accept_held_shrink", "_selected_action": [feed.pk]},
        )
    assert response.status_code == 302
    job = AdminJob.objects.filter(kind="refresh").order_by("-pk")[0]
    assert job.params["accept_impact"] is True and job.params["accept_shrink"] is False
    assert SpamRule.objects.count() == 2


def test_view_only_staff_cannot_refresh(make_staff, feed):
    client = make_staff("view_source")
    response = client.post(reverse("admin:urlguard_source_refresh", args=[feed.pk]))
    assert response.status_code == 403 and not AdminJob.objects.exists()
    html = client.get(reverse("admin:urlguard_source_change", args=[feed.pk])).content.decode()
    assert 'id="refresh-now"' not in html


def test_add_feed_form_validates(make_staff):
    client = make_staff(*SOURCE_EDITOR)
    url = reverse("admin:urlguard_source_add")
    data = {"name": "x", "kind": "feed", "url": "", "format": "auto", "category": "spam"}
    data.update(interval=3600, enabled="on")
    html = client.post(url, data).content.decode()
    assert "A feed needs an http://" in html and not Source.objects.filter(name="x").exists()
    data["url"] = "https://lists.example.org/feed.txt"
    assert client.post(url, data).status_code == 302
    assert Source.objects.get(name="x").url == "https://lists.example.org/feed.txt"


def test_disable_action_keeps_rules(make_staff, feed, committed):
    client = make_staff(*SOURCE_EDITOR)
    refresh(client, feed, committed)
    client.post(
        reverse("admin:urlguard_source_changelist"),
        {"action": "disable", "_selected_action": [feed.pk]},
    )
    feed.refresh_from_db()
    assert not feed.enabled and SpamRule.objects.count() == 3


def test_a_manual_source_cannot_be_an_allowlist(make_staff):
    client = make_staff(*SOURCE_EDITOR)
    data = {
        "name": "allowlist",
        "kind": "manual",
        "url": "",
        "format": "auto",
        "category": "spam",
        "interval": 3600,
        "enabled": "on",
        "is_allowlist": "on",
    }
    html = client.post(reverse("admin:urlguard_source_add"), data).content.decode()
    assert "go on the Allowlist" in html
    assert not Source.objects.filter(name="allowlist").exists()


def test_an_allowlist_feed_shows_its_hosts_read_only(make_staff):
    allow = Source.objects.create(
        name="top", kind="feed", url="https://lists.example/top.txt", is_allowlist=True
    )
    AllowedHost.objects.create(source=allow, host="www.example.com")
    client = make_staff(*SOURCE_EDITOR, "view_allowedhost")
    html = client.get(reverse("admin:urlguard_source_change", args=[allow.pk])).content.decode()
    assert "from the feed" in html and "www.example.com" in html
    assert 'name="allowed_hosts-0-host"' not in html


def test_rule_page_lists_its_sources_and_the_list_filters_by_source(make_staff, feed, committed):
    client = make_staff(*SOURCE_EDITOR)
    refresh(client, feed, committed)
    changes.add_rules(["a.example", "hand.example"], source="admin")
    rule = SpamRule.objects.get(expression="a.example/")
    html = client.get(reverse("admin:urlguard_spamrule_change", args=[rule.pk])).content.decode()
    assert "feed-a</a>" in html and "admin</a>" in html and "Listed by" in html
    listing = client.get(
        reverse("admin:urlguard_spamrule_changelist") + f"?listed_by={feed.pk}"
    ).content.decode()
    assert "b.example/" in listing and "hand.example/" not in listing


def test_dashboard_shows_feed_health(make_staff, feed, committed):
    client = make_staff(*SOURCE_EDITOR)
    refresh(client, feed, committed)
    html = client.get(reverse("admin:urlguard_spamrule_dashboard")).content.decode()
    assert 'id="feeds"' in html and "feed-a" in html and "feed-ok" in html


def test_a_rule_added_by_hand_on_an_allowlisted_host_is_warned_not_refused(superuser):
    allow = Source.objects.create(name="allowlist", kind="manual", is_allowlist=True)
    AllowedHost.objects.create(source=allow, host="www.partner.example")
    response = superuser.post(
        reverse("admin:urlguard_spamrule_add"),
        {
            "url": "https://partner.example/",
            "expression": "partner.example/",
            "category": "spam",
            "note": "",
            "confirm": "on",
        },
        follow=True,
    )
    assert SpamRule.objects.filter(expression="partner.example/").exists(), (
        response.content.decode()[-3000:]
    )
    assert "allowlisted" in response.content.decode()


def test_the_refresh_page_shows_the_body_lines_to_superusers_only(make_staff, server, committed):
    body = b"a.example\nDJANGO_SECRET_KEY = 'xyz-secret'\n"
    feed = Source.objects.create(name="f", kind="feed", url=server.serve("/l", body))
    html = refresh(client := make_staff(*SOURCE_EDITOR), feed, committed).content.decode()
    assert "feed-refusals" in html and "items on one line" in html
    assert "xyz-secret" not in html and "<th>Entry</th>" not in html
    job = AdminJob.objects.get()
    page = reverse("admin:urlguard_source_refresh_job", args=[feed.pk, job.pk])
    assert "xyz-secret" not in client.get(page).content.decode()
    html = make_staff(superuser=True).get(page).content.decode()
    assert "xyz-secret" in html and "<th>Entry</th>" in html


def test_the_refresh_page_says_what_it_blocks_and_links_the_rescan(make_staff, feed, committed):
    from urlguard.models import ShortLink

    ShortLink.objects.create(slug="docs", destination="https://a.example/page")
    client = make_staff(*SOURCE_EDITOR)
    html = refresh(client, feed, committed).content.decode()
    assert "Short links: blocks 1 short link that was open: /docs" in html
    assert "The rescan of the short links that followed" in html


def test_failing_means_feed_unhealthy_failures_in_a_row_as_the_readme_says(settings):
    from urlguard.feeds.health import health

    feed = Source(name="f", kind="feed", url="https://x.example/", failures=1)
    assert health(feed) == "failed"  # once: a retry may mend it
    feed.failures = 3
    assert health(feed) == "failing"
    settings.URLGUARD = {**settings.URLGUARD, "FEED_UNHEALTHY_FAILURES": 5}
    assert health(feed) == "failed"


def test_results_in_words():
    from urlguard.feeds.health import in_words

    assert in_words(5, 0, 0) == "5 added, none removed, none refused"
    assert in_words(1200, 3, None, 7) == "1,200 added, 3 removed, 7 unchanged"


@pytest.mark.parametrize(
    ("typed", "seconds"),
    [("1 h", 3600), ("15 min", 900), ("90 s", 90), ("2d", 172800), ("600", 600), ("1.5 h", 5400)],
)
def test_the_interval_is_typed_in_human_units(make_staff, typed, seconds):
    client = make_staff(*SOURCE_EDITOR)
    data = {"name": "f", "kind": "feed", "url": "https://feeds.example/f.txt"}
    data |= {"format": "auto", "category": "spam", "interval": typed, "enabled": "on"}
    response = client.post(reverse("admin:urlguard_source_add"), data)
    assert response.status_code == 302, response.content.decode()[-1500:]
    assert Source.objects.get(name="f").interval == seconds


@pytest.mark.parametrize("typed", ["30 s", "soon", "-1 h", "1 week"])
def test_a_bad_interval_is_refused_with_the_units(make_staff, typed):
    client = make_staff(*SOURCE_EDITOR)
    data = {"name": "f", "kind": "feed", "url": "https://feeds.example/f.txt"}
    data |= {"format": "auto", "category": "spam", "interval": typed, "enabled": "on"}
    html = client.post(reverse("admin:urlguard_source_add"), data).content.decode()
    assert ("At least 1 min" in html) or ("90 s, 15 min, 1 h or 1 d" in html)
    assert not Source.objects.filter(name="f").exists()


def test_the_list_shows_url_status_entries_last_success_and_next_refresh(
    make_staff, feed, committed
):
    client = make_staff(*SOURCE_EDITOR)
    refresh(client, feed, committed)
    html = client.get(reverse("admin:urlguard_source_changelist")).content.decode()
    feeds = client.get(reverse("admin:urlguard_source_changelist") + "?kind__exact=feed")
    assert "<h1>Feeds</h1>" in feeds.content.decode()
    for header in ("URL", "Health", "Entries", "Last success", "Next refresh"):
        assert f">{header}<" in html or f">{header}</a>" in html, header
    assert feed.url in html and "in 1 h (every 1 h)" in html
    edit = client.get(reverse("admin:urlguard_source_change", args=[feed.pk])).content.decode()
    assert 'value="1 h"' in edit and ">URL:<" in edit


def test_a_test_fetch_shows_what_subscribing_would_do_and_changes_nothing(make_staff, server):
    from urlguard.models import ShortLink

    ShortLink.objects.create(slug="docs", destination="https://a.example/page")
    url = server.serve("/t", b"a.example\nb.example\nnot a host at all!\n")
    client = make_staff(*SOURCE_EDITOR)
    form = client.get(reverse("admin:urlguard_source_add")).content.decode()
    assert 'id="test-fetch"' in form
    data = {"name": "trial", "kind": "feed", "url": url, "format": "auto", "category": "spam"}
    data |= {"interval": "15 min", "enabled": "on", "_test_fetch": "1"}
    response = client.post(reverse("admin:urlguard_source_test_fetch_start"), data, follow=True)
    html = response.content.decode()
    assert "Format detected" in html and 'id="test-fetch-entries">2' in html
    assert 'id="test-fetch-refused">1' in html and "not a host at all" in html
    assert "Would block 1 short link" in html and "/docs" in html
    assert not Source.objects.filter(name="trial").exists() and not SpamRule.objects.exists()
    subscribe = re.search(r'id="subscribe" href="([^"]+)"', html).group(1)
    prefilled = client.get(unescape(subscribe)).content.decode()
    assert 'value="trial"' in prefilled and 'value="15 min"' in prefilled


def test_a_test_fetch_of_a_broken_feed_says_why(make_staff, server):
    url = server.serve("/gone", b"", status=404)
    client = make_staff(*SOURCE_EDITOR)
    data = {"name": "t", "kind": "feed", "url": url, "format": "auto", "category": "spam"}
    data |= {"interval": "1 h", "enabled": "on"}
    html = client.post(
        reverse("admin:urlguard_source_test_fetch_start"), data, follow=True
    ).content.decode()
    assert 'id="test-fetch-error"' in html and "404" in html


def test_a_test_fetch_of_a_bad_form_goes_back_with_the_mistakes(make_staff):
    client = make_staff(*SOURCE_EDITOR)
    data = {"name": "t", "kind": "feed", "url": "ftp://x", "format": "auto", "category": "spam"}
    data |= {"interval": "1 h"}
    response = client.post(reverse("admin:urlguard_source_test_fetch_start"), data)
    assert response.status_code == 302 and "/add/?" in response["Location"]
    assert not AdminJob.objects.exists()
    viewer = make_staff("view_source")
    assert viewer.post(reverse("admin:urlguard_source_test_fetch_start"), data).status_code == 403
