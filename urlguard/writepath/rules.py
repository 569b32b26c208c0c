"""Spam rules: what a person pastes (a URL, a host, an expression) turned into the
rule expression the filter and the spam table store, and the roll-up levels a
pasted URL offers.

A rule is one of the expressions `urlguard.hotpath.canonical.expressions` produces, so it
blocks a URL exactly when it is among that URL's expressions:

    example.com/                 the domain and all its subdomains   ("domain")
    sub.example.com/             that subdomain and its subdomains   ("subdomain")
    example.com/path/            everything under a directory        ("path")
    example.com/path/page.html   one page, any query                 ("page")
    example.com/page.html?id=3   one exact URL                       ("page")

Lookups roll a host up to its last 5 labels and a path down to 3 directories, so
a rule deeper than that covers only itself: a host of 6 or more labels is still a
good rule for that exact host (phishing hosts are often that deep), but not for
its subdomains, and a directory 4 or more levels down is a "page" rule. The
candidates offered for a pasted URL say so.

Rules on public suffixes (`com/`, `co.uk/`, `github.io/`) are refused: they would
block every site under them. The list comes from the publicsuffixlist package
(ICANN and private sections), never from the network. So are host names no
browser can reach (a label that is empty, longer than 63 characters, or not
letters, digits and hyphens; broken IDNA) and, unless ALLOW_PRIVATE_ADDRESS_RULES
is on, addresses that are not on the public internet (private, loopback,
link-local, multicast, reserved, benchmark; also wrapped in 6to4 or Teredo): a rule
on them only ever blocks this service's own network. A network range in CIDR
notation is refused, not read as a page rule.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import unquote

import idna

from urlguard.hotpath.canonical import (
    MAX_HOST_LABELS,
    MAX_PATH_PREFIXES,
    CanonicalURL,
    canonical_url,
    expressions,
)
from urlguard.hotpath.rollup import is_directory_rule, public_suffixes, registrable_domain
from urlguard.runtime.addresses import non_public_kind

__all__ = [
    "LEVELS",
    "MAX_RULE_LENGTH",
    "RuleCandidate",
    "RuleError",
    "normalize_rule",
    "rule_candidates",
    "rule_matches",
]

LEVELS = ("domain", "subdomain", "path", "page")

# SpamRule.expression is a CharField(max_length=2000).
MAX_RULE_LENGTH = 2000

# Left unescaped by canonicalization but refused in a host by every browser; the
# rest of the forbidden set arrives escaped, as "%XX".
_FORBIDDEN_IN_HOST = "%<>^|"

# A DNS label as browsers resolve it: letters, digits and hyphens (LDH), not starting
# or ending with a hyphen. Underscores are accepted too: resolvers and browsers
# follow them, and real blocklists name such hosts (ad_server.example.com).
_LABEL_RE = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
# An address range ("192.0.2.0/24", "2001:db8::/32") as a whole pasted text.
_CIDR_RE = re.compile(
    r"\[?(?:[0-9]{1,3}(?:\.[0-9]{1,3}){3}|[0-9a-fA-F:.]*:[0-9a-fA-F:.]*)\]?/[0-9]{1,3}"
)
MAX_LABEL_LENGTH = 63
MAX_HOST_LENGTH = 253
# The plainest URL, host or expression, which canonicalization leaves as it is but
# for the host's case (and the scheme, dropped): an optional http(s) scheme, a host
# of LDH labels whose last is letters only (so no IP address, nothing for IDNA to
# map), and a path of unreserved characters whose segments start with no dot (so no
# dot segment, no empty one), with no port, userinfo, query, fragment or escape.
# Most lines of a big feed are of this shape; _plain_expression reads them in a
# fraction of canonicalization's time.
# Possessive: nothing here backtracks (a label's hyphens at its ends are checked after).
_PLAIN_RE = re.compile(
    r"(?:https?://)?+"
    r"((?:[A-Za-z0-9-]{1,63}+\.)++[A-Za-z]{2,63}+)"
    r"((?:/[A-Za-z0-9_~-][A-Za-z0-9_~.-]*+)*+/?)"
)


class RuleError(ValueError):
    """Text that cannot be a rule; the message says why and what to do instead."""


@dataclass(frozen=True, slots=True)
class RuleCandidate:
    """One roll-up level a pasted URL could be blocked at."""

    level: str  # "domain", "subdomain", "path" or "page"
    expression: str
    description: str


def normalize_rule(text: str) -> str:
    """The rule expression for a pasted URL, host or expression:
    "https://Evil.EXAMPLE.com/x/y.html#frag" -> "evil.example.com/x/y.html",
    "evil.example.com" -> "evil.example.com/", "*.example.com" -> "example.com/".
    Raises RuleError with the reason for anything that cannot be a rule."""
    plain = _plain_expression(text)
    if plain is not None:
        return plain
    parts = _parse(text)
    expression = _expression(parts)
    if len(expression) > MAX_RULE_LENGTH:
        raise RuleError(
            f"the rule would be {len(expression):,} characters long; the limit is "
            f"{MAX_RULE_LENGTH:,}: block a shorter prefix of this URL instead"
        )
    return expression


def rule_candidates(text: str) -> list[RuleCandidate]:
    """Every level a pasted URL can be blocked at, widest first: its registrable
    domain, its exact host (if different), each directory a rule can cover, the page
    (any query) and, with a query, the exact URL. Raises RuleError like
    normalize_rule (e.g. for a public suffix)."""
    parts = _parse(text)
    host, path, query = parts.host, parts.path, parts.query
    candidates: list[RuleCandidate] = []

    if parts.is_ip:
        candidates.append(RuleCandidate("domain", f"{host}/", f"everything on {host}"))
    else:
        domain = registrable_domain(host) or host  # _parse refused public suffixes
        candidates.append(RuleCandidate("domain", f"{domain}/", _host_description(domain)))
        if host != domain:
            candidates.append(RuleCandidate("subdomain", f"{host}/", _host_description(host)))

    covers_subdomains = not parts.is_ip and host.count(".") < MAX_HOST_LABELS
    where = f"{host} and its subdomains" if covers_subdomains else host
    for prefix in _directory_prefixes(path):
        candidates.append(
            RuleCandidate("path", f"{host}{prefix}", f"every page under {prefix} on {where}")
        )

    if path != "/" and not is_directory_rule(path):
        candidates.append(
            RuleCandidate("page", f"{host}{path}", f"the page {path} with any query, on {where}")
        )
    if query:
        exact = f"{host}{path}?{query}"
        if len(exact) <= MAX_RULE_LENGTH:
            candidates.append(
                RuleCandidate("page", exact, f"only {path}?{query} (this exact query), on {where}")
            )
    return [c for c in candidates if len(c.expression) <= MAX_RULE_LENGTH]


def rule_matches(expression: str, url: str) -> bool:
    """True if the rule `expression` blocks `url` (it is one of the URL's
    expressions). Raises ValueError if `url` is not a usable http(s) URL."""
    return expression in expressions(url)


# -- helpers ----------------------------------------------------------------------


def _parse(text: str) -> CanonicalURL:
    if not isinstance(text, str):
        raise RuleError(f"a rule must be text, not {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise RuleError(
            "empty rule: paste a URL, a host (example.com) or an expression (example.com/path/)"
        )
    if len(stripped) > 4 * MAX_RULE_LENGTH:
        raise RuleError(
            f"{len(stripped):,} characters is too long for a rule "
            f"(the limit is {MAX_RULE_LENGTH:,} once canonical)"
        )
    if _CIDR_RE.fullmatch(stripped):
        raise RuleError(
            f"{_short(stripped)} is a network range in CIDR notation, not a URL or host: "
            "rules name hosts, pages and paths (a range would be read as a page rule on "
            f"the path /{stripped.rpartition('/')[2]}); list the addresses one by one"
        )
    if ":" in stripped and "/" not in stripped and "[" not in stripped:
        with contextlib.suppress(ValueError):  # a bare IPv6 address: bracket it
            stripped = f"[{ipaddress.IPv6Address(stripped)}]"
    try:
        parts = _canonical(stripped, stripped)
    except RuleError:
        # "*.2.1": a browser refuses the host "*.2.1" (it ends in a number but is no
        # IPv4 address); what follows "*." is read alone below anyway.
        scheme, sep, rest = (
            ("", "", stripped) if stripped[:2] == "*." else stripped.partition("://")
        )
        if rest[:2] != "*.":
            raise
        parts = _canonical(f"{scheme}{sep}{rest[2:]}", stripped)
    # Blocklists write "all of example.com" as *.example.com (or .example.com, which
    # canonicalization already strips), and a directory as example.com/dir/*: both
    # mean what our host and directory rules do.
    if parts.host.startswith("*."):
        # Canonicalize what is left: "*.2.1" leaves "2.1", which is an IPv4 address.
        parts = _canonical(str(parts._replace(host=parts.host[2:])), stripped)
    if parts.path.endswith("/*") and not parts.query:
        parts = parts._replace(path=parts.path[:-1], query=None)
    if "*" in parts.host:
        raise RuleError(
            f"{_short(stripped)}: a host cannot contain '*'; a leading '*.' "
            "is understood (a domain and all its subdomains), nothing else"
        )
    if any(char in parts.host for char in _FORBIDDEN_IN_HOST):
        # What no browser accepts in a host name (WHATWG's forbidden host code
        # points; canonicalization escapes most of them, hence '%'): no browser can
        # ever be sent there, so a rule on it would only ever match itself.
        raise RuleError(
            f"{_short(stripped)}: the host {unquote(parts.host)!r} contains characters that "
            "no browser accepts in a host name"
        )
    if not parts.is_ip and public_suffixes().is_public(parts.host):
        if "." not in parts.host:
            raise RuleError(
                f"{parts.host!r} is a top-level domain (or a single-label name): a rule on "
                f"it would block every site under it. Block one domain instead, such as "
                f"example.{parts.host}/"
            )
        raise RuleError(
            f"{parts.host!r} is a public suffix (like com, co.uk or github.io): a rule on it "
            f"would block every site under it. Block one registrable domain instead, "
            f"such as example.{parts.host}/"
        )
    if parts.is_ip:
        _check_address(parts.host, stripped)
    else:
        _check_host_name(parts.host, stripped)
    return parts


def _plain_expression(text: str) -> str | None:
    """normalize_rule(text) for a text of _PLAIN_RE's shape that it accepts; None
    for any other text (normalize_rule's full path reads it, and says why it
    refuses it)."""
    if not isinstance(text, str) or len(text) > MAX_RULE_LENGTH:
        return None
    match = _PLAIN_RE.fullmatch(text)
    if match is None:
        return None
    host = match[1].lower()
    if (
        len(host) > MAX_HOST_LENGTH
        or host[0] == "-"
        or "-." in host
        or ".-" in host
        or "xn--" in host
        or (_may_be_public(host) and public_suffixes().is_public(host))
    ):
        return None
    return host + (match[2] or "/")


def plain_expressions(texts: list[str]) -> list[str | None]:
    """[_plain_expression(text) for text in texts], the tests inlined (a feed's
    first load reads a million lines through here)."""
    rules = getattr(public_suffixes(), "_publicsuffix", None)
    if not isinstance(rules, frozenset):  # another version of the library
        return [_plain_expression(text) for text in texts]
    # _may_be_public's three lookups without building "*.host" and "*.parent": a
    # host that is listed or wildcarded, and a parent that is wildcarded.
    listed, wildcarded = _suffix_sets(rules)
    is_public = public_suffixes().is_public
    match = _PLAIN_RE.fullmatch
    out: list[str | None] = []
    append = out.append
    for text in texts:
        found = match(text) if len(text) <= MAX_RULE_LENGTH else None
        if found is None:
            append(None)
            continue
        host = found[1].lower()
        if (
            len(host) > MAX_HOST_LENGTH
            or host[0] == "-"
            or "-." in host
            or ".-" in host
            or "xn--" in host
        ):
            append(None)
            continue
        parent = host.partition(".")[2]
        if (not parent or host in listed or parent in wildcarded) and is_public(host):
            append(None)
            continue
        append(host + (found[2] or "/"))
    return out


@functools.lru_cache(maxsize=2)
def _suffix_sets(rules: frozenset[str]) -> tuple[frozenset[str], frozenset[str]]:
    """(every rule and what each wildcard rule "*.x" names, x), (those x)."""
    wildcarded = frozenset(rule[2:] for rule in rules if rule.startswith("*."))
    return rules | wildcarded, wildcarded


def _may_be_public(host: str) -> bool:
    """False only for a host of two labels or more that no public-suffix rule can
    make a public suffix: one it is not, and whose parent is not, wildcarded, and
    that is not itself listed (how PublicSuffixList.is_public decides, read from its
    rule set: three set lookups, where is_public walks every label)."""
    rules = getattr(public_suffixes(), "_publicsuffix", None)
    if not isinstance(rules, frozenset):  # another version of the library: ask it
        return True
    parent = host.partition(".")[2]
    return not parent or host in rules or f"*.{host}" in rules or f"*.{parent}" in rules


def _check_host_name(host: str, pasted: str) -> None:
    """Refuse a host name no browser can be sent to: the rule would never match a
    real visit, and such lines are usually a broken feed."""
    if len(host) > MAX_HOST_LENGTH:
        raise RuleError(
            f"{_short(pasted)}: the host name is {len(host)} characters long; DNS allows "
            f"at most {MAX_HOST_LENGTH}"
        )
    labels = host.split(".")
    if labels[-1].isdigit():
        raise RuleError(
            f"{_short(pasted)}: the host {_short(host)} ends in a number but is not an IPv4 "
            "address (browsers refuse it)"
        )
    for label in labels:
        if len(label) > MAX_LABEL_LENGTH:
            raise RuleError(
                f"{_short(pasted)}: the host label {_short(label)} is {len(label)} characters "
                f"long; the limit is {MAX_LABEL_LENGTH}"
            )
        if not _LABEL_RE.fullmatch(label):
            raise RuleError(
                f"{_short(pasted)}: the host label {_short(unquote(label))} is not a valid "
                "host name label (letters, digits and hyphens, not starting or ending "
                "with a hyphen)"
            )
        if label.startswith("xn--"):
            try:
                idna.decode(label)
            except (idna.IDNAError, UnicodeError) as exc:
                raise RuleError(
                    f"{_short(pasted)}: the host label {label!r} is not valid IDNA ({exc})"
                ) from None


def _check_address(host: str, pasted: str) -> None:
    """Refuse an address outside the public internet unless the setting allows it:
    such a rule blocks nothing a visitor could reach from outside, only this
    service's own network (often by a feed's mistake)."""
    # Imported here: conf reads Django settings, and this module is also used
    # before Django is configured (the rule-list parsers in tests and commands).
    from urlguard.conf import conf

    kind = non_public_kind(ipaddress.ip_address(host.strip("[]")))
    if kind is None:
        return
    if conf.ALLOW_PRIVATE_ADDRESS_RULES:
        return
    raise RuleError(
        f"{_short(pasted)}: {host} is {kind} address, not one on the public internet; "
        "set URLGUARD['ALLOW_PRIVATE_ADDRESS_RULES'] = True to block such addresses"
    )


def _canonical(url: str, pasted: str) -> CanonicalURL:
    try:
        return canonical_url(url)
    except ValueError as exc:
        raise RuleError(f"{_short(pasted)} is not a URL, host or rule expression: {exc}") from None


def _expression(parts: CanonicalURL) -> str:
    # A bare "?" adds nothing: expressions() never lists "path?" with an empty query.
    if parts.query:
        return f"{parts.host}{parts.path}?{parts.query}"
    return f"{parts.host}{parts.path}"


def _directory_prefixes(path: str) -> list[str]:
    """The directories of `path` a rule can cover, shallowest first, including the
    path itself when it is such a directory."""
    prefixes: list[str] = []
    end = path.find("/", 1)
    while end != -1 and len(prefixes) < MAX_PATH_PREFIXES - 1:
        prefixes.append(path[: end + 1])
        end = path.find("/", end + 1)
    return prefixes


def _host_description(host: str) -> str:
    if host.count(".") + 1 > MAX_HOST_LABELS:
        return (
            f"{host} only: lookups roll up to at most {MAX_HOST_LABELS} labels of a "
            "host, so its subdomains are not covered"
        )
    return f"{host} and all its subdomains"


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")
