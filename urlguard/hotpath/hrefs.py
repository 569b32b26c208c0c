"""Where a link takes the browser: an `<a href>` or a `Location`, read against the
page it is on the way a browser reads it (the WHATWG URL standard), not the way
RFC 3986 or urllib would. Attackers aim exactly at the difference: `//evil.example/`,
`\\\\evil.example/`, `/\\evil.example/`, `\\x01//evil.example/` and `https:evil.example`
all lead a browser to evil.example. The redirect guard, the link shim and
`guard_links` all judge a link by this one reading."""

from __future__ import annotations

import re
from typing import NamedTuple
from urllib.parse import urlsplit

__all__ = ["SCHEME", "SPACE_AND_C0", "Reading", "read_href", "where_href_goes"]

WEBSCHEMES = frozenset({"http", "https"})

SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
# What a browser strips before parsing a URL: leading and trailing C0 controls and
# spaces, and every tab and newline anywhere.
SPACE_AND_C0 = "".join(chr(c) for c in range(0x21))
_TAB_NEWLINE = str.maketrans("", "", "\t\r\n")
# The common case, an absolute http(s) URL whose host follows "//" directly and
# with nothing a browser would rewrite (controls, spaces, backslashes): it means
# exactly what it says. The host's class excludes '?' and '#' so that the pattern
# has one way to match (no backtracking).
_PLAIN_ABSOLUTE = re.compile(
    r"(https?)://[^/?#\\\x00-\x20\x7f]+(?:[/?#][^\\\x00-\x20\x7f]*)?\Z", re.ASCII
)


class Reading(NamedTuple):
    """A link as the browser reads it: its scheme, the absolute URL (not yet
    escaped: non-ASCII stays as written), and whether it names a host of its own
    (`leaves`) rather than a place on the page's host."""

    scheme: str
    url: str
    leaves: bool


def read_href(href: str, *, scheme: str, host: str, path: str = "/", query: str = "") -> Reading:
    """`href` on the page `scheme://host path?query`, as the browser resolves it.

    A relative path is joined to the page's directory as written: its dot segments
    are left to canonical.browser_url, which resolves them the browser's way
    (urljoin's RFC 3986 way differs after an empty segment). A scheme other than
    http(s) is returned with the link as it is (leaves False: no host is named).
    """
    plain = _PLAIN_ABSOLUTE.match(href)
    if plain and href.isascii():
        return Reading(plain.group(1), href, True)
    loc = href.strip(SPACE_AND_C0).translate(_TAB_NEWLINE)
    m = SCHEME.match(loc)
    if m:
        written = m.group(1).lower()
        if written not in WEBSCHEMES:
            return Reading(written, loc, False)
        # http(s) are special schemes: a backslash is a slash.
        rest = loc[m.end() :].replace("\\", "/")
        slashes = len(rest) - len(rest.lstrip("/"))
        if slashes >= 2 or written != scheme:
            # An authority follows; for another special scheme even without slashes.
            return Reading(written, f"{written}://{rest.lstrip('/')}", True)
        # `http:/x` or `http:x` on an http page: relative to the page, and the browser
        # reads what follows as a path even if it looks like another URL
        # (`http:evil.example:80/` or `http:http://[`).
        loc = rest
    else:
        loc = loc.replace("\\", "/")
        if loc.startswith("//"):
            return Reading(scheme, f"{scheme}://{loc.lstrip('/')}", True)
    if loc.startswith("/"):
        joined = loc
    elif loc.startswith("?"):
        joined = path + loc
    elif not loc or loc.startswith("#"):
        joined = path + (f"?{query}" if query else "") + loc
    else:
        joined = path[: path.rfind("/") + 1] + loc
    return Reading(scheme, f"{scheme}://{host}{joined}", False)


def where_href_goes(href: str, page: str) -> Reading:
    """`href` on the page at the absolute URL `page` (e.g. "https://site.example/a/b")."""
    parts = urlsplit(page)
    return read_href(
        href,
        scheme=parts.scheme.lower(),
        host=parts.netloc,
        path=parts.path or "/",
        query=parts.query,
    )
