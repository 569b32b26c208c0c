"""abp.txt: an Adblock Plus / uBlock Origin / AdGuard filter list. `||host^` blocks a
host and its subdomains; a path rule is `||host/path/` (its subresources) plus the
same with `$document` (the page itself: without it a browser blocks only what pages
load from there); a page rule is `||host/page^$document`. Allowlisted hosts are
exceptions (`@@||host^`), and this list's own rules under them carry `$important`
so that the exception never unblocks them. The header's `Diff-Path` names the
differential patch (RCS format) from this version to the newest."""

from __future__ import annotations

import math
from collections.abc import Iterable

from urlguard.conf import conf
from urlguard.exports.base import UNSAFE, Export
from urlguard.exports.projection import Position, Snapshot, parent_rules
from urlguard.hotpath.canonical import split_expression

__all__ = ["AbpExport", "patch_name"]

# ABP's own syntax inside a pattern: a rule holding one would mean something else.
_SPECIAL = frozenset("*^|$ \t")


def patch_name(key: str) -> str:
    return f"abp-{key}.patch"


class AbpExport(Export):
    name = "abp.txt"
    title = "urlguard block list (Adblock Plus syntax)"
    comment = "!"
    omissions = {UNSAFE: "rules holding a character ABP reads as syntax (* ^ | $ or space)"}

    def __init__(self) -> None:
        self._exempt: frozenset[str] = frozenset()

    def prepare(self, snapshot: Snapshot) -> None:
        self._exempt = frozenset(h + "/" for h in snapshot.exceptions)

    def preamble(self, position: Position) -> list[str]:
        return ["[Adblock Plus 2.0]"]

    def extra_header(self, position: Position) -> list[str]:
        hours = max(1, math.ceil(conf.EXPORT_MAX_AGE / 3600))
        return [
            "! Title: urlguard",
            f"! Version: {position.seq}",
            f"! Last modified: {position.time:%d %b %Y %H:%M} UTC",
            "! Expires: 1 days",
            f"! Diff-Path: {patch_name(position.key)}",
            f"! Diff-Expires: {hours} hours",
        ]

    def exception_lines(self, snapshot: Snapshot) -> Iterable[str]:
        return (f"@@||{host}^" for host in snapshot.exceptions)

    def rule_lines(self, expression: str, category: str) -> list[str] | str:
        if _SPECIAL.intersection(expression):
            return UNSAFE
        host, path = split_expression(expression)
        important = bool(self._exempt) and not self._exempt.isdisjoint(parent_rules(host))
        options = ",important" if important else ""
        if path == "/":
            return [f"||{host}^" + ("$important" if important else "")]
        if path.endswith("/"):
            plain = f"||{expression}" + ("$important" if important else "")
            return [plain, f"||{expression}$document{options}"]
        # A page: `^` ends it at its query ("?") or the end of the address.
        end = "|" if "?" in path else "^"
        return [f"||{expression}{end}$document{options}"]
