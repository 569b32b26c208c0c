"""What a rule expression covers: the registrable domain of a host (from the public suffix
list that publicsuffixlist ships) and the roll-up level of an expression (domain,
subdomain, path or page). The warning page words a block by it; the write path refuses
and proposes rules by it."""

from __future__ import annotations

import functools
import re

from publicsuffixlist import PublicSuffixList

from urlguard.hotpath.canonical import MAX_PATH_PREFIXES, split_expression

_IPV4_RE = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}")


@functools.cache
def public_suffixes() -> PublicSuffixList:
    # Parsing the bundled list takes a few tens of milliseconds: once per process.
    return PublicSuffixList()


def is_ip(host: str) -> bool:
    return host[:1] == "[" or _IPV4_RE.fullmatch(host) is not None


def registrable_domain(host: str) -> str | None:
    """The registrable domain of a canonical host ("www.example.co.uk" ->
    "example.co.uk", "user.github.io" -> itself); the host itself for an IP
    address; None for a public suffix."""
    if is_ip(host):
        return host
    return public_suffixes().privatesuffix(host)


def is_directory_rule(path: str) -> bool:
    """A path ending in '/' that lookups roll up to ("/a/", up to "/a/b/c/")."""
    return path.endswith("/") and "?" not in path and path.count("/") <= MAX_PATH_PREFIXES


def rule_level(expression: str) -> str:
    """The roll-up level of a rule expression: "domain", "subdomain", "path" or
    "page" (a directory deeper than a lookup rolls up to only matches itself, so it
    is a page)."""
    host, path = split_expression(expression)
    if not host:
        raise ValueError(f"{expression!r} is not a rule expression: it has no host")
    if path == "/":
        domain = registrable_domain(host)
        return "domain" if domain is None or domain == host else "subdomain"
    if is_directory_rule(path):
        return "path"
    return "page"
