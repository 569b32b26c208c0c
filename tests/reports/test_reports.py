"""Mistake reports: the warning page's form (signed link, CSRF, rate limit, no
account), the admin queue beside the rule, and its one-click actions with their
permissions (view-only staff cannot act)."""

from __future__ import annotations

import re
from html import unescape
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from urlguard.models import ChangeEvent, MistakeReport, ShortLink, SpamRule
from urlguard.writepath import changes

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_guard", "quiet")]

QUEUE = reverse("admin:urlguard_mistakereport_changelist")


@pytest.fixture(autouse=True)
def _empty_cache():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def warned(db, build_filter):
    rule = changes.add_rule("docs-spam.example/", category="phishing")
    ShortLink.objects.create(slug="legit", destination="https://docs-spam.example/legit")
    ShortLink.objects.create(slug="bad", destination="https://docs-spam.example/phish/login")
    build_filter()
    return rule


def _report_url(client) -> str:
    html = client.get("/legit").content.decode()
    return unescape(re.search(r'href="([^"]*/report-mistake/[^"]+)"', html).group(1))


def test_the_warning_page_links_the_form_and_a_report_lands_in_the_queue(warned):
    visitor = Client(enforce_csrf_checks=True)
    url = _report_url(visitor)
    form = visitor.get(url)
    assert form.status_code == 200 and "https://docs-spam.example/legit" in form.content.decode()
    assert form["Referrer-Policy"] == "same-origin"
    token = form.context["token"]
    csrf = form.cookies["csrftoken"].value
    sent = visitor.post(
        url,
        {
            "token": token,
            "email": "me@example.org",
            "comment": "my form",
            "csrfmiddlewaretoken": csrf,
        },
    )
    assert sent.status_code == 200 and "Thank you" in sent.content.decode()
    report = MistakeReport.objects.get()
    assert (report.destination, report.rule, report.expression, report.email, report.status) == (
        "https://docs-spam.example/legit",
        warned,
        "docs-spam.example/",
        "me@example.org",
        "open",
    )
    # Again from the same visitor: still one open report.
    visitor.post(url, {"token": token, "csrfmiddlewaretoken": csrf})
    assert MistakeReport.objects.count() == 1


def test_the_form_needs_csrf_and_a_valid_token(warned):
    visitor = Client(enforce_csrf_checks=True)
    url = _report_url(visitor)
    assert visitor.post(url, {}).status_code == 403
    forged = visitor.get(reverse("urlguard:report"), {"token": "made-up"})
    assert forged.status_code == 400 and "not valid" in forged.content.decode()
    assert not MistakeReport.objects.exists()


def test_reports_are_rate_limited(warned, settings, client):
    settings.URLGUARD = {**settings.URLGUARD, "REPORT_RATE_LIMIT": 2}
    url = _report_url(client)
    token = client.get(url).context["token"]
    statuses = [client.post(url, {"token": token, "comment": str(i)}).status_code for i in range(3)]
    assert statuses == [200, 200, 429]


def _report_as(url: str, agent: str, address: str = "198.51.100.20", comment: str = ""):
    """A visitor with this User-Agent and address: warned, then sending the form."""
    visitor = Client(HTTP_USER_AGENT=agent, REMOTE_ADDR=address)
    form_url = _report_url(visitor) if url == "" else url
    token = visitor.get(form_url).context["token"]
    return visitor.post(form_url, {"token": token, "comment": comment})


def test_a_rotating_user_agent_does_not_escape_the_limit_per_address(warned, settings):
    # The review: 12 of 12 accepted from one address, each with a new User-Agent.
    statuses = [_report_as("", f"agent/{i}").status_code for i in range(12)]
    assert statuses == [200] * 10 + [429] * 2
    assert MistakeReport.objects.count() == 10
    # Another address is another count.
    assert _report_as("", "agent/0", address="203.0.113.5").status_code == 200


def test_ipv6_addresses_are_counted_per_64(warned, settings):
    settings.URLGUARD = {**settings.URLGUARD, "REPORT_ADDRESS_RATE_LIMIT": 2}
    statuses = [
        _report_as("", f"agent/{i}", address=f"2001:db8:5:6::{i + 1:x}").status_code
        for i in range(3)
    ]
    assert statuses == [200, 200, 429]
    assert _report_as("", "agent/9", address="2001:db8:5:7::1").status_code == 200


def test_open_reports_per_destination_are_capped(warned, settings):
    settings.URLGUARD = {**settings.URLGUARD, "REPORT_MAX_OPEN_PER_DESTINATION": 3}
    for i in range(5):
        sent = _report_as("", f"agent/{i}", address=f"198.51.100.{i + 1}")
        assert sent.status_code == 200 and "Thank you" in sent.content.decode()
    assert MistakeReport.objects.filter(destination="https://docs-spam.example/legit").count() == 3
    MistakeReport.objects.update(status=MistakeReport.Status.DISMISSED)
    _report_as("", "agent/late", address="198.51.100.99")
    assert MistakeReport.objects.filter(status="open").count() == 1


def test_the_report_link_is_for_the_warned_visitor_only(warned):
    warned_visitor = Client(HTTP_USER_AGENT="warned/1.0")
    url = _report_url(warned_visitor)
    assert warned_visitor.get(url).status_code == 200
    for other in (
        Client(HTTP_USER_AGENT="someone-else/1.0"),
        Client(HTTP_USER_AGENT="warned/1.0", REMOTE_ADDR="203.0.113.77"),
    ):
        page = other.get(url)
        assert page.status_code == 400 and "made for another browser" in page.content.decode()
        token = parse_qs(urlsplit(url).query)["token"][0]
        assert other.post(url, {"token": token}).status_code == 400
    assert not MistakeReport.objects.exists()


def test_the_report_link_expires_after_a_day(warned, settings, monkeypatch):
    import time as time_module

    visitor = Client()
    url = _report_url(visitor)
    now = time_module.time()
    monkeypatch.setattr(time_module, "time", lambda: now + 24 * 3600 - 60)
    assert visitor.get(url).status_code == 200
    monkeypatch.setattr(time_module, "time", lambda: now + 24 * 3600 + 60)
    assert visitor.get(url).status_code == 400
    settings.URLGUARD = {**settings.URLGUARD, "REPORT_TOKEN_MAX_AGE": 2 * 24 * 3600}
    assert visitor.get(url).status_code == 200


def test_report_mistake_url_stays_an_override(warned, settings, client):
    settings.URLGUARD = {**settings.URLGUARD, "REPORT_MISTAKE_URL": "https://desk.example/new"}
    assert "https://desk.example/new?url=" in client.get("/legit").content.decode()


@pytest.fixture
def report(warned, client):
    url = _report_url(client)
    client.post(url, {"token": client.get(url).context["token"], "comment": "not spam"})
    return MistakeReport.objects.get()


def test_the_queue_shows_the_report_beside_its_rule(report, editor, make_staff):
    resolver = make_staff(
        "view_mistakereport", "change_mistakereport", "view_spamrule", "delete_spamrule"
    )
    html = resolver.get(QUEUE).content.decode()
    assert "https://docs-spam.example/legit" in html and "<code>docs-spam.example/</code>" in html
    assert "Remove…" in html and "Dismiss" in html


def test_remove_after_a_confirmation_with_the_impact(report, make_staff):
    resolver = make_staff(
        "view_mistakereport", "change_mistakereport", "view_spamrule", "delete_spamrule"
    )
    url = reverse("admin:urlguard_mistakereport_remove", args=[report.pk])
    page = resolver.get(url).content.decode()
    assert "Would unblock 2 of the 2 short links" in page and 'id="confirm-remove"' in page
    assert resolver.post(url).status_code == 200  # no confirmation: the page again
    assert SpamRule.objects.exists()
    response = resolver.post(url, {"confirm": "1"}, follow=True)
    assert response.status_code == 200
    assert not SpamRule.objects.exists()
    assert ChangeEvent.objects.filter(action="remove").count() == 1
    report.refresh_from_db()
    assert (report.status, report.resolved_by) == ("removed", resolver.user)
    assert "Would unblock 2 of the 2 short links" in response.content.decode()


def test_dismiss_in_one_click(report, make_staff):
    resolver = make_staff("view_mistakereport", "change_mistakereport")
    resolver.post(reverse("admin:urlguard_mistakereport_dismiss", args=[report.pk]))
    report.refresh_from_db()
    assert report.status == "dismissed" and SpamRule.objects.count() == 1


def test_narrow_opens_the_add_form_that_replaces_the_rule(report, make_staff):
    resolver = make_staff(
        "view_mistakereport",
        "change_mistakereport",
        "view_spamrule",
        "add_spamrule",
        "delete_spamrule",
    )
    response = resolver.post(reverse("admin:urlguard_mistakereport_narrow", args=[report.pk]))
    assert response.status_code == 302
    form = resolver.get(response["Location"])
    initial = form.context["form"].initial
    assert initial["url"] == "https://docs-spam.example/phish/login"  # what the rule rightly blocks
    assert initial["samples"] == "https://docs-spam.example/legit"
    saved = resolver.post(
        reverse("admin:urlguard_spamrule_add"),
        {
            "url": initial["url"],
            "expression": "docs-spam.example/phish/",
            "category": "phishing",
            "replace": initial["replace"],
            "report": initial["report"],
            "_save": "1",
        },
    )
    assert saved.status_code == 302
    assert list(SpamRule.objects.values_list("expression", flat=True)) == [
        "docs-spam.example/phish/"
    ]
    report.refresh_from_db()
    assert report.status == "narrowed"


def test_view_only_staff_cannot_act(report, make_staff, editor):
    viewer = make_staff("view_mistakereport", "view_spamrule")
    html = viewer.get(QUEUE).content.decode()
    assert "https://docs-spam.example/legit" in html and "Remove…" not in html
    for name in ("remove", "narrow", "dismiss", "allowlist"):
        url = reverse(f"admin:urlguard_mistakereport_{name}", args=[report.pk])
        assert viewer.post(url).status_code == 403
        assert viewer.get(url).status_code in (403, 405)
    # Changing reports without deleting rules: dismiss yes, remove no.
    clerk = make_staff("view_mistakereport", "change_mistakereport")
    assert (
        clerk.post(reverse("admin:urlguard_mistakereport_remove", args=[report.pk])).status_code
        == 403
    )
    assert (
        clerk.post(reverse("admin:urlguard_mistakereport_narrow", args=[report.pk])).status_code
        == 403
    )
    report.refresh_from_db()
    assert report.status == "open" and SpamRule.objects.count() == 1
