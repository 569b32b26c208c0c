"""rspamd-urls.map: an rspamd multimap `regexp;` map of the path and page rules, one
`/regex/i SYMBOL:score` per rule, matching the URL with the host or any subdomain
of it, as the guard's roll-ups do. Whole-host rules are in rspamd-domains.map."""

from __future__ import annotations

import re

from urlguard.exports.base import Export
from urlguard.exports.categories import category_export
from urlguard.hotpath.canonical import split_expression

HOSTS = "host"


def url_pattern(expression: str) -> str:
    host, path = split_expression(expression)
    pattern = r"^[a-z][a-z0-9+.-]*://([^/?#@]*@)?([^/?#]*\.)?" + re.escape(host) + r"(:\d+)?"
    pattern += re.escape(path)
    if not path.endswith("/"):
        pattern += r"(\?|#|$)" if "?" not in path else "(#|$)"
    # `/` delimits the regexp in the map: escaped inside it.
    return pattern.replace("/", r"\/")


class RspamdUrlsExport(Export):
    name = "rspamd-urls.map"
    title = "urlguard rspamd multimap (URL regexps)"
    omissions = {HOSTS: "whole-host rules: in rspamd-domains.map"}

    def rule_lines(self, expression: str, category: str) -> list[str] | str:
        if split_expression(expression)[1] == "/":
            return HOSTS
        symbol = category_export(category)
        return [f"/{url_pattern(expression)}/i {symbol.rspamd_symbol}:{symbol.rspamd_score:g}"]
