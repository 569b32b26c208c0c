"""urlguard.writepath.safety and the add form's confirmations: the proposed level is the narrowest
that covers the pasted URL, and a rule on a popular site, a link shortener, a hosting
platform, this service's own host or many links is saved only when confirmed."""

from __future__ import annotations

import pytest
from django.urls import reverse

from urlguard.models import ShortLink, SpamRule
from urlguard.writepath.rules import rule_candidates
from urlguard.writepath.safety import confirmations, default_candidate

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_guard")]

ADD = reverse("admin:urlguard_spamrule_add")
PREVIEW = reverse("admin:urlguard_spamrule_preview")


@pytest.mark.parametrize(
    ("pasted", "proposed"),
    [
        ("https://docs.google.com/forms/d/x", "docs.google.com/forms/d/x"),
        ("https://sites.google.com/view/x", "sites.google.com/view/x"),
        ("https://bit.ly/xyz", "bit.ly/xyz"),
        ("https://bit.ly/xyz?ref=1", "bit.ly/xyz"),
        # www. before a registrable domain: the spammer's own domain, bare host included.
        ("http://www.spam-shop.example/landing?utm=1", "spam-shop.example/"),
        ("https://www.mega-spam-deals.example/offers/x", "mega-spam-deals.example/"),
        ("www.spam-shop.example", "spam-shop.example/"),
        ("https://www.spam-shop.co.uk/x", "spam-shop.co.uk/"),
        ("https://www.evil.github.io/x", "evil.github.io/"),  # a customer's own site
        # ... but not a www. deeper down.
        ("https://www.shop.spam.example/x", "www.shop.spam.example/"),
        ("spam.example.com", "spam.example.com/"),
        ("example.com", "example.com/"),
        ("https://evil.github.io/x", "evil.github.io/"),  # a customer's site: its host
        ("https://bucket.s3.amazonaws.com/x/y", "bucket.s3.amazonaws.com/"),
        ("http://1.2.3.4/x.html", "1.2.3.4/"),
    ],
)
def test_default_candidate_is_the_narrowest_evident_intent(pasted, proposed):
    assert default_candidate(pasted, rule_candidates(pasted)).expression == proposed


@pytest.mark.parametrize(
    ("expression", "codes"),
    [
        ("google.com/", {"popular"}),
        ("docs.google.com/", {"popular"}),
        ("docs.google.com/forms/d/x", set()),
        ("bit.ly/", {"shortener"}),
        ("bit.ly/xyz", set()),
        ("amazonaws.com/", {"platform"}),
        ("bucket.s3.amazonaws.com/", set()),
        ("spam-shop.example/", set()),
    ],
)
def test_confirmations(expression, codes):
    assert {c.code for c in confirmations(expression)} == codes


def test_the_public_name_is_an_own_host_behind_a_proxy(settings):
    # ALLOWED_HOSTS may name only the proxy's internal name (or "*").
    settings.ALLOWED_HOSTS = ["*"]
    assert confirmations("guard.example.com/") == []
    settings.URLGUARD = {**settings.URLGUARD, "PUBLIC_URL": "https://Guard.Example.com/"}
    assert [c.code for c in confirmations("guard.example.com/")] == ["own-host"]


def test_own_host_and_configured_lists(settings):
    settings.ALLOWED_HOSTS = ["go.short.example", ".links.example"]
    assert [c.code for c in confirmations("short.example/")] == ["own-host"]
    assert [c.code for c in confirmations("links.example/")] == ["own-host"]
    assert [c.code for c in confirmations("me.example/", request_host="me.example:8000")] == [
        "own-host"
    ]
    settings.URLGUARD = {**settings.URLGUARD, "PROTECTED_HOSTS": ["ours.example"]}
    assert [c.code for c in confirmations("ours.example/")] == ["popular"]
    assert confirmations("google.com/") == []  # the configured list replaces the shipped one
    settings.URLGUARD = {**settings.URLGUARD, "LINK_SHORTENERS": ["s.example"]}
    assert [c.code for c in confirmations("s.example/")] == ["shortener"]


def test_impact_threshold(settings):
    settings.URLGUARD = {**settings.URLGUARD, "CONFIRM_IMPACT_LINKS": 2}
    assert confirmations("spam.example/", blocked_links=2) == []
    [over] = confirmations("spam.example/", blocked_links=3)
    assert over.code == "impact" and "3 short links" in over.reason


def _save(client, url, expression, **extra):
    return client.post(
        ADD, {"url": url, "expression": expression, "category": "spam", "_save": "1", **extra}
    )


def test_a_popular_domain_is_saved_only_when_confirmed(editor):
    page = _save(editor, "https://docs.google.com/forms/d/x", "google.com/")
    assert page.status_code == 200 and not SpamRule.objects.exists()
    [error] = page.context["form"].errors["confirm"]
    assert "popular site on the protected hosts list" in error
    assert 'id="confirm-row"' in page.content.decode()
    # The narrow level needs nothing.
    assert (
        _save(editor, "https://docs.google.com/forms/d/x", "docs.google.com/forms/d/x").status_code
        == 302
    )
    confirmed = _save(editor, "https://docs.google.com/forms/d/x", "google.com/", confirm="on")
    assert confirmed.status_code == 302
    assert set(SpamRule.objects.values_list("expression", flat=True)) == {
        "google.com/",
        "docs.google.com/forms/d/x",
    }


def test_own_host_needs_a_confirmation(editor, settings):
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "go.short.example"]
    page = _save(editor, "https://go.short.example/abc", "short.example/")
    assert "this service's own host" in page.context["form"].errors["confirm"][0]
    assert not SpamRule.objects.exists()


def test_too_many_links_need_a_confirmation(editor, settings):
    settings.URLGUARD = {**settings.URLGUARD, "CONFIRM_IMPACT_LINKS": 1}
    for i in range(2):
        ShortLink.objects.create(slug=f"s{i}", destination=f"https://many.example/{i}")
    page = _save(editor, "https://many.example/0", "many.example/")
    assert "would block 2 short links" in page.context["form"].errors["confirm"][0]
    assert _save(editor, "https://many.example/0", "many.example/", confirm="on").status_code == 302


def test_preview_json_proposes_and_explains(editor):
    data = editor.get(PREVIEW, {"url": "https://bit.ly/xyz"}).json()
    assert data["default"] == data["expression"] == "bit.ly/xyz"
    assert data["confirmations"] == []
    broad = editor.get(PREVIEW, {"url": "https://bit.ly/xyz", "expression": "bit.ly/"}).json()
    assert [c["code"] for c in broad["confirmations"]] == ["shortener"]
    assert broad["impact"]["text"].startswith("Would block 0 short links")


def test_the_form_without_javascript_proposes_the_narrow_level(editor):
    page = editor.post(
        ADD, {"url": "https://docs.google.com/forms/d/x", "category": "spam", "_preview": "1"}
    )
    assert page.context["preview"]["expression"] == "docs.google.com/forms/d/x"
    first = editor.get(ADD, {"url": "https://bit.ly/xyz"})
    assert first.context["form"]["expression"].value() == "bit.ly/xyz"
