"""`guard_links` in Chromium: in the sanitized fragment on a page, every link the
browser can follow stays on the site (Chromium's own `a.href` says where each goes),
and a listed link, clicked, answers the warning page without the browser asking the
listed host for anything."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from django.utils.html import urlize

from tests.browser.pages import serve_page
from tests.support.spellings import BROWSER_MAPPED_HOSTS, OUTBOUND
from urlguard.content import find_links
from urlguard.content.html import guard_links
from urlguard.hotpath.canonical import browser_url
from urlguard.hotpath.guard import reset_guard
from urlguard.writepath.changes import add_rule

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The service test's outbound spellings (each shimmed there), more the browser reads
# as leaving, and local links.
SPELLINGS = [
    *OUTBOUND,
    " \t//evil.example/x",
    "///evil.example/x",
    "https:\\\\evil.example/x",
    "http:evil.example/x",
    "&#47;&#92;evil.example/x",
    "//evil.example%2Fx",
    "&#104;ttp://evil.example/x",
    "\x7f//evil.example/x",
    "/local/page",
    "#comments",
    "reply.html",
]


@pytest.fixture
def site(live_server, build_filter):
    add_rule("evil.example/", category="phishing", source="test")
    build_filter()
    reset_guard()
    yield live_server.url
    reset_guard()


def test_no_link_of_the_fragment_leaves_the_site(page, site):
    fragment = "".join(f'<p><a href="{href}">link {i}</a></p>' for i, href in enumerate(SPELLINGS))
    post = f"{site}/post/1"
    serve_page(page, post, f"<!doctype html>{guard_links(fragment)}")
    page.goto(post)
    hrefs = page.eval_on_selector_all("a[href]", "links => links.map(a => a.href)")
    assert len(hrefs) == len(SPELLINGS)
    own = urlsplit(site).netloc
    assert [href for href in hrefs if urlsplit(href).netloc != own] == []


def test_a_listed_link_clicked_answers_the_warning_page(page, site):
    post = f"{site}/post/2"
    off_site = serve_page(
        page,
        post,
        "<!doctype html>" + guard_links('<p>Prize: <a href="//evil.example/win">claim it</a></p>'),
    )
    page.goto(post)
    with page.expect_navigation() as navigation:
        page.click("a")
    assert navigation.value.status == 403
    assert urlsplit(page.url).path == "/go/"
    assert page.locator(".card.danger").count() == 1
    assert "evil.example" in page.inner_text("body")
    assert off_site == []


def test_find_links_reads_a_linkified_host_as_chromium_does(page, site):
    """Django's urlize links each text; where Chromium's `a.href` takes each link,
    find_links names the same host (it found "http://evil" or nothing before)."""
    post = f"{site}/post/3"
    body = "".join(f"<p>{urlize(text)}</p>" for text in BROWSER_MAPPED_HOSTS)
    serve_page(page, post, f"<!doctype html><meta charset=utf-8>{body}")
    page.goto(post)
    hrefs = page.eval_on_selector_all("p", "ps => ps.map(p => p.querySelector('a').href)")
    followed = [urlsplit(href).hostname for href in hrefs]
    found = [
        [urlsplit(browser_url(link)).hostname for link in find_links(text)]
        for text in BROWSER_MAPPED_HOSTS
    ]
    assert found == [[host] for host in followed]
    assert set(followed) == {"evil.top", "www.evil.top", "evil.com"}
