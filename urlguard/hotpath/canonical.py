"""URL canonicalization and roll-up expressions, after Google Safe Browsing v4
("URLs and Hashing"): the lookup keys of every redirect check and the form every
spam rule is stored in (`example.com/`, `example.com/path/`, ...).

`canonicalize(url)` passes the Safe Browsing test list verbatim. Where the
published rules leave room, we side with what a browser would actually fetch,
because a guard that reads a URL differently from the browser can be walked
around:

* Structure (scheme, authority, path, query) is read from the raw text before
  percent-unescaping, as a browser does. Safe Browsing unescapes the whole URL
  first, so `http://good.com%2F@evil.com/` would look like good.com to it while
  the browser goes to evil.com. Characters that unescaping reveals in the host
  and that would change the structure on a second reading (`/ ? @ \\ : [ ]`)
  stay escaped, which keeps `canonicalize` idempotent.
* After `http:` any run of `/` and `\\` introduces the host (`http:/x`,
  `http:\\\\x`, `http:///x` all go to x, as in every browser); a backslash in
  the path is a slash. A backslash that unescaping reveals in the path stays
  escaped as `%5C` (what the browser sends).
* Dot segments are resolved as the browser resolves them, first in the raw path
  (where `%2e` is a dot) and again after unescaping: `a/b/..` is `a/`, and `..`
  after an empty segment removes that empty segment (`/a//../b` is `/a/b`,
  where the browser goes), before runs of slashes collapse.
* Hosts are read as the WHATWG URL Standard reads them: a host whose last label
  is a number is an IPv4 address, in any radix, with a bare `0x` meaning 0; if
  it is not a valid one (a part out of range, too many parts, `08`) the browser
  refuses the URL, and so do we, because the wrapped address we would otherwise
  compute is a key the browser never reaches. IPv4-mapped (`::ffff:0:0/96`) and
  NAT64 well-known-prefix (`64:ff9b::/96`) IPv6 addresses are the IPv4 host
  they carry.
* A non-ASCII host longer than DNS allows once IDNA-mapped (253 characters, 63
  in a label) is refused: no browser reaches it, and refusing bounds the
  Punycode work, quadratic in a label's length.
* Text without a scheme needs a plausible host, one without spaces: `not a url`
  is not `http://not%20a%20url/`.
* Ports and userinfo are dropped; only http and https are accepted; input
  without a scheme is taken as http (`www.google.com/`).

A `str` is read as UTF-8, except that C1 control characters (U+0080-U+009F)
stand for the bytes 0x80-0x9F: they never occur in text a person types, and do
occur where bytes were decoded as Latin-1 (WSGI, or the reference list's
`"http://\\x01\\x80.com/"`). `bytes` are taken as they are.

Work is linear in the input: no regular expression here can backtrack more
than a bounded amount, repeated unescaping finishes in one pass however deeply
`%25` is nested, and input longer than MAX_URL_LENGTH is refused.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
from collections import OrderedDict
from collections.abc import Iterable
from typing import NamedTuple
from urllib.parse import unquote_to_bytes

import idna
import numpy as np

__all__ = [
    "MAX_URL_LENGTH",
    "MAX_HOST_LABELS",
    "MAX_PATH_PREFIXES",
    "BrowserTarget",
    "ExpandedBatch",
    "browser_target",
    "browser_url",
    "canonicalize",
    "expand_many",
    "expressions",
    "expressions_of",
    "CanonicalURL",
    "canonical_url",
    "split_expression",
]

# Longer input is refused with a ValueError. Browsers follow longer URLs (Chrome up
# to 2 MiB), but no common server takes a request line this long (Apache and nginx
# stop at 8 KB, IIS at 16 KB), so no real destination is lost; and a refusal cannot
# pass a listed URL padded past the limit: the middleware shows the warning page
# for a destination it cannot read. It bounds the work of every entry point (the
# redirect, /api/check, imports, previews) to milliseconds.
MAX_URL_LENGTH = 32 * 1024

# DNS limits (RFC 1035): a longer host or label is no name any browser can reach.
MAX_HOST_NAME = 253
MAX_HOST_LABEL = 63

# Expressions: the exact host plus suffixes made from at most its last 5 labels,
# and at most 4 path prefixes ("/" and up to 3 directories).
MAX_HOST_LABELS = 5
MAX_PATH_PREFIXES = 4

# Recently seen URLs and their parts: popular destinations repeat. A memo only
# (the same input always reads the same): the guard is handed the parts it checks
# (browser_target, canonical_url) and asks for nothing twice. Bounded in entries
# and in the length of what it keeps.
_CACHE_ENTRIES = 4096
_CACHE_MAX_URL = 1024

_SCHEME_RE = re.compile(rb"([A-Za-z][A-Za-z0-9+.\-]*):")
# "host:8080/..." is a host and port, not a scheme called "host" (as in the
# reference implementation).
_PORT_RE = re.compile(rb":[0-9]+(?:[/\\?]|$)")
# authority, path, query (None without a '?'): the browser's split, on raw text.
_PARTS_RE = re.compile(rb"([^/\\?]*)([^?]*)(?:\?(.*))?", re.DOTALL)
_C0_AND_SPACE = bytes(range(0x21))
_C1_RE = re.compile(rb"\xc2([\x80-\x9f])")
_LEADING_SCHEME_ESCAPED_RE = re.compile(rb"https?(?:%3[aA]|:)", re.IGNORECASE)

# A host name needing no work but lower-casing: letters, digits, '-' and '_' in
# labels, single dots between them, a last label that does not start with a digit.
_PLAIN_HOST_RE = re.compile(rb"(?:[A-Za-z0-9_\-]+\.)*[A-Za-z_\-][A-Za-z0-9_\-]*")
# One part of an IPv4 host as the WHATWG URL Standard reads it: hex after "0x" (a
# bare "0x" is 0), octal after a leading "0", else decimal. The alternatives
# cannot overlap, so matching never backtracks.
_IPV4_NUMBER_RE = re.compile(rb"0[xX]([0-9A-Fa-f]*)|0([0-7]*)|([1-9][0-9]*)")
_IPV4_TOO_BIG = 1 << 40
# IPv6 prefixes that carry an IPv4 destination in their last 32 bits: mapped
# addresses (the OS connects to the IPv4 host), and NAT64's well-known prefix
# (RFC 6052; on an IPv6-only network it reaches the IPv4 host, elsewhere
# nothing). The network-specific 64:ff9b:1::/48 is not translated everywhere
# and 6to4 embeds a gateway, not the destination: those stay IPv6.
_IPV4_IN_IPV6 = (
    ipaddress.IPv6Network("::ffff:0:0/96"),
    ipaddress.IPv6Network("64:ff9b::/96"),
)
# The Windows resolver takes "10.192.95.89 xy" as 10.192.95.89 (up to 15 chars).
_IPV4_TRAILING_JUNK_RE = re.compile(rb"([0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}) ")
_DIGITS = frozenset(b"0123456789")
_OCTET = rb"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED_QUAD_RE = re.compile(_OCTET + rb"(?:\." + _OCTET + rb"){3}")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_AN_ESCAPE_RE = re.compile(rb"%[0-9A-Fa-f]{2}")
# Per byte: its hex value, or 255 if it is no hex digit (for _unescape_round).
_HEX_LOOKUP = np.full(256, 255, dtype=np.uint8)
for _c in b"0123456789abcdefABCDEF":
    _HEX_LOOKUP[_c] = int(chr(_c), 16)
# Above this many bytes one round of unescaping is done by numpy, not a Python step
# per '%' (unquote_to_bytes): a path of 10,000 "%25" costs 0.1 ms instead of 2 ms.
_VECTOR_FROM = 1024
_HEX_VALUE = {c: int(chr(c), 16) for c in _HEX}

# Label separators that UTS 46 maps to "." (ideographic and fullwidth full stops).
_IDN_DOTS_RE = re.compile("[.\u3002\uff0e\uff61]")


def _escape_table(extra: bytes) -> tuple[tuple[bytes, ...], re.Pattern[bytes]]:
    """Per-byte escapes and a pattern matching the bytes that need one: the Safe
    Browsing set (<= 0x20, >= 0x7f, '#', '%') plus `extra`."""
    special = set(range(0x21)) | set(range(0x7F, 0x100)) | set(b"#%") | set(extra)
    table = tuple(b"%%%02X" % b if b in special else bytes([b]) for b in range(256))
    chars = b"".join(b"\\x%02x" % b for b in sorted(special))
    return _with_text_table(table), re.compile(b"[" + chars + b"]")


def _with_text_table(table: tuple[bytes, ...]) -> tuple[bytes, ...]:
    _TEXT_TABLES[id(table)] = {b: e.decode("ascii") for b, e in enumerate(table) if len(e) > 1}
    return table


# id(byte table) -> the same escapes for str.translate (see _escape).
_TEXT_TABLES: dict[int, dict[int, str]] = {}
# Above this many bytes _escape translates in C instead of a call per escaped byte.
_TRANSLATE_FROM = 256


def _url_table(extra: bytes) -> tuple[tuple[bytes, ...], re.Pattern[bytes]]:
    """Like _escape_table for browser_url: what the URL Standard percent-encodes in
    a part (controls, space, non-ASCII and `extra`), leaving '%' and every escape
    as written."""
    special = set(range(0x21)) | set(range(0x7F, 0x100)) | set(extra)
    table = tuple(b"%%%02X" % b if b in special else bytes([b]) for b in range(256))
    chars = b"".join(b"\\x%02x" % b for b in sorted(special))
    return _with_text_table(table), re.compile(b"[" + chars + b"]")


_URL_PATH_TABLE, _URL_PATH_NEEDS_ESCAPE = _url_table(b'"#<>?`{}')
_URL_QUERY_TABLE, _URL_QUERY_NEEDS_ESCAPE = _url_table(b'"#<>')
_URL_FRAGMENT_TABLE, _URL_FRAGMENT_NEEDS_ESCAPE = _url_table(b'"<>`')
_QUERY_TABLE, _QUERY_NEEDS_ESCAPE = _escape_table(b"")
_PATH_TABLE, _PATH_NEEDS_ESCAPE = _escape_table(b"\\")
_HOST_TABLE, _HOST_NEEDS_ESCAPE = _escape_table(b"/?@\\:[]")
_IPV6_TABLE, _IPV6_NEEDS_ESCAPE = _escape_table(b"/?@\\")


class CanonicalURL(NamedTuple):
    """A canonical URL in parts. `path` starts with '/'; `query` is None when the
    URL has no '?' (and "" for a bare '?'); `is_ip` for IPv4 and IPv6 hosts."""

    scheme: str
    host: str
    path: str
    query: str | None
    is_ip: bool

    def __str__(self) -> str:
        if self.query is None:
            return f"{self.scheme}://{self.host}{self.path}"
        return f"{self.scheme}://{self.host}{self.path}?{self.query}"


def canonicalize(url: str | bytes) -> str:
    """The canonical form of `url`, e.g. "http://www.GOOgle.com:80/a/../b#x" ->
    "http://www.google.com/b". Raises ValueError (with the reason) for anything that
    is not a usable http(s) URL."""
    return str(canonical_url(url))


def expressions(url: str | bytes) -> list[str]:
    """The Safe Browsing host-suffix x path-prefix expressions of `url`, most
    specific first: for "http://a.b.c/1/2.html?param=1" that is
    a.b.c/1/2.html?param=1, a.b.c/1/2.html, a.b.c/, a.b.c/1/, then the same for b.c.
    Hosts: the exact host, then up to 4 suffixes of its last 5 labels, never the
    last label alone, none for an IP address. Paths: path with query, path, then
    "/" and up to 3 directories. Raises ValueError like canonicalize."""
    return expressions_of(canonical_url(url))


def expressions_of(parts: CanonicalURL) -> list[str]:
    """expressions() of a URL already read (canonical_url, browser_target)."""
    out: list[str] = []
    _add_expressions(parts.host, parts.path, parts.query, parts.is_ip, out)
    return out


def _add_expressions(host: str, path: str, query: str | None, is_ip: bool, out: list[str]) -> None:
    """Append the expressions of the canonical URL in these parts to `out`."""
    if path == "/":
        paths = [f"/?{query}", "/"] if query else ["/"]
    else:
        paths = [f"{path}?{query}", path, "/"] if query else [path, "/"]
        # "/" is the first prefix; then each directory, up to MAX_PATH_PREFIXES in
        # all, never the whole path (it is already listed).
        end = path.find("/", 1)
        found = 1
        last = len(path) - 1
        while end != -1 and end != last and found < MAX_PATH_PREFIXES:
            paths.append(path[: end + 1])
            found += 1
            end = path.find("/", end + 1)
    out += [host + p for p in paths]
    if is_ip or "." not in host:
        return
    labels = host.split(".")
    count = len(labels)
    for i in range(max(1, count - MAX_HOST_LABELS), count - 1):
        suffix = ".".join(labels[i:])
        out += [suffix + p for p in paths]


class ExpandedBatch(NamedTuple):
    """Many URLs read at once (expand_many). For the URL at index i: `canonical[i]`
    ("" when it could not be read, and then `errors[i]` says why) and its
    expressions `exprs[starts[i]:starts[i + 1]]`, in expressions()'s order."""

    canonical: list[str]
    errors: dict[int, str]
    exprs: list[str]
    starts: list[int]


def expand_many(urls: Iterable[str | bytes]) -> ExpandedBatch:
    """canonicalize() and expressions() of many URLs, each read once, their
    expressions in one flat list (no list per URL). A batch's URLs are mostly
    distinct, so the memo is neither asked nor filled: it would cost more than it
    saves. A URL that canonicalize() refuses gets its ValueError's text in
    `errors` and no expressions."""
    canonical: list[str] = []
    errors: dict[int, str] = {}
    exprs: list[str] = []
    starts = [0]
    add_canonical = canonical.append
    add_start = starts.append
    simple = _SIMPLE_URL_RE.fullmatch
    limit = MAX_URL_LENGTH
    for i, url in enumerate(urls):
        # _parse, inline: a simple URL's parts and text without a CanonicalURL.
        match = simple(url) if type(url) is str and len(url) <= limit else None
        if match is not None:
            scheme, host, path, query = match.groups()
            host = host.lower()
            path = path or "/"
            is_ip = False
            if query is None:
                add_canonical(f"{scheme}://{host}{path}")
            else:
                add_canonical(f"{scheme}://{host}{path}?{query}")
        else:
            try:
                parts = _canonical_parts(_read(url))
            except ValueError as exc:
                errors[i] = str(exc)
                add_canonical("")
                add_start(len(exprs))
                continue
            scheme, host, path, query, is_ip = parts
            add_canonical(str(parts))
        _add_expressions(host, path, query, is_ip, exprs)
        add_start(len(exprs))
    return ExpandedBatch(canonical, errors, exprs, starts)


def split_expression(expression: str) -> tuple[str, str]:
    """ "host/path?query" -> ("host", "/path?query")."""
    slash = expression.find("/")
    if slash == -1:
        return expression, "/"
    return expression[:slash], expression[slash:]


# An OrderedDict: dropping the oldest entry of a plain dict gets slower with every
# deletion (its iterator walks over the holes left at the front).
_cache: OrderedDict[object, CanonicalURL] = OrderedDict()
_browser_cache: OrderedDict[str, BrowserTarget] = OrderedDict()


def canonical_url(url: str | bytes) -> CanonicalURL:
    """canonicalize(url), in parts."""
    key = url if isinstance(url, str) and len(url) <= _CACHE_MAX_URL else None
    if key is not None:
        parts = _cache.get(key)
        if parts is not None:
            return parts
    parts = _parse(url)
    if key is not None:
        _remember(key, parts)
    return parts


# A URL that needs none of the reading's work: an explicit lower-case http(s)
# scheme, a plain host name (_PLAIN_HOST_RE: no port, userinfo, escape, IP
# address or stray dot), a path of non-empty segments none starting with a dot
# (so no dot segment and no run of slashes), and path and query of printable
# ASCII without '%' or a backslash (so nothing to unescape or escape). Its canonical
# parts are its own text, the host lower-cased. No part can backtrack: each
# repetition starts at a character the one before cannot take.
_SIMPLE_URL_RE = re.compile(
    r"(https?)://(" + _PLAIN_HOST_RE.pattern.decode("ascii") + ")"
    # Segments: printable ASCII but # % / ? and backslash, the first not a dot either.
    r"((?:/[!-\"$&-\-0->@-\[\]-~][!-\"$&-.0->@-\[\]-~]*)*/?)"
    # The query: printable ASCII but # %.
    r"(?:\?([!-\"$&-~]*))?"
    r"(?:#.*)?",
    re.DOTALL,
)


def _parse(url: str | bytes) -> CanonicalURL:
    """_canonical_parts(_read(url)), without the reading's work for a simple URL."""
    if type(url) is str and len(url) <= MAX_URL_LENGTH:
        match = _SIMPLE_URL_RE.fullmatch(url)
        if match is not None:
            scheme, host, path, query = match.groups()
            return CanonicalURL(scheme, host.lower(), path or "/", query, False)
    return _canonical_parts(_read(url))


def _remember(url: str, parts: CanonicalURL) -> None:
    # Oldest out first (another thread may empty the cache meanwhile: then there
    # is nothing left to drop).
    with contextlib.suppress(KeyError):
        while len(_cache) > _CACHE_ENTRIES - 1:
            _cache.popitem(last=False)
    _cache[url] = parts


def _short(data: bytes) -> str:
    text = data.decode("utf-8", "backslashreplace")
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _to_bytes(url: str | bytes) -> bytes:
    if isinstance(url, str):
        if url.isascii():
            return url.encode("ascii")
        data = url.encode("utf-8", "surrogatepass")
        return _C1_RE.sub(rb"\1", data) if b"\xc2" in data else data
    if isinstance(url, (bytes, bytearray, memoryview)):
        return bytes(url)
    raise TypeError(f"a URL must be str or bytes, not {type(url).__name__}")


class _Reading(NamedTuple):
    """A URL as the browser reads it, before Safe Browsing's unescaping: the
    canonical host, the port's digits (b"" for none), the path with backslashes
    as slashes and dot segments resolved, the query and fragment as written."""

    scheme: str
    host: str
    is_ip: bool
    port: bytes
    path: bytes
    query: bytes | None
    fragment: bytes | None


def _read(url: str | bytes) -> _Reading:
    if len(url) > MAX_URL_LENGTH:
        raise ValueError(
            f"URL is {len(url):,} characters long; the limit is {MAX_URL_LENGTH:,} "
            "(no web server takes a longer one)"
        )
    raw = _to_bytes(url)
    data, hash_mark, fragment = raw.translate(None, b"\t\r\n").partition(b"#")
    # Leading and trailing C0 controls and spaces, as browsers strip them.
    data = data.strip(_C0_AND_SPACE)
    if not data:
        raise ValueError("empty URL" if not raw.strip() else f"no host in {_short(raw)}")

    scheme, rest, explicit = _split_scheme(data, raw)
    authority, path, query = _PARTS_RE.fullmatch(rest).groups()  # type: ignore[union-attr]

    host, is_ip, port = _canonical_host(authority, raw)
    if not explicit and b" " in authority:
        # Without a scheme, words are words ("not a url"), not the host
        # "not%20a%20url". (With one, "http:// leadingspace.com/" is still read
        # as Safe Browsing reads it.)
        raise ValueError(f"{_short(raw)} is not a URL: no scheme and no plausible host")

    if b"\\" in path:
        path = path.replace(b"\\", b"/")
    if b"/." in path or b"/%2" in path:
        # The browser resolves dot segments before anything is unescaped, so
        # "/a/..%2Fb/../c" goes to /a/c (not /c).
        path = _browser_dot_segments(path, escaped=True)
    return _Reading(
        scheme,
        host,
        is_ip,
        port,
        path,
        query,
        fragment.rstrip(_C0_AND_SPACE) if hash_mark else None,
    )


def _canonical_parts(reading: _Reading) -> CanonicalURL:
    path, query = reading.path, reading.query
    if path:
        if b"%" in path:
            path = _unescape(path)
            if b"?" in path:
                # An escaped '?' is a query delimiter once unescaped (as in Safe
                # Browsing): split here so the output reads back the same way.
                path, _, revealed = path.partition(b"?")
                query = revealed if query is None else revealed + b"?" + query
        if b"/." in path or b"//" in path:
            path = _collapse_slashes(_browser_dot_segments(path, escaped=False))
        path_text = _escape(path, _PATH_TABLE, _PATH_NEEDS_ESCAPE)
    else:
        path_text = "/"

    query_text = None
    if query is not None:
        if b"%" in query:
            query = _unescape(query)
        query_text = _escape(query, _QUERY_TABLE, _QUERY_NEEDS_ESCAPE)

    return CanonicalURL(reading.scheme, reading.host, path_text, query_text, reading.is_ip)


_DEFAULT_PORTS = {"http": 80, "https": 443}


class BrowserTarget(NamedTuple):
    """browser_target()'s answer: where to send the browser, and what to check."""

    url: str
    canonical: CanonicalURL


def browser_url(url: str | bytes) -> str:
    """The absolute URL to send a browser in place of `url`: it goes exactly where
    canonicalize(url) says, so that no difference between our reading and a
    browser's can remain. Scheme and host are the canonical ones (an IPv4 address
    as a dotted quad, a name in IDNA form); the port stays unless it is the
    default; userinfo goes; the path has its dot segments resolved as the browser
    would and keeps its escapes (the server gets what the link meant); query and
    fragment stay as written. Characters a browser would escape are escaped.
    canonicalize(browser_url(url)) == canonicalize(url). Raises ValueError like
    canonicalize, and for a port beyond 65535 (a browser refuses it)."""
    return browser_target(url).url


def browser_target(url: str | bytes) -> BrowserTarget:
    """browser_url(url) and canonical_url(url) from one reading of `url`: the guard
    checks `canonical` and the browser is sent to `url`, the same destination
    (canonical_url(browser_url(u)) == canonical_url(u)). Raises ValueError like
    browser_url."""
    key = url if isinstance(url, str) and len(url) <= _CACHE_MAX_URL else None
    if key is not None:
        cached = _browser_cache.get(key)
        if cached is not None:
            return cached
    reading = _read(url)
    netloc = reading.host
    if reading.port:
        port = int(reading.port) if len(reading.port) <= 6 else 1 << 20
        if port > 65535:
            raise ValueError(f"port {reading.port.decode('ascii')} is out of range")
        if port != _DEFAULT_PORTS[reading.scheme]:
            netloc += f":{port}"
    parts = [
        reading.scheme,
        "://",
        netloc,
        _escape(reading.path, _URL_PATH_TABLE, _URL_PATH_NEEDS_ESCAPE) if reading.path else "/",
    ]
    if reading.query is not None:
        parts += ["?", _escape(reading.query, _URL_QUERY_TABLE, _URL_QUERY_NEEDS_ESCAPE)]
    if reading.fragment is not None:
        parts += ["#", _escape(reading.fragment, _URL_FRAGMENT_TABLE, _URL_FRAGMENT_NEEDS_ESCAPE)]
    target = BrowserTarget("".join(parts), _canonical_parts(reading))
    if key is not None:
        with contextlib.suppress(KeyError):
            while len(_browser_cache) > _CACHE_ENTRIES - 1:
                _browser_cache.popitem(last=False)
        _browser_cache[key] = target
    return target


def _split_scheme(data: bytes, raw: bytes) -> tuple[str, bytes, bool]:
    """-> (scheme, the text after "scheme:" and its slashes, whether a scheme or
    "//" was written)."""
    # The common spellings first: no regex, and nothing after "//" can be a port.
    if data.startswith(b"https://"):
        return "https", data[8:].lstrip(b"/\\"), True
    if data.startswith(b"http://"):
        return "http", data[7:].lstrip(b"/\\"), True
    match = _SCHEME_RE.match(data)
    if match is not None and _PORT_RE.match(data, match.end() - 1) is None:
        scheme = match.group(1).lower()
        if scheme not in (b"http", b"https"):
            raise ValueError(
                f"{_short(raw)} uses the {scheme.decode('ascii', 'replace')}: scheme; "
                "only http and https URLs can be checked"
            )
        return scheme.decode("ascii"), data[match.end() :].lstrip(b"/\\"), True
    if data[:1] in (b"/", b"\\"):
        if data[1:2] in (b"/", b"\\"):  # "//host/path": scheme-relative
            return "http", data.lstrip(b"/\\"), True
        raise ValueError(f"no host in {_short(raw)}: it is only a path")
    if b"%" in data and _LEADING_SCHEME_ESCAPED_RE.match(data):
        # "http%3A%2F%2Fhost/" (a pasted, fully escaped URL): read it unescaped,
        # as Safe Browsing does. A browser never sees this form from us: the
        # middleware resolves relative Locations before they get here.
        unescaped = _unescape(data)
        if unescaped[:7].lower() == b"http://" or unescaped[:8].lower() == b"https://":
            return _split_scheme(unescaped, raw)
    return "http", data, False


def _canonical_host(authority: bytes, raw: bytes) -> tuple[str, bool, bytes]:
    """-> (canonical host, whether it is an IP address, the port's digits)."""
    if _PLAIN_HOST_RE.fullmatch(authority) is not None:
        # The usual case, a plain name: nothing to strip, unescape, map or escape,
        # and it cannot be an IPv4 address (its last label starts with no digit).
        return authority.lower().decode("ascii"), False, b""
    host = authority.rpartition(b"@")[2]  # userinfo is dropped
    if host[:1] == b"[":
        close = host.find(b"]")
        if close == -1:
            raise ValueError(f"no ']' closing the IPv6 address in {_short(raw)}")
        port = host[close + 1 :]
        host = host[: close + 1]
    else:
        host, colon, port = host.rpartition(b":")
        if not colon:
            host, port = port, b""
        else:
            port = colon + port
    if port and (port[:1] != b":" or not all(c in _DIGITS for c in port[1:])):
        raise ValueError(f"invalid port {port[1:].decode('utf-8', 'replace')!r} in {_short(raw)}")
    port = port[1:]

    if b"%" in host:
        host = _unescape(host)
    if not host.isascii():
        host = _idna_host(host)
        if b"%" in host:
            # IDNA moved or dropped characters around a '%' (Punycode gathers the
            # ASCII ones), which could make a new escape: no browser takes a '%'
            # in a host it decoded, and our output would read back differently.
            raise ValueError(f"the host in {_short(raw)} has a '%' that is no escape")
    if host[:1] == b"." or host[-1:] == b"." or b".." in host:
        host = b".".join(label for label in host.split(b".") if label)
    if not host:
        raise ValueError(f"no host in {_short(raw)}")
    # Only now, after whatever unescaping, mapping and dot-trimming revealed: the
    # output must read back as the same kind of host.
    if host[:1] == b"[" and host[-1:] == b"]":
        try:
            address = ipaddress.IPv6Address(host[1:-1].decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            raise ValueError(f"invalid IPv6 address in {_short(raw)}") from None
        for network in _IPV4_IN_IPV6:
            if address in network:
                return str(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)), True, port
        text = f"[{address.compressed}]".encode("ascii")
        return _escape(text, _IPV6_TABLE, _IPV6_NEEDS_ESCAPE), True, port
    last_label = host[host.rfind(b".") + 1 :]
    if last_label[:1] in _DIGITS_BYTES:  # only then can it end in a number
        ipv4 = _parse_ipv4(host, raw)
        if ipv4 is not None:
            return ipv4, True, port
    return _escape(host.lower(), _HOST_TABLE, _HOST_NEEDS_ESCAPE), False, port


_DIGITS_BYTES = frozenset(bytes([c]) for c in b"0123456789")


def _escape(data: bytes, table: tuple[bytes, ...], needs_escape: re.Pattern[bytes]) -> str:
    # Only the bytes that need it go through Python; the rest is copied in C. A long
    # input (maybe all escapes: "%%%%...") is translated in C, whatever it holds.
    if len(data) > _TRANSLATE_FROM:
        return data.decode("latin-1").translate(_TEXT_TABLES[id(table)])
    if needs_escape.search(data) is not None:
        data = needs_escape.sub(lambda match: table[match.group()[0]], data)
    return data.decode("ascii")


def _unescape(data: bytes) -> bytes:
    """Percent-unescape until no escape is left (Safe Browsing's "repeatedly").

    A few whole-string rounds (fast, in C) finish every real URL. Unescaping is
    confluent (no two escapes can overlap), so any order of decoding reaches the
    same end: hostile nesting ("%25252525...") is finished by one linear pass that
    decodes as soon as an escape is complete, instead of one round per level."""
    for _ in range(4):
        decoded = _unescape_round(data) if len(data) > _VECTOR_FROM else unquote_to_bytes(data)
        if len(decoded) == len(data):
            return data
        data = decoded
        # A search in C, not another round: unquote_to_bytes costs a Python step per
        # '%' even where none starts an escape ("%25%25..." leaves "%%...").
        if _AN_ESCAPE_RE.search(data) is None:
            return data
    return _unescape_linear(data)


def _unescape_round(data: bytes) -> bytes:
    """unquote_to_bytes(data), vectorised. Two escapes never overlap (an escape's
    second and third bytes are hex digits, never the '%' another starts with), so
    every escape of one left-to-right round is found at once."""
    raw = np.frombuffer(data, dtype=np.uint8)
    if len(raw) < 3:
        return unquote_to_bytes(data)
    high = _HEX_LOOKUP[raw[1:-1]]
    low = _HEX_LOOKUP[raw[2:]]
    starts = np.flatnonzero((raw[:-2] == 0x25) & (high != 255) & (low != 255))
    if not len(starts):
        return data
    out = raw.copy()
    out[starts] = high[starts] * 16 + low[starts]
    keep = np.ones(len(raw), dtype=bool)
    keep[starts + 1] = False
    keep[starts + 2] = False
    return out[keep].tobytes()


def _unescape_linear(data: bytes) -> bytes:
    out = bytearray()
    hexdigits = _HEX
    for byte in data:
        out.append(byte)
        while len(out) >= 3 and out[-3] == 0x25 and out[-2] in hexdigits and out[-1] in hexdigits:
            value = _HEX_VALUE[out[-2]] * 16 + _HEX_VALUE[out[-1]]
            del out[-3:]
            out.append(value)
    return bytes(out)


def _dot_segment(segment: bytes, escaped: bool) -> int:
    """2 for "..", 1 for ".", 0 otherwise; with `escaped`, "%2e" is a dot too (as the
    browser reads a raw path)."""
    if len(segment) > 6 or not segment:
        return 0
    if escaped and b"%" in segment:
        segment = segment.lower().replace(b"%2e", b".")
    if segment == b"..":
        return 2
    return 1 if segment == b"." else 0


def _browser_dot_segments(path: bytes, *, escaped: bool) -> bytes:
    """Resolve "." and ".." segments as the URL Standard does: ".." removes the
    segment before it even when that one is empty ("/a//.." is "/a/"), and a path
    ending in "." or ".." ends in a slash. Empty segments are kept."""
    segments = path.split(b"/")
    out: list[bytes] = []
    for segment in segments[1:]:
        kind = _dot_segment(segment, escaped)
        if kind == 2:
            if out:
                out.pop()
        elif kind == 0:
            out.append(segment)
    if _dot_segment(segments[-1], escaped):
        out.append(b"")
    return b"/" + b"/".join(out)


def _collapse_slashes(path: bytes) -> bytes:
    """Runs of "/" as one (Safe Browsing), keeping the trailing slash."""
    if b"//" not in path:
        return path
    segments = path.split(b"/")
    result = b"/" + b"/".join(segment for segment in segments if segment)
    if segments[-1] == b"" and result != b"/":
        result += b"/"
    return result


def _parse_ipv4(host: bytes, raw: bytes) -> str | None:
    """Dotted-quad form of a host whose last label is a number, read as browsers
    read it (WHATWG URL Standard: decimal, octal, hex, a bare "0x" is 0, 1 to 4
    parts, "3279880203" -> "195.127.0.11"); None if the last label is no number
    (then it is a name). Raises ValueError where the browser refuses the URL: a
    part that is no number, more than 4 parts, a part out of range. Works part by
    part, in linear time."""
    if _DOTTED_QUAD_RE.fullmatch(host) is not None:  # already canonical: the usual case
        return host.decode("ascii")
    if len(host) <= 15:
        # The Windows resolver takes "10.192.95.89 xy" as 10.192.95.89 (Safe
        # Browsing reads it so; browsers refuse or never reach such a host).
        match = _IPV4_TRAILING_JUNK_RE.match(host)
        if match is not None:
            host = match.group(1)
    parts = host.split(b".")
    last = parts[-1]
    if not last.isdigit() and _ipv4_number(last) is None:
        return None
    numbers = [_ipv4_number(part) for part in parts]
    if len(parts) > 4 or None in numbers:
        raise ValueError(
            f"the host in {_short(raw)} ends in a number but is not a valid IPv4 address "
            "(browsers refuse it)"
        )
    values: list[int] = numbers  # type: ignore[assignment]
    if max(values[:-1], default=0) > 255 or values[-1] >= 256 ** (5 - len(values)):
        raise ValueError(
            f"the host in {_short(raw)} ends in a number but is not a valid IPv4 address: "
            "a part is out of range (browsers refuse it)"
        )
    address = values[-1]
    for shift, value in enumerate(values[:-1]):
        address += value << (8 * (3 - shift))
    return str(ipaddress.IPv4Address(address))


def _ipv4_number(part: bytes) -> int | None:
    match = _IPV4_NUMBER_RE.fullmatch(part)
    if match is None:
        return None
    hexadecimal, octal, decimal = match.groups()
    digits, base = (
        (hexadecimal, 16)
        if hexadecimal is not None
        else (octal, 8)
        if octal is not None
        else (decimal, 10)
    )
    digits = digits.lstrip(b"0")
    if not digits:
        return 0  # "0", "00", "0x"
    if len(digits) > 11:  # > 32 bits in any base; no huge int to parse
        return _IPV4_TOO_BIG
    return int(digits, base)


def _idna_host(host: bytes) -> bytes:
    """ASCII (IDNA, UTS 46 non-transitional) form of a non-ASCII host. A label that
    IDNA 2008 refuses (an underscore, a symbol) gets plain Punycode, as browsers do,
    so real-world hosts still canonicalize; a host that is not UTF-8 stays as bytes
    (escaped on output)."""
    try:
        text = host.decode("utf-8")
    except UnicodeDecodeError:
        return host
    return _idna_text(text)


def _idna_label(label: str) -> bytes:
    if label.isascii():
        return label.encode("ascii")
    try:
        mapped = idna.uts46_remap(label, std3_rules=False, transitional=False)
    except idna.IDNAError:
        mapped = label.lower()
    if len(mapped) > MAX_HOST_LABEL:
        # Its Punycode is longer still, so no browser reaches it; and Punycode
        # takes time quadratic in the label.
        raise ValueError(
            f"a host label is {len(mapped):,} characters long; DNS allows at most {MAX_HOST_LABEL}"
        )
    if mapped.isascii():
        return mapped.encode("ascii")
    try:
        return idna.alabel(mapped)
    except (idna.IDNAError, UnicodeError):
        return b"xn--" + mapped.encode("punycode")


_idna_cache: dict[str, bytes] = {}


def _idna_text(text: str) -> bytes:
    cached = _idna_cache.get(text)
    if cached is not None:
        return cached
    try:
        mapped = idna.uts46_remap(text, std3_rules=False, transitional=False)
    except idna.IDNAError:
        mapped = text  # map label by label below; a bad label falls back alone
    labels = [label for label in _IDN_DOTS_RE.split(mapped) if label]
    if sum(map(len, labels)) + len(labels) - 1 > MAX_HOST_NAME:
        raise ValueError(
            f"the host is {len(mapped):,} characters long; DNS allows at most {MAX_HOST_NAME}"
        )
    result = b".".join(_idna_label(label) for label in labels)
    if len(_idna_cache) >= _CACHE_ENTRIES:
        _idna_cache.clear()
    if len(text) <= _CACHE_MAX_URL:
        _idna_cache[text] = result
    return result
