"""rspamd-domains.map: an rspamd multimap map, `host SYMBOL:score` per whole-host
rule, the symbol and score from the category table (urlguard.exports.categories).
Path and page rules are in rspamd-urls.map instead."""

from __future__ import annotations

from urlguard.exports.base import PATHS, Export
from urlguard.exports.categories import category_export
from urlguard.exports.projection import host_rule


class RspamdDomainsExport(Export):
    name = "rspamd-domains.map"
    title = "urlguard rspamd multimap (hosts)"
    omissions = {PATHS: "path and page rules: in rspamd-urls.map"}

    def rule_lines(self, expression: str, category: str) -> list[str] | str:
        host = host_rule(expression)
        if host is None:
            return PATHS
        symbol = category_export(category)
        return [f"{host.strip('[]')} {symbol.rspamd_symbol}:{symbol.rspamd_score:g}"]
