"""hosts.txt: `0.0.0.0 host` per whole-host rule, for Pi-hole and /etc/hosts. A line
names one host: subdomains of a listed domain are not covered (the format cannot
say so); path and page rules and rules on addresses are omitted and counted."""

from __future__ import annotations

from urlguard.exports.base import Export, hostname_rule


class HostsExport(Export):
    name = "hosts.txt"
    title = "urlguard block list (hosts file)"
    note = "Each line blocks that host only, not its subdomains (domains.txt and rpz.zone do)."

    def rule_lines(self, expression: str, category: str) -> list[str] | str:
        host, omitted = hostname_rule(expression)
        return omitted or [f"0.0.0.0 {host}"]
