"""Link spellings the guard's tests and the browser tests share, so the guard is judged
on what a real browser makes of the same strings: hosts written with what the browser's
URL parser maps away, hrefs that leave the page however they are spelled, and a few
thousand generated redirect Locations."""

from __future__ import annotations

import itertools
import random
from urllib.parse import quote

# Hosts spelled with what the browser's URL parser maps away (IDNA's other full stops,
# code points it ignores, full-width letters): Django's urlize links each of these, and
# Chromium follows its href to that host (tests/browser/test_content_browser.py).
BROWSER_MAPPED_HOSTS = [
    "http://evil\u3002top/x",
    "http://evil\uff0etop/x",
    "http://evil\uff61top/x",
    "www.evil\u3002top/x",
    "http://ev\u200bil.top/x",
    "http://evil\u200b.top/x",
    "evil\u200b.com/x",
    "www.evil\u00ad.top",
    "see http://\uff45\uff56\uff49\uff4c\uff0e\uff54\uff4f\uff50/x now",
    "http://e%76il.top/x",
    "www.e%76il.top/x",
    "http://evil%E3%80%82top/x",
]

# Outbound hrefs however they are spelled (Chromium leaves the page for each:
# tests/browser/test_content_browser.py).
OUTBOUND = [
    "https://evil.example/x",
    "HTTPS://EVIL.EXAMPLE/x",
    "//evil.example/x",
    "\\\\evil.example/x",
    "/\\evil.example/x",
    "\\/evil.example/x",
    "\x01//evil.example/x",
    " //evil.example/x",
    "/\t/evil.example/x",
    "/\n/evil.example/x",
    "https:evil.example/x",
    "http:\\\\evil.example/x",
    "&#x2F;&#x2F;evil.example/x",
    "&#47;\\evil.example/x",
    "https://evil.example/" + "a" * 9000,
]


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
