"""domains.txt: one domain per line, meaning it and all its subdomains (dnsmasq,
Unbound and Pi-hole's domain lists, squid's dstdomain). Path and page rules and
rules on addresses are omitted and counted."""

from __future__ import annotations

from urlguard.exports.base import Export, hostname_rule


class DomainsExport(Export):
    name = "domains.txt"
    title = "urlguard block list (domains: each with its subdomains)"

    def rule_lines(self, expression: str, category: str) -> list[str] | str:
        host, omitted = hostname_rule(expression)
        return omitted or [host]
