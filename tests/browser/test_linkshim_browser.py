"""The link shim in Chromium: for each spelling of a link to a listed host that the
browser follows straight there (scheme-relative, backslashes, a leading control
character, `https:host`, a link too long to sign), the shimmed link on a page,
clicked, reaches this site's shim and its warning (or refusal) page, and the
browser never asks the listed host for anything.

tests/browser/pages.py serves the page and records every request the browser makes
off the site; Chromium's own `new URL(href, page)` is the judge of where the bare
link would have gone, and of urlguard.hotpath.hrefs' reading of it."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

import urlguard
from tests.browser.pages import browser_resolves, click_on_page
from tests.support.spellings import location_spellings
from urlguard.hotpath.guard import reset_guard
from urlguard.hotpath.hrefs import where_href_goes
from urlguard.writepath.changes import add_rule

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LISTED = "evil.example"
SPELLINGS = [
    "https://evil.example/login",
    "//evil.example/login",
    "\\\\evil.example/login",
    "/\\evil.example/login",
    "\\/evil.example/login",
    "\x01//evil.example/login",
    " \t//evil.example/login",
    "/\n/evil.example/login",
    "///evil.example/login",
    "https:evil.example/login",
    "https:\\\\evil.example/login",
    "HTTPS://EVIL.EXAMPLE/login",
    "https://evil.example/login?" + "a" * 9000,
]


@pytest.fixture
def site(live_server, build_filter):
    add_rule(f"{LISTED}/", category="phishing", source="test")
    build_filter()
    reset_guard()
    yield live_server.url
    reset_guard()


@pytest.mark.parametrize("href", SPELLINGS, ids=lambda href: repr(href[:40]))
def test_a_shimmed_link_never_takes_the_browser_to_the_listed_host(page, site, href):
    post = f"{site}/post/1"
    bare = browser_resolves(page, [(href, post)])[0]
    # The spelling is real: bare, it takes Chromium to the listed host ...
    assert urlsplit(bare).hostname == LISTED, bare
    # ... where the app's own reading of the link says it goes.
    reading = where_href_goes(href, post)
    assert reading.leaves and browser_resolves(page, [(reading.url, post)])[0] == bare

    shimmed = urlguard.guarded_url(href)
    response, off_site = click_on_page(page, post, shimmed)
    assert off_site == [], f"the browser asked another host: {off_site}"
    assert urlsplit(page.url).path == "/go/"
    if len(href) > 8000:
        assert response.status == 400 and "too long" in page.content()
    else:
        assert response.status == 403
        assert page.locator(".card.danger").count() == 1
        assert LISTED in page.inner_text("body")


def test_where_a_link_leaves_for_agrees_with_chromium(page):
    """For the few thousand spellings of the redirect differential, on an http and an
    https page: a link the app reads as staying on the page's host stays there in
    Chromium, and one Chromium takes to another host the app reads as leaving, so
    the shim takes it."""
    pages = ("http://site.test/post/1", "https://site.test/post/1")
    pairs = [(href, base) for href in location_spellings() for base in pages]
    reached = browser_resolves(page, pairs)
    wrong = []
    for (href, base), href_reached in zip(pairs, reached, strict=True):
        if href_reached is None or not href_reached.startswith(("http:", "https:")):
            continue
        leaves_in_chromium = urlsplit(href_reached).netloc != "site.test"
        if leaves_in_chromium and not where_href_goes(href, base).leaves:
            wrong.append(f"{href!r} on {base}: Chromium goes to {href_reached}")
        if leaves_in_chromium and urlguard.guarded_url(href) == href:
            wrong.append(f"{href!r}: left unshimmed, Chromium goes to {href_reached}")
    assert len(pairs) > 4000
    assert not wrong, f"{len(wrong)} disagree:\n" + "\n".join(wrong[:30])
