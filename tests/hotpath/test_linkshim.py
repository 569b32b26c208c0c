"""The link shim: `{{ url|guarded }}` / `urlguard.guarded_url(url)` make a signed
redirect through this app, checked when clicked (a link listed after the page was
rendered is caught) and useless as an open redirect."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from django.template import Context, Template
from django.test import Client

import urlguard
from urlguard.hotpath.hrefs import where_href_goes
from urlguard.writepath.changes import add_rule

pytestmark = pytest.mark.django_db


def test_guarded_url_is_this_sites_signed_redirect():
    link = urlguard.guarded_url("https://news.example/story?id=1")
    parts = urlsplit(link)
    assert parts.path == "/go/"
    query = parse_qs(parts.query)
    assert query["u"] == ["https://news.example/story?id=1"] and query["s"][0]


@pytest.mark.parametrize("url", ["/local/page", "#top", "mailto:a@b.example", "javascript:x()", ""])
def test_links_that_leave_for_no_checked_place_are_left_alone(url):
    assert urlguard.guarded_url(url) == url


def test_template_filter():
    html = Template("{% load urlguard %}<a href='{{ url|guarded }}'>x</a>").render(
        Context({"url": "https://news.example/a b"})
    )
    # Signed as the browser sends it: the space escaped.
    assert "href='/go/?u=https%3A%2F%2Fnews.example%2Fa%2520b&amp;s=" in html


def test_a_clean_link_redirects(build_filter, fresh_guard):
    build_filter()
    response = Client().get(urlguard.guarded_url("https://news.example/story"))
    assert response.status_code == 302
    assert response["Location"] == "https://news.example/story"


def test_a_link_listed_after_the_page_was_rendered_is_caught_at_click_time(
    build_filter, sync_filter, fresh_guard
):
    build_filter()
    link = urlguard.guarded_url("https://evil.example/login")  # the page is rendered
    add_rule("evil.example/", category="phishing", source="test")  # then listed
    sync_filter()
    response = Client().get(link)
    assert response.status_code == 403
    assert b"evil.example" in response.content


@pytest.mark.parametrize(
    "query",
    [
        "u=https://evil.example/",  # no signature
        "u=https://evil.example/&s=forged",
        "",
    ],
)
def test_an_unsigned_or_altered_link_is_refused(query, build_filter, fresh_guard):
    build_filter()
    response = Client().get("/go/?" + query)
    assert response.status_code == 400 and "Location" not in response


def test_a_signature_covers_only_its_own_url(build_filter, fresh_guard):
    build_filter()
    signature = parse_qs(urlsplit(urlguard.guarded_url("https://news.example/")).query)["s"][0]
    response = Client().get("/go/", {"u": "https://other.example/", "s": signature})
    assert response.status_code == 400


def test_links_survive_a_key_rotation(settings, build_filter, fresh_guard):
    build_filter()
    link = urlguard.guarded_url("https://news.example/")
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "another-" + "k" * 60
    assert Client().get(link).status_code == 302
    settings.SECRET_KEY_FALLBACKS = []
    assert Client().get(link).status_code == 400


# Spellings of a link to evil.example that a browser follows straight there.
LEAVING = [
    "//evil.example/",
    "\\\\evil.example/",
    "/\\evil.example/",
    "\\/evil.example/",
    "\x01//evil.example/",
    " //evil.example/",
    "/\t/evil.example/",
    "///evil.example/",
    "https:evil.example/",
    "https:\\\\evil.example/",
    "HTTPS://EVIL.example/",
    "http:\\\\evil.example/",
]


@pytest.mark.parametrize("href", LEAVING)
def test_every_spelling_that_leaves_the_site_is_shimmed(href):
    link = urlguard.guarded_url(href)
    assert urlsplit(link).path == "/go/"
    assert parse_qs(urlsplit(link).query)["u"][0].startswith(("https://evil.example/", "http://"))
    for page in ("http://site.example/a/b", "https://site.example/a/b"):
        assert not where_href_goes(link, page).leaves


def test_a_link_too_long_to_shim_is_refused(build_filter, fresh_guard):
    build_filter()
    href = "https://evil.example/" + "a" * 9000
    link = urlguard.guarded_url(href)
    assert not where_href_goes(link, "https://site.example/").leaves
    response = Client().get(link)
    assert response.status_code == 400 and "Location" not in response
    assert b"too long" in response.content


def test_a_relative_link_written_with_a_scheme_is_shimmed_where_it_may_leave():
    # On an https page `http:x/` is http://x/; on an http page a path: shimmed to the host.
    link = urlguard.guarded_url("http:evil.example/x")
    assert parse_qs(urlsplit(link).query)["u"] == ["http://evil.example/x"]
