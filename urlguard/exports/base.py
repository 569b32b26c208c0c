"""What every export shares: a header naming the change-log position, its time, how
many rules the file carries and how many (and why) its format could not express;
and the per-rule projection each format module fills in."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from urlguard.exports.projection import Position, Snapshot, host_rule, is_address

__all__ = ["Export", "RenderCounts", "hostname_rule"]

#: Omission reasons shared by the formats that name hosts only.
PATHS = "path"
ADDRESSES = "address"
UNSAFE = "unsafe"


@dataclass
class RenderCounts:
    rules: int = 0
    written: int = 0
    exceptions: int = 0
    omitted: Counter[str] = field(default_factory=Counter)


def hostname_rule(expression: str) -> tuple[str, str]:
    """(host, "") for a whole-host rule on a name, else ("", the omission reason)."""
    host = host_rule(expression)
    if host is None:
        return "", PATHS
    if is_address(host):
        return "", ADDRESSES
    return host, ""


class Export:
    """One format. `rule_lines` maps a rule to its lines, or to the key of
    `omissions` that says why this format cannot carry it."""

    name: ClassVar[str]
    title: ClassVar[str]
    content_type: ClassVar[str] = "text/plain; charset=utf-8"
    comment: ClassVar[str] = "#"
    omissions: ClassVar[dict[str, str]] = {
        PATHS: "path and page rules: this format names hosts only",
        ADDRESSES: "rules on IP addresses: this format names hosts by name",
    }
    #: Said once in the header: what a line means to the consumer.
    note: ClassVar[str] = ""

    def prepare(self, snapshot: Snapshot) -> None:
        """Called once before the rules of `snapshot` are projected."""

    def preamble(self, position: Position) -> list[str]:
        """Lines before the comment header (a format's magic line, an SOA)."""
        return []

    def exception_lines(self, snapshot: Snapshot) -> Iterable[str]:
        return ()

    def rule_lines(self, expression: str, category: str) -> list[str] | str:
        raise NotImplementedError

    def extra_header(self, position: Position) -> list[str]:
        return []

    def header(self, position: Position, counts: RenderCounts) -> list[str]:
        c = self.comment
        lines = [
            *self.extra_header(position),
            f"{c} {self.title}",
            f"{c} Position: {position.seq} (urlguard change log)",
            f"{c} Time: {position.time:%Y-%m-%dT%H:%M:%SZ}",
            f"{c} Rules: {counts.rules} listed, {counts.written} in this file, "
            f"{sum(counts.omitted.values())} not expressible in this format",
        ]
        for reason, n in sorted(counts.omitted.items()):
            lines.append(f"{c} Omitted: {n} {self.omissions.get(reason, reason)}")
        if counts.exceptions:
            lines.append(f"{c} Exceptions: {counts.exceptions} allowlisted hosts")
        if self.note:
            lines.append(f"{c} {self.note}")
        return lines
