"""`{{ html|guard_links }}`: an HTML fragment sanitized by nh3, every outbound `<a href>`
through the link shim whatever its spelling, local links and anchors untouched, what
the sanitizer refuses dropped, an over-long fragment shown as text."""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import parse_qs, urlsplit

import pytest
from django.template import Context, Template

from tests.support.spellings import OUTBOUND
from urlguard.content.html import guard_links
from urlguard.hotpath.hrefs import where_href_goes

pytestmark = pytest.mark.django_db

LOCAL = ["/about/", "#comments", "?page=2", "reply.html", "../up", "mailto:a@b.example"]


class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.hrefs += [value for name, value in attrs if name == "href"]


def links(html: str) -> Links:
    parser = Links()
    parser.feed(html)
    return parser


@pytest.mark.parametrize("href", OUTBOUND, ids=lambda h: repr(h[:30]))
def test_every_outbound_spelling_goes_through_the_shim(href):
    out = guard_links(f'<p>Look <a href="{href}" title="t">here</a></p>')
    [shimmed] = links(out).hrefs
    assert urlsplit(shimmed).path == "/go/", shimmed
    for page in ("http://site.example/post/1", "https://site.example/post/1"):
        assert not where_href_goes(shimmed, page).leaves
    query = parse_qs(urlsplit(shimmed).query)
    assert query.get("u", ["https://evil.example/x"])[0].endswith("evil.example/x") or (
        "refused" in query
    )


@pytest.mark.parametrize("href", LOCAL)
def test_local_links_and_anchors_are_untouched(href):
    out = guard_links(f'<a href="{href}">x</a>')
    assert links(out).hrefs == [href]


def test_what_the_sanitizer_refuses_is_dropped():
    out = guard_links(
        '<p onclick="steal()">hi<script>steal()</script>'
        '<a href="javascript:steal()">j</a><a href=" JaVaScRiPt:steal()">k</a>'
        '<iframe src="https://evil.example/"></iframe><style>p{}</style></p>'
    )
    assert "steal" not in out and "iframe" not in out and "style" not in out
    assert links(out).hrefs == []


def test_the_output_is_safe_html_in_a_template():
    html = Template("{% load urlguard %}<div>{{ body|guard_links }}</div>").render(
        Context({"body": '<b>Hi</b> <a href="//evil.example/?a=1&b=2">x</a> 1 < 2'})
    )
    assert "<b>Hi</b>" in html and "1 &lt; 2" in html
    [href] = links(html).hrefs
    assert parse_qs(urlsplit(href).query)["u"] == ["https://evil.example/?a=1&b=2"]


def test_an_over_long_fragment_is_shown_as_text(settings, caplog):
    settings.URLGUARD = {**settings.URLGUARD, "CONTENT_MAX_CHARS": 50}
    out = guard_links('<a href="https://evil.example/">a link in a long text, long long</a>')
    assert "<a" not in out and "&lt;a href=" in out
    assert "over CONTENT_MAX_CHARS" in caplog.text
