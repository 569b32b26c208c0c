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
import itertools
import random
import re
from urllib.parse import quote, unquote, urlsplit

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

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


def _ipv4_spellings() -> list[str]:
    """203.0.113.7 (and its neighbours) in every radix and part count, a bare 0x for
    the zero part, leading zeros, upper-case X, a trailing dot; and the forms a
    browser refuses (parts out of range, five parts, no octal digit)."""
    hosts = set()
    rng = random.Random(7)

    def spell(value: int, radix: str) -> list[str]:
        out = []
        if radix == "dec":
            out.append(str(value))
        elif radix == "oct":
            out += ["0" + format(value, "o"), "00" + format(value, "o")]
        else:
            digits = format(value, "x")
            out += ["0x" + digits, "0X" + digits.upper(), "0x00" + digits]
            if value == 0:
                out.append("0x")
        return out

    for address in (0xCB007107, 0xCB007108, 0x7F000001):
        octets = [(address >> s) & 0xFF for s in (24, 16, 8, 0)]
        for parts in (1, 2, 3, 4):
            values = octets[: parts - 1] + [address & ((1 << (8 * (5 - parts))) - 1)]
            options = [
                [s for radix in ("dec", "oct", "hex") for s in spell(v, radix)] for v in values
            ]
            combos = list(itertools.product(*options))
            for combo in rng.sample(combos, min(len(combos), 60)):
                hosts.add(".".join(combo))
                if rng.random() < 0.2:
                    hosts.add(".".join(combo) + ".")
    hosts.update(
        [
            "203.0x.113.7",
            "0xcb.0x.0x71.0x7",
            "203.0.0x71.07",
            "0x100.0",
            "276.2.3",
            "1.2.3.256",
            "203.0.113.7.1",
            "203.0.113.08",
            "203.0.113.09",
            "203.256.113.7",
            "0xcb007107g",
            "203.0.113.7a",
            "4294967296",
        ]
    )
    return sorted(hosts)


IPV6_HOSTS = [
    "[::ffff:203.0.113.7]",
    "[::FFFF:CB00:7107]",
    "[0:0:0:0:0:ffff:cb00:7107]",
    "[::ffff:203.0.113.8]",
    "[64:ff9b::203.0.113.7]",
    "[64:ff9b::cb00:7107]",
    "[::203.0.113.7]",
    "[2001:db8::7]",
    "[2001:DB8:0:0:0:0:0:7]",
    "[2001:db8::0.0.0.7]",
    "[2001:db8::8]",
    "[::ffff:7f00:1]",
    "[2001:db8::7",
]

NAME_HOSTS = [
    "spam.example",
    "SPAM.Example",
    "www.spam.example",
    "spam.example.",
    "xspam.example",
    "spam.example.good.test",
    "sp%61m.example",
    "%73pam.example",
    "spam%2eexample",
    "bücher.example",
    "BÜCHER.example",
    "www.bücher.example",
    "xn--bcher-kva.example",
    "b%C3%BCcher.example",
    "bu\u0308cher.example",
    "\uff42\u00fccher\uff0eexample",
    "bücher\u3002example",
    "bucher.example",
    "evil.example",
    "EVIL.example",
    "cdn.evil.example",
    "good.example",
    "good.example@spam.example",
    "spam.example@good.example",
    "good.example%2F@spam.example",
    "spam.example:8080",
    "spam.example:80",
    "spam.example:99999",
]

PATHS = [
    "/",
    "/x",
    "/malware/x",
    "/malware//../payload.exe",
    "/a//../malware/x",
    "/malware/%2e%2E/x",
    "/malware/.%2e/x",
    "/malware/..%2Fx",
    "/x/..%2F../malware/y",
    "/malware/x/..%2F../../y",
    "/a/b//../../malware/z",
    "/%6Dalware/x",
    "/MALWARE/x",
    "\\malware\\x",
    "/x/../malware/",
    "/malware",
    "/malware/./x",
    "/a/%2F../malware/x",
    "?q=/malware/",
    "#/malware/",
]

PREFIXES = [
    "http://",
    "https://",
    "HTTP://",
    "//",
    "/\\",
    "\\\\",
    "http:",
    "https:",
    "http:/",
    "https:\\\\",
    "http:///",
    " http://",
    "\thttp://",
    "ht\ttp://",
]


def location_spellings() -> list[str]:
    """A few thousand, the same every run."""
    rng = random.Random(20261123)
    hosts = _ipv4_spellings() + IPV6_HOSTS + NAME_HOSTS
    out = set()
    for host in hosts:
        for prefix in ("http://", "https://"):
            out.add(f"{prefix}{host}/x")
        for prefix in rng.sample(PREFIXES, 3):
            out.add(f"{prefix}{host}{rng.choice(PATHS)}")
    for host in ("evil.example", "EVIL.example", "cdn.evil.example", "good.example"):
        for prefix in PREFIXES:
            for path in PATHS:
                out.add(f"{prefix}{host}{path}")
    # Relative references: on this site, whatever they look like.
    out.update(["/local", "../up", "?q=1", "spam.example/x", "./evil.example/malware/x"])
    for prefix in ("http:", "https:", "http:/", "HTTPS:", "http:\\"):
        out.update(
            f"{prefix}{host}/x" for host in ("spam.example", "203.0x.113.7", "[::ffff:cb00:7107]")
        )
    # As a header carries them: views send non-ASCII escaped as UTF-8 (Django's
    # redirects do; a raw one would leave MIME-encoded and mean a path here).
    return sorted({"".join(c if c.isascii() else quote(c, safe="") for c in o) for o in out})


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
