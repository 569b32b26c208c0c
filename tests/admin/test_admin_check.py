"""Check-a-URL page: canonical form, every expression, the filter's and the table's
answers, the verdict and its rule; a malformed URL is a form error."""

from __future__ import annotations

import pytest
from django.urls import reverse

from urlguard.hotpath.canonical import canonicalize, expressions
from urlguard.writepath import changes

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_guard")]

CHECK = reverse("admin:urlguard_spamrule_check")
URL = "HTTP://Deep.Evil-Example.com/a/../b/page.html?x=1#frag"


def test_form_only(viewer):
    page = viewer.get(CHECK)
    assert page.status_code == 200 and page.context["report"] is None


def test_blocked_url_lays_open_every_step(viewer, build_filter):
    rule = changes.add_rule("evil-example.com/", category="phishing")
    build_filter()
    page = viewer.get(CHECK, {"url": URL})
    report = page.context["report"]
    assert report["canonical"] == canonicalize(URL)
    assert [r.expression for r in report["rows"]] == expressions(canonicalize(URL))
    by_expr = {r.expression: r for r in report["rows"]}
    assert by_expr["evil-example.com/"].filter_says is True
    assert by_expr["evil-example.com/"].rule == rule
    assert report["verdict"].blocked and report["verdict"].rule == rule
    html = page.content.decode()
    assert "Verdict: blocked" in html and "Phishing" in html
    assert html.count('<tr class="finding-') == len(report["rows"])


def test_clean_url(viewer, build_filter):
    changes.add_rule("evil-example.com/", category="phishing")
    build_filter()
    page = viewer.get(CHECK, {"url": "https://fine.example.org/"})
    assert not page.context["report"]["verdict"].blocked
    assert "Verdict: allowed" in page.content.decode()


def test_a_rule_the_filter_does_not_hold_yet_is_flagged(viewer, build_filter):
    build_filter()
    changes.add_rule("evil-example.com/", category="spam")  # not applied to the file
    report = viewer.get(CHECK, {"url": URL}).context["report"]
    assert [r.expression for r in report["stale"]] == ["evil-example.com/"]


def test_missing_filter_file_is_explained(viewer):
    page = viewer.get(CHECK, {"url": URL})
    assert "could not be opened" in page.context["report"]["filter_error"]


@pytest.mark.parametrize(
    "bad",
    ["mailto:someone@example.com", "http://", "javascript:x()", "not a url", "http://0x100.0/"],
)
def test_malformed_url_is_a_form_error(viewer, bad):
    page = viewer.get(CHECK, {"url": bad})
    assert page.status_code == 200
    assert "not a URL that can be checked" in " ".join(page.context["form"].errors["url"])
    assert page.context["report"] is None


def test_empty_url_is_a_form_error(viewer):
    assert viewer.get(CHECK, {"url": ""}).context["form"].errors["url"]


def test_needs_view_permission(make_staff):
    assert make_staff("view_shortlink").get(CHECK, {"url": URL}).status_code == 403


def test_empty_url_says_what_to_do(viewer):
    assert viewer.get(CHECK, {"url": ""}).context["form"].errors["url"] == [
        "Paste the URL to check."
    ]


def test_a_long_bad_url_is_not_echoed_whole(viewer):
    [message] = viewer.get(CHECK, {"url": "ftp://" + "x" * 5000}).context["form"].errors["url"]
    assert len(message) < 400 and "only http and https URLs can be checked" in message
