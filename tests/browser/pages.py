"""Pages of a host site in Chromium for the link tests: where a browser takes an href
(its own URL parser), and a page holding links, served at a URL of the live
server, clicked, with every request the browser makes off the site recorded and
refused (no test may reach the network, and a request off the site is what the
tests look for)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit


def browser_resolves(page: Any, pairs: list[tuple[str, str]]) -> list[str | None]:
    """Chromium's `new URL(href, page).href` for each (href, page URL); None where
    it refuses the link."""
    return page.evaluate(
        """pairs => pairs.map(([href, base]) => {
            try { return new URL(href, base).href; } catch (e) { return null; }
        })""",
        [list(pair) for pair in pairs],
    )


def serve_page(page: Any, url: str, body: str) -> list[str]:
    """Serve `body` (HTML) at `url`; returns the list that collects each request the
    browser then makes to a host other than `url`'s (each refused)."""
    own = urlsplit(url).netloc
    off_site: list[str] = []

    def route(request_route: Any) -> None:
        request = request_route.request
        if request.url.split("#", 1)[0] == url:
            request_route.fulfill(status=200, content_type="text/html; charset=utf-8", body=body)
        elif urlsplit(request.url).netloc == own:
            request_route.continue_()
        else:
            off_site.append(request.url)
            request_route.abort()

    page.route("**/*", route)
    return off_site


def click_on_page(page: Any, url: str, href: str) -> tuple[Any, list[str]]:
    """Serve a page at `url` with one link (its href set exactly, by script), click
    it; returns (the response the click navigated to, the off-site requests)."""
    off_site = serve_page(page, url, '<!doctype html><a id="link">the link</a>')
    page.goto(url)
    page.eval_on_selector("#link", "(a, href) => a.setAttribute('href', href)", href)
    with page.expect_navigation() as navigation:
        page.click("#link")
    return navigation.value, off_site
