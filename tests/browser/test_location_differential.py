"""Where a redirect goes is what the browser makes of its Location, so that is what
the guard must judge. Chromium resolves a few thousand generated Location
spellings (`new URL(location, base)`, one batch); for each, the guard's answer
must fit where the browser goes: a listed destination is blocked, an unlisted
one passes, and a passed redirect, read by the browser as it is sent, still
goes nowhere listed and to the same place as before.

Whether the browser reaches a listed destination is decided here from the
browser's own result with the standard library (ipaddress for the host, the
path unescaped), never by the guard's code."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import unquote, urlsplit

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

from tests.support.spellings import location_spellings
from tests.support.webfakes import SetFilter
from urlguard.hotpath.canonical import canonicalize
from urlguard.hotpath.guard import Guard
from urlguard.hotpath.middleware import RedirectGuardMiddleware
from urlguard.writepath.changes import add_rule

pytestmark = [pytest.mark.browser, pytest.mark.django_db]

SITE = "short.test"
# The page the redirect answers, as the browser sees it, and whether Django sees
# it as https: it does on an https page unless a proxy ends TLS and Django is not
# told (SECURE_PROXY_SSL_HEADER). Then the guard may read a Location another way
# than the browser; the rewritten Location must still take the browser where the
# guard looked.
PAGES = {
    "http page": (f"http://{SITE}/r/abc", False),
    "https page": (f"https://{SITE}/r/abc", True),
    "https page behind an unconfigured TLS proxy": (f"https://{SITE}/r/abc", False),
}

# The listed destinations. A rule covers the subdomains of its host.
LISTED_IPV4 = ipaddress.IPv4Address("203.0.113.7")
LISTED_IPV6 = ipaddress.IPv6Address("2001:db8::7")
LISTED_DOMAINS = ("spam.example", "xn--bcher-kva.example")
LISTED_PATH = ("evil.example", "/malware/")
RULES = (
    "203.0.113.7/",
    "[2001:db8::7]/",
    "spam.example/",
    "bücher.example/",
    "evil.example/malware/",
)

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _browser_targets(page, pairs: list[tuple[str, str]]) -> list[str | None]:
    return page.evaluate(
        """pairs => pairs.map(([location, base]) => {
            try { return new URL(location, base).href; } catch (e) { return null; }
        })""",
        [list(pair) for pair in pairs],
    )


def listed(href: str | None) -> str | None:
    """Which listed destination the browser reaches at `href`, if any."""
    if href is None:
        return None
    parts = urlsplit(href)
    host = (parts.hostname or "").rstrip(".")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        elif address in _NAT64:
            address = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address is not None:
        return str(address) if address in (LISTED_IPV4, LISTED_IPV6) else None
    for domain in LISTED_DOMAINS:
        if host == domain or host.endswith("." + domain):
            return domain
    # What a server that decodes the path serves: "." and ".." revealed by decoding
    # resolved as the browser resolves them, runs of slashes as one.
    written = unquote(parts.path).split("/")[1:]
    segments: list[str] = []
    for segment in written:
        if segment == "..":
            if segments:
                segments.pop()
        elif segment != ".":
            segments.append(segment)
    if written and written[-1] in (".", ".."):
        segments.append("")
    path = re.sub("/+", "/", "/" + "/".join(segments))
    on_host = host == LISTED_PATH[0] or host.endswith("." + LISTED_PATH[0])
    if on_host and path.startswith(LISTED_PATH[1]):
        return LISTED_PATH[0] + LISTED_PATH[1]
    return None


def _has_scheme(location: str) -> bool:
    return re.match(r"[a-z]+:", location.strip(" \t").replace("\t", ""), re.I) is not None


def _same_place(href: str | None) -> str | None:
    try:
        return canonicalize(href) if href is not None else None
    except ValueError:
        return "refused"


def guard_answers(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(what the guard did, the Location it sent) for each (location, page)."""
    factory = RequestFactory()
    answers = []
    for location, page in pairs:
        request = factory.get("/r/abc", HTTP_HOST=SITE, secure=PAGES[page][1])
        response = HttpResponse(status=302)
        response["Location"] = location
        result = RedirectGuardMiddleware(lambda r, response=response: response).guard_response(
            request, response
        )
        if result.status_code == 302:
            answers.append(("passed", result["Location"]))
        else:
            answers.append((getattr(result, "kind", "refused"), ""))
    return answers


@pytest.fixture
def listed_rules(use_guard, monkeypatch, settings):
    settings.ALLOWED_HOSTS = [SITE]
    fake = SetFilter()
    use_guard(Guard(lambda: fake))
    for text in RULES:
        fake.add(add_rule(text, category="malware", source="test").expression)

    def page_kind(request, *, kind, **kwargs):
        response = HttpResponse(status=403)
        response.kind = "blocked" if kind == "rule" else "refused"
        return response

    # The page's words are tested elsewhere; here only the decision counts.
    monkeypatch.setattr("urlguard.hotpath.middleware.warning_response", page_kind)


def test_the_guard_judges_where_the_browser_goes(page, listed_rules):
    locations = location_spellings()
    assert len(locations) > 2000
    # Behind the proxy only a scheme can be read otherwise: those spellings there.
    pairs = [
        (location, name)
        for location in locations
        for name in PAGES
        if PAGES[name][1] or name == "http page" or _has_scheme(location)
    ]
    reached = _browser_targets(page, [(loc, PAGES[name][0]) for loc, name in pairs])
    answers = guard_answers(pairs)
    sent = [(loc, PAGES[name][0]) for (_, loc), (_, name) in zip(answers, pairs, strict=True)]
    reached_as_sent = _browser_targets(page, sent)

    wrong = []
    for (location, base), href, (answer, sent_location), href_sent in zip(
        pairs, reached, answers, reached_as_sent, strict=True
    ):
        target = listed(href)
        if answer == "passed" and listed(href_sent):
            wrong.append(f"{location!r} on {base}: sent as {sent_location!r}, reaches {href_sent}")
        elif not PAGES[base][1] and PAGES[base][0].startswith("https"):
            continue  # the guard cannot know the page's scheme: only the above holds
        elif target and answer != "blocked":
            wrong.append(f"{location!r} on {base}: the browser reaches {href}, the guard {answer}")
        elif answer == "blocked" and href is not None and not target:
            wrong.append(f"{location!r} on {base}: {href} is not listed, the guard blocked it")
        elif (
            answer == "passed" and href is not None and _same_place(href_sent) != _same_place(href)
        ):
            wrong.append(f"{location!r} on {base}: went to {href}, sent to {href_sent}")
    assert not wrong, f"{len(wrong)} of {len(pairs)} disagree:\n" + "\n".join(wrong[:40])
