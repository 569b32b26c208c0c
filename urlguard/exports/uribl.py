"""URIBL/DNSBL answers, looked up live through the guard (filter, then the table):
`<host>.<zone>`, `<reversed IPv4>.<zone>` or `<reversed IPv6 nibbles>.<zone>` (RFC 5782
section 2.4: 32 hex digits, least significant first) is listed when a whole-host rule
blocks that host. The A record's last octet is the categories' bitmask (never 127.0.0.1);
the TXT names the rule, its category and REPORT_MISTAKE_URL's desk if one is set.
RFC 5782 test points: 127.0.0.2 (also as ::ffff:7f00:2) and `test` listed, 127.0.0.1
(and ::ffff:7f00:1) and `invalid` not."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from urlguard.conf import conf
from urlguard.exports.categories import uribl_address
from urlguard.exports.projection import host_rule
from urlguard.hotpath.guard import InvalidURL, get_guard
from urlguard.hotpath.warning import report_mistake_url
from urlguard.models import SpamRule

__all__ = ["Listing", "Unchecked", "lookup"]

TEST_LISTING_ADDRESS = "127.0.0.2"


class Unchecked(RuntimeError):
    """The guard could not tell (filter unreadable, ON_FILTER_ERROR 'closed')."""


@dataclass(frozen=True)
class Listing:
    address: str
    rule: SpamRule | None = None
    host: str = ""

    @property
    def text(self) -> str:
        """The TXT answer: the rule and its category, and where to report a mistake when
        REPORT_MISTAKE_URL names a desk. This service's own report form takes only a
        link made for the warned visitor's browser (signed for it, expiring), which a
        mail filter's TXT lookup has none of: such a link could never be used."""
        if self.rule is None:
            return "RFC 5782 test entry"
        rule = self.rule
        text = f"listed by urlguard rule {rule.expression} ({rule.category})"
        if conf.REPORT_MISTAKE_URL:
            text += f"; report: {report_mistake_url(f'http://{self.host}/', rule)}"
        return text


_NIBBLES = frozenset("0123456789abcdef")


def _subject(labels: list[str]) -> tuple[str, bool]:
    """(host, is_address) named by the labels below the zone, the host written as a
    rule writes it (an IPv6 address in brackets, an IPv4-mapped one as IPv4)."""
    if len(labels) == 4 and all(x.isdigit() and len(x) <= 3 and int(x) < 256 for x in labels):
        return ".".join(reversed(labels)), True
    if len(labels) == 32 and all(len(x) == 1 and x in _NIBBLES for x in labels):
        address = ipaddress.IPv6Address(int("".join(reversed(labels)), 16))
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped), True
        return f"[{address.compressed}]", True
    return ".".join(labels), False


def lookup(relative: str) -> Listing | None:
    """The listing of `relative` (the query name without the zone), or None."""
    labels = relative.lower().rstrip(".").split(".")
    host, address = _subject(labels)
    if host in ("127.0.0.2", "test"):
        return Listing(TEST_LISTING_ADDRESS)
    if host in ("127.0.0.1", "invalid") or not host:
        return None
    try:
        verdict = get_guard().check(f"http://{host}/")
    except InvalidURL:
        return None
    if not verdict.blocked:
        return None
    if verdict.rule is None:
        raise Unchecked(verdict.reason)
    rule = verdict.rule
    categories = {rule.category}
    # Other whole-host rules above it (a domain's and a subdomain's) add their bits.
    others = [e for e in verdict.maybe if e != rule.expression and host_rule(e) is not None]
    if others:
        found = SpamRule.objects.filter(expression__in=others).values_list("category", flat=True)
        categories.update(found)
    return Listing(uribl_address(categories), rule, host)
