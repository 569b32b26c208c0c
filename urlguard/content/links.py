"""The links in plain text: `find_links(text)` finds every link a reader could follow
in a post, a comment or a profile, as a site that linkifies text would render it.

The scan is linkify-it-py's (the parser markdown-it uses): full URLs in any letter
case, `www.` hosts, bare hosts with a path, IP addresses, IDN hosts, links inside
parentheses and before punctuation. The text is read as the browser reads a link
in HTML source and its host (character references decoded, escapes of a host's
characters unescaped, IDNA's other full stops as dots, the code points it ignores
dropped, "http:host" as "http://host"), so "http://evil\u3002top/" and
"http://e%76il.top/" are found as the links to evil.top they are. A bare host counts
on every top-level domain of the public suffix list publicsuffixlist ships
(`.top`, `.xyz`, `.click`, `.рф` ...), not on the linkifier's short default list,
which leaves out the ones spammers buy.
Text over CONTENT_MAX_CHARS is refused before any scan (TextTooLong), which bounds the
work one text can ask for: the scan is linear in the text.

Two things keep it fast (the linkifier's patterns cost about a microsecond a
character): only the words that could hold a link (a dot between two word
characters, or "//") are given to it, joined by spaces, which splits no link (none
holds a space) and changes no word's neighbour (a space was there); and the
top-level domains are one prefix tree of a pattern, not 1,600 alternatives tried in
turn."""

from __future__ import annotations

import functools
import html
import re
from pathlib import Path

import publicsuffixlist
from linkify_it import LinkifyIt

from urlguard.conf import conf

__all__ = ["TextTooLong", "find_links", "top_level_domains"]

_WEB = ("http://", "https://")
# A word that may hold a link: a host's dot between two word characters, or "//".
_MAY_LINK = re.compile(r"\w\.\w|//")
# What the browser's URL parser maps away in a host (UTS 46): IDNA's other full stops
# are dots, and the code points it ignores (soft hyphen, zero-width space, variation
# selectors ...) are dropped. Django's urlize links "www.evil\u3002top" and Chromium
# follows it to www.evil.top, so the scan reads the text as the host will be read.
_IGNORED = "\u00ad\u034f\u180b\u180c\u180d\u180f\u200b\u2060\u2064\ufeff"
_IGNORED_RANGES = ((0xFE00, 0xFE0F), (0x1BCA0, 0x1BCA3), (0xE0100, 0xE01EF))
_AS_THE_HOST_READS = {
    **dict.fromkeys(map(ord, "\u3002\uff0e\uff61"), "."),
    **dict.fromkeys(map(ord, _IGNORED)),
    **dict.fromkeys(c for low, high in _IGNORED_RANGES for c in range(low, high + 1)),
}
# A character reference as an HTML attribute decodes it: a numeric one, or a named
# one with its ";" ("&para=2" in a query stays as written).
_REFERENCE = re.compile(r"&(?:#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[A-Za-z][A-Za-z0-9]*;)")
# A run of escapes; those of what a host name holds (letters, digits, "-", ".", any
# non-ASCII) are read unescaped, as the browser reads a host and urlize writes one:
# "http://e%76il.top/" leads to evil.top. The guard's canonical form unescapes them
# in a path too, so unescaping one there changes no verdict.
_ESCAPES = re.compile(r"(?:%[0-9A-Fa-f]{2})+")


def _unescaped(match: re.Match[str]) -> str:
    try:
        text = bytes.fromhex(match.group().replace("%", "")).decode("utf-8")
    except UnicodeDecodeError:
        return match.group()
    if all(c.isalnum() or c in "-." if c.isascii() else not c.isspace() for c in text):
        return text
    return match.group()


# "http:evil.top/" and "https:/evil.top/": on a page of the other scheme the browser
# reads a host after them (urlguard.hotpath.hrefs), so they are read with "//". The
# pattern starts at the ":" so that the engine skips to each colon (4x faster).
_SCHEME_WITHOUT_SLASHES = re.compile(
    r":(?:(?<=\bhttp:)|(?<=\bhttps:))/?(?=[^/\\\s])", re.IGNORECASE
)

_MAPPED_AWAY = re.compile(
    "[\u3002\uff0e\uff61"
    + _IGNORED
    + "".join(f"{chr(low)}-{chr(high)}" for low, high in _IGNORED_RANGES)
    + "]"
)


class TextTooLong(ValueError):
    """The text is longer than CONTENT_MAX_CHARS: it is not scanned."""

    def __init__(self, length: int, most: int) -> None:
        super().__init__(
            f"the text is {length:,} characters long; at most {most:,} are checked for links "
            "(URLGUARD['CONTENT_MAX_CHARS'])"
        )
        self.length = length
        self.most = most


@functools.cache
def top_level_domains() -> list[str]:
    """Every top-level domain of the bundled public suffix list, as written there
    (Unicode for an IDN one) and in its xn-- form."""

    data = Path(publicsuffixlist.__file__).with_name("public_suffix_list.dat")
    found: set[str] = set()
    for line in data.read_text(encoding="utf-8").splitlines():
        rule = line.strip().lstrip("!*.")
        if not rule or rule.startswith("//"):
            continue
        tld = rule.rsplit(".", 1)[-1].lower()
        found.add(tld)
        if not tld.isascii():
            found.add(tld.encode("idna").decode("ascii"))
    return sorted(found)


def prefix_tree_pattern(words: list[str]) -> str:
    """A regular expression matching exactly `words`, as a prefix tree ("co", "com",
    "coop" -> "co(?:m|op)?"): the engine follows one branch per character instead of
    trying each word in turn."""
    root: dict[str, dict] = {}
    for word in words:
        node = root
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def pattern(node: dict[str, dict]) -> str:
        branches = [
            re.escape(char) + pattern(child) for char, child in sorted(node.items()) if char
        ]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return pattern(root)


@functools.cache
def _linkifier() -> LinkifyIt:
    # Email addresses are no links to a web page, and ftp: is followed by no browser.
    linkifier = LinkifyIt(options={"fuzzy_email": False, "fuzzy_ip": True})
    linkifier.add("ftp:", None).add("mailto:", None)
    return linkifier.tlds(prefix_tree_pattern(top_level_domains()), False)


def _web_url(url: str) -> str | None:
    """The link as an absolute http(s) URL; None for another scheme."""
    if url[:8].lower().startswith(_WEB):
        return url
    if url.startswith("//"):  # scheme-relative: what an https page makes of it
        return "https:" + url
    return None


def find_links(text: str) -> list[str]:
    """Every http(s) link in `text`, in order, each as an absolute URL (a bare host
    gets "http://", as a linkifying site renders it). Raises TextTooLong over
    CONTENT_MAX_CHARS."""
    text = str(text)
    most = conf.CONTENT_MAX_CHARS
    if len(text) > most:
        raise TextTooLong(len(text), most)
    if "&" in text:  # HTML and Markdown source: the browser reads the decoded URL
        text = _REFERENCE.sub(lambda m: html.unescape(m.group()), text)
    if "%" in text:
        text = _ESCAPES.sub(_unescaped, text)
    text = _SCHEME_WITHOUT_SLASHES.sub("://", text)
    if not text.isascii() and _MAPPED_AWAY.search(text):  # isascii: a flag, no scan
        text = text.translate(_AS_THE_HOST_READS)
    words = [word for word in text.split() if _MAY_LINK.search(word)]
    if not words:
        return []
    matches = _linkifier().match(" ".join(words)) or []
    links = []
    for match in matches:
        url = _web_url(match.url)
        if url is not None:
            links.append(url)
    return links
