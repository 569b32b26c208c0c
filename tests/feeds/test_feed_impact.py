"""A feed refresh reports what it newly blocks of the short links (a handful named,
then a count, with their clicks), runs the rescan an import runs, prints the same
from `manage.py refresh_feeds`, and is held whole when it would block more than
CONFIRM_IMPACT_LINKS links, until its impact is accepted (accepting a shrink does not
accept it, nor the other way round)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from tests.support.feedserver import lines
from urlguard.feeds import refresh as refreshing
from urlguard.feeds.refresh import refresh_source
from urlguard.models import AdminJob, ChangeSet, Click, FeedRefresh, ShortLink, Source, SpamRule
from urlguard.writepath import changes

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quiet_feeds")]


@pytest.fixture
def links():
    made = {}
    for slug, destination in [
        ("django-docs", "https://docs.djangoproject.com/en/5.2/"),
        ("bloom", "https://bloom-filters.example/wiki/Bloom_filter"),
        ("bank-home", "https://bank.example/login"),
        ("phish", "https://evil.example/x"),
    ]:
        made[slug] = ShortLink.objects.create(slug=slug, destination=destination)
    Click.objects.bulk_create([Click(link=made["bloom"], visitor=f"v{i}") for i in range(7)])
    return made


def test_a_refresh_names_the_links_it_newly_blocks(server, links):
    changes.add_rules(["evil.example"], source="admin")  # /phish was blocked already
    url = server.serve(
        "/f", lines("docs.djangoproject.com", "bloom-filters.example", "evil.example")
    )
    feed = Source.objects.create(name="hosts", kind="feed", url=url)
    result = refresh_source(feed)
    assert result.status == "ok"
    assert result.impact["changed"] == 2 and result.impact["covered"] == 1
    [line] = result.impact_lines()
    assert line == (
        "blocks 2 short links that were open: /django-docs, /bloom (7 clicks in the last 30 days)"
    )
    assert FeedRefresh.objects.get().impact["changed"] == 2
    rescan = AdminJob.objects.get(pk=result.rescan_job)
    assert rescan.kind == "rescan"


def test_a_handful_are_named_then_a_count(server):
    for i in range(8):
        ShortLink.objects.create(slug=f"l{i}", destination=f"https://h{i}.example/")
    url = server.serve("/f", lines(*(f"h{i}.example" for i in range(8))))
    feed = Source.objects.create(name="hosts", kind="feed", url=url)
    result = refresh_source(feed)
    assert result.impact_lines(shown=5)[0].startswith(
        "blocks 8 short links that were open: /l0, /l1, /l2, /l3, /l4 and 3 more"
    )


def test_no_rescan_when_no_link_is_touched(server, links):
    url = server.serve("/f", lines("unrelated.example"))
    result = refresh_source(Source.objects.create(name="hosts", kind="feed", url=url))
    assert result.impact_lines() == ["blocks no short link that was open"]
    assert result.rescan_job is None and not AdminJob.objects.exists()


def test_over_confirm_impact_links_is_held_until_accepted(server, links, settings):
    settings.URLGUARD = {**settings.URLGUARD, "CONFIRM_IMPACT_LINKS": 1}
    url = server.serve("/f", lines("docs.djangoproject.com", "bloom-filters.example"))
    feed = Source.objects.create(name="hosts", kind="feed", url=url)
    held = refresh_source(feed)
    assert held.status == "held" and "CONFIRM_IMPACT_LINKS=1" in held.held_reason
    assert not SpamRule.objects.exists()
    feed.refresh_from_db()
    assert feed.held_at is not None and "2 short links" in feed.held_reason
    assert held.impact_lines()[0].startswith("would block 2 short links")
    # Accepting a shrink is not accepting an impact.
    assert refresh_source(feed, accept_shrink=True).status == "held"
    assert not SpamRule.objects.exists()
    accepted = refresh_source(feed, accept_impact=True)
    assert accepted.status == "ok" and SpamRule.objects.count() == 2
    feed.refresh_from_db()
    assert feed.held_at is None and feed.held_reason == ""
    reason = ChangeSet.objects.get(pk=accepted.change_set).reason
    assert reason.endswith("(impact accepted)") and "shrink" not in reason


def test_accept_held_accepts_what_the_source_was_held_for(server, links, settings):
    settings.URLGUARD = {**settings.URLGUARD, "CONFIRM_IMPACT_LINKS": 1}
    url = server.serve("/f", lines("docs.djangoproject.com", "bloom-filters.example"))
    feed = Source.objects.create(name="hosts", kind="feed", url=url)
    assert refresh_source(feed).status == "held"
    feed.refresh_from_db()
    assert refreshing.accept_held(feed).status == "ok" and SpamRule.objects.count() == 2


@pytest.fixture
def shrink_and_impact(server, links, settings):
    """A feed whose new fetch both drops all ten entries it listed (a shrink) and
    blocks two short links, over CONFIRM_IMPACT_LINKS=1."""
    settings.URLGUARD = {**settings.URLGUARD, "CONFIRM_IMPACT_LINKS": 1}
    server.serve("/f", lines(*(f"h{i}.example" for i in range(10))))
    feed = Source.objects.create(name="hosts", kind="feed", url=server.url("/f"))
    assert refresh_source(feed).status == "ok" and SpamRule.objects.count() == 10
    server.serve("/f", lines("docs.djangoproject.com", "bloom-filters.example"))
    return feed


def test_accepting_the_impact_does_not_accept_a_shrink(shrink_and_impact):
    held = refresh_source(shrink_and_impact, accept_impact=True)
    assert held.status == "held" and "FEED_SHRINK_THRESHOLD" in held.held_reason
    assert SpamRule.objects.count() == 10


def test_accepting_the_shrink_does_not_accept_the_impact(shrink_and_impact):
    held = refresh_source(shrink_and_impact, accept_shrink=True)
    assert held.status == "held" and "CONFIRM_IMPACT_LINKS=1" in held.held_reason
    assert SpamRule.objects.count() == 10
    applied = refresh_source(shrink_and_impact, accept_shrink=True, accept_impact=True)
    assert applied.status == "ok"
    assert sorted(SpamRule.objects.values_list("expression", flat=True)) == [
        "bloom-filters.example/",
        "docs.djangoproject.com/",
    ]


def test_refresh_feeds_accept_impact(server, links, settings):
    settings.URLGUARD = {**settings.URLGUARD, "CONFIRM_IMPACT_LINKS": 1}
    url = server.serve("/f", lines("docs.djangoproject.com", "bloom-filters.example"))
    Source.objects.create(name="hosts", kind="feed", url=url)

    def run(*args):
        out = io.StringIO()
        call_command("refresh_feeds", *args, stdout=out)
        return out.getvalue()

    out = run("hosts")
    assert "HELD" in out and "`manage.py refresh_feeds hosts --accept-impact`" in out
    out = run("hosts", "--accept-shrink")
    assert "HELD" in out and "--accept-shrink --accept-impact`" in out
    assert not SpamRule.objects.exists()
    out = run("hosts", "--accept-impact")
    assert "hosts: ok" in out and SpamRule.objects.count() == 2


def test_zero_never_holds(server, links, settings):
    settings.URLGUARD = {**settings.URLGUARD, "CONFIRM_IMPACT_LINKS": 0}
    url = server.serve("/f", lines("docs.djangoproject.com", "bloom-filters.example"))
    assert refresh_source(Source.objects.create(name="f", kind="feed", url=url)).status == "ok"


def test_refresh_feeds_prints_the_same_lines(server, links):
    url = server.serve("/f", lines("docs.djangoproject.com"))
    Source.objects.create(name="hosts", kind="feed", url=url)
    out = io.StringIO()
    call_command("refresh_feeds", stdout=out)
    text = out.getvalue()
    assert "  short links: blocks 1 short link that was open: /django-docs (0 clicks" in text
    assert "rescan of the short links: Scanned 4 links" in text


def test_a_dry_run_says_what_it_would_block(server, links):
    url = server.serve("/f", lines("docs.djangoproject.com"))
    feed = Source.objects.create(name="hosts", kind="feed", url=url)
    result = refresh_source(feed, dry_run=True)
    assert result.impact_lines() == [
        "would block 1 short link that was open: /django-docs (0 clicks in the last 30 days)"
    ]
    assert not SpamRule.objects.exists() and not AdminJob.objects.exists()


def test_no_rescan_in_a_site_without_short_links(server, links, monkeypatch):
    import urlguard.shortlinks

    monkeypatch.setattr(urlguard.shortlinks, "installed", lambda: False)
    url = server.serve("/f", lines("evil.example"))
    result = refresh_source(Source.objects.create(name="hosts", kind="feed", url=url))
    assert result.status == "ok" and result.impact["changed"] == 1
    assert result.rescan_job is None and not AdminJob.objects.filter(kind="rescan").exists()


@pytest.mark.parametrize("installed", [True, False])
def test_short_link_admin_links_only_where_short_links_are_installed(
    make_staff, monkeypatch, installed
):
    """A host site without urlguard.shortlinks has no short-link admin to link to (its
    URLs would not reverse): the pages name the links without linking them."""
    from django.template.loader import render_to_string
    from django.urls import reverse

    import urlguard.shortlinks

    monkeypatch.setattr(urlguard.shortlinks, "installed", lambda: installed)
    impact = {
        "action": "add",
        "text": "Blocks 1 short link.",
        "links": 1,
        "samples": [{"id": 41, "slug": "phish", "destination": "https://evil.example/x"}],
    }
    html = render_to_string("admin/urlguard/_impact.html", {"impact": impact})
    assert "/phish" in html
    assert ("/admin/urlguard/shortlink/41/" in html) is installed
    feed = Source.objects.create(name="hosts", kind="feed", url="https://feed.example/l")
    job = AdminJob.objects.create(
        kind=AdminJob.Kind.REFRESH,
        state=AdminJob.State.DONE,
        params={"source": feed.pk, "name": feed.name},
        message="hosts: ok: 1 entries",
        result={"rescan_job": 7, "impact_lines": ["blocks 1 short link that was open: /phish"]},
    )
    page = make_staff(superuser=True).get(
        reverse("admin:urlguard_source_refresh_job", args=[feed.pk, job.pk])
    )
    html = page.content.decode()
    assert page.status_code == 200 and "blocks 1 short link that was open" in html
    assert ("shortlink/rescan/?job=7" in html) is installed
