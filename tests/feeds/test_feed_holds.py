"""Feeds held to the same safety net as the admin's add form: a new entry on a popular
host, a shortener, this service's own host, or one that would block more than
CONFIRM_IMPACT_LINKS short links is held with its reason (the rest of the refresh
applies) until an operator accepts it, in the admin or with `refresh_feeds
--accept-held`; and addresses outside the public internet and CIDR ranges are
refused with a reason."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.urls import reverse

from urlguard import models
from urlguard.feeds.refresh import refresh_source
from urlguard.models import FeedRefresh, RuleSource, ShortLink, Source

pytestmark = pytest.mark.django_db

POPULAR = ["google.com", "bit.ly", "t.co", "paypal.com", "github.com", "mail.google.com"]


@pytest.fixture(autouse=True)
def _quiet(quiet):
    """Rule writes send no nudge."""


@pytest.fixture
def feed(tmp_path, settings):
    """feed(*lines) -> the feed "f", whose file now holds `lines`."""
    settings.URLGUARD = {**settings.URLGUARD, "FEED_FILE_ROOT": str(tmp_path)}
    path = tmp_path / "list.txt"
    source = Source.objects.create(name="f", kind=Source.Kind.FEED, url=f"file://{path}")

    def write(*lines: str) -> Source:
        path.write_text("".join(f"{line}\n" for line in lines))
        source.last_modified = ""  # the file's stamp may repeat within a second
        source.save(update_fields=["last_modified"])
        return source

    return write


def listed(source: Source) -> set[str]:
    return set(RuleSource.objects.filter(source=source).values_list("rule__expression", flat=True))


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_popular_hosts_and_shorteners_are_held_the_rest_applies(feed):
    source = feed(*POPULAR, "evil.example", "google.com/forms/d/phish")
    result = refresh_source(source)
    # Before: all eight listed, and the demo's clean links turned into warnings.
    assert listed(source) == {"evil.example/", "google.com/forms/d/phish"}
    assert result.status == "ok" and result.held == 6 and result.added == 2
    held = {h.expression: h for h in models.FeedHold.objects.filter(source=source)}
    assert set(held) == {f"{host}/" for host in POPULAR}
    assert held["bit.ly/"].codes == "shortener" and "link shortener" in held["bit.ly/"].reasons
    assert "popular" in held["mail.google.com/"].codes
    assert FeedRefresh.objects.filter(source=source).first().held == 6
    assert "6 held for confirmation" in result.summary()
    # Held again, not twice, on the next refresh; a hold the feed drops goes.
    source = feed(*POPULAR[:-1], "evil.example")
    result = refresh_source(source)
    assert result.held == 5 and models.FeedHold.objects.count() == 5
    assert listed(source) == {"evil.example/"}


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_accepting_with_the_command_applies_them(feed):
    source = feed("bit.ly", "evil.example")
    out = io.StringIO()
    call_command("refresh_feeds", "f", stdout=out)
    assert "held bit.ly/" in out.getvalue() and "--accept-held" in out.getvalue()
    # The body is unchanged (a conditional GET would answer 304): accepting re-reads it.
    call_command("refresh_feeds", "f", "--accept-held", stdout=out)
    assert listed(source) == {"bit.ly/", "evil.example/"}
    hold = models.FeedHold.objects.get()
    assert hold.accepted_at is not None
    # Still accepted on later refreshes; gone once the feed stops listing it.
    feed("bit.ly", "evil.example")
    assert refresh_source(source).held == 0
    feed("evil.example")
    assert refresh_source(source).status == "ok"
    assert listed(source) == {"evil.example/"} and not models.FeedHold.objects.exists()


def test_this_services_own_host_is_held(feed, settings):
    settings.ALLOWED_HOSTS = ["go.shortener.example"]
    result = refresh_source(feed("shortener.example", "evil.example"))
    assert result.held == 1 and "own host" in result.holds[0][1]


def test_a_rule_over_the_impact_limit_is_held(feed, settings):
    settings.URLGUARD = {**settings.URLGUARD, "CONFIRM_IMPACT_LINKS": 2}
    for i in range(3):
        ShortLink.objects.create(slug=f"v{i}", destination=f"https://victim.example/p/{i}")
    ShortLink.objects.create(slug="w", destination="https://minor.example/")
    result = refresh_source(feed("victim.example", "minor.example"))
    assert result.held == 1 and result.holds[0][0] == "victim.example/"
    assert "would block 3 short links" in result.holds[0][1]
    assert models.FeedHold.objects.get().codes == "impact"


def test_accepting_in_the_admin_refreshes_and_applies(feed, make_staff, committed):
    source = feed("paypal.com", "evil.example")
    refresh_source(source)
    client = make_staff(superuser=True)
    hold = models.FeedHold.objects.get()
    changelist = reverse("admin:urlguard_feedhold_changelist")
    html = client.get(changelist).content.decode()
    assert "paypal.com/" in html and "popular" in html
    with committed():
        response = client.post(
            changelist, {"action": "accept_holds", "_selected_action": [hold.pk]}
        )
    assert response.status_code == 302
    assert listed(source) == {"paypal.com/", "evil.example/"}


def test_the_refresh_page_lists_what_was_held(feed, make_staff, committed):
    source = feed("t.co", "evil.example")
    client = make_staff("view_source", "change_source")
    with committed():
        response = client.post(reverse("admin:urlguard_source_refresh", args=[source.pk]))
    html = client.get(response["Location"]).content.decode()
    assert "held for confirmation" in html and "t.co/" in html and 'id="feed-holds"' in html


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("192.0.2.0/24", "CIDR notation"),
        ("[2001:db8::]/32", "CIDR notation"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("255.255.255.255", "broadcast"),
        ("240.0.0.1", "reserved"),
        ("0.1.2.3", "this-network"),
        ("198.18.0.1", "benchmark"),
        ("[2002:7f00:1::1]", "loopback"),
        ("[2002:a00:1::1]", "private"),
        ("[2001:0:4136:e378:8000:63bf:80ff:fffe]", "loopback"),
        ("http://2130706433/", "loopback"),
    ],
)
def test_addresses_outside_the_internet_and_ranges_are_refused_with_a_reason(feed, entry, reason):
    result = refresh_source(feed(entry, "evil.example"))
    assert result.refused == 1 and reason in result.refusals[0][2], result.refusals
    assert listed(Source.objects.get(name="f")) == {"evil.example/"}
