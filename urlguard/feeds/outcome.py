"""What one refresh of a source did: how it ended (RefreshStatus) and its numbers
(RefreshResult), which the refresh records on the source, the commands print and
the admin's job page shows."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import DatabaseError

from urlguard.feeds.health import in_words
from urlguard.models import ChangeSet, Source

__all__ = ["MAX_REFUSALS_KEPT", "RefreshResult", "RefreshStatus", "refuse", "rules_left"]

# Refused entries kept (with line and reason) for the history page; all are counted.
MAX_REFUSALS_KEPT = 50


class RefreshStatus(enum.StrEnum):
    """How a refresh ended. The first four are recorded on the source (their values
    are Source.Status's); BUSY and DRY_RUN never are: a refresh that found the source
    claimed did nothing, and a dry run writes nothing."""

    OK = Source.Status.OK.value
    NOT_MODIFIED = Source.Status.NOT_MODIFIED.value
    FAILED = Source.Status.FAILED.value
    HELD = Source.Status.HELD.value
    BUSY = "busy"
    DRY_RUN = "dry-run"


@dataclass
class RefreshResult:
    """What one refresh did (or, with dry_run or held, would do)."""

    source: str
    status: RefreshStatus = RefreshStatus.OK
    http_status: int | None = None
    bytes: int = 0
    format: str = ""
    entries: int = 0  # distinct entries the source lists now
    added: int = 0  # entries new to this source
    removed: int = 0  # entries that left this source
    unchanged: int = 0
    refused: int = 0
    held: int = 0  # new entries held for an operator's yes (feeds.holds)
    rules_added: int = 0  # rows written: rules that were listed by no other source
    rules_removed: int = 0  # rules no source lists any more
    duration: float = 0.0
    error: str = ""
    transient: bool = False  # a retry may help (network, timeout, 5xx)
    change_set: int | None = None
    refusals: list[tuple[int, str, str]] = field(default_factory=list)
    holds: list[tuple[str, str]] = field(default_factory=list)  # (expression, reason)
    # What the entries new to the source block of the short links (Impact.as_dict).
    impact: dict[str, Any] | None = None
    held_reason: str = ""
    rescan_job: int | None = None  # the rescan of the short links that followed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def impact_lines(self, shown: int = 5) -> list[str]:
        """The refresh's effect on the short links, in words: the links it newly
        blocks (a handful named, then a count) and their clicks."""
        impact = self.impact
        if not impact:
            return []
        if not impact["exact"]:
            return [impact["note"] or "its effect on the short links is not known yet"]
        changed = int(impact["changed"])
        verb = "blocks" if self.status == RefreshStatus.OK else "would block"
        if changed == 0:
            return [f"{verb} no short link that was open"]
        slugs = [f"/{sample['slug']}" for sample in impact["samples"][:shown]]
        more = changed - len(slugs)
        named = ", ".join(slugs) + (f" and {more:,} more" if more > 0 else "")
        clicks = int(impact.get("changed_clicks", 0))
        return [
            f"{verb} {changed:,} short link{'' if changed == 1 else 's'} that "
            f"{'was' if changed == 1 else 'were'} open: {named} "
            f"({clicks:,} click{'' if clicks == 1 else 's'} in the last 30 days)"
        ]

    def summary(self) -> str:
        if self.status == RefreshStatus.FAILED:
            return f"{self.source}: failed: {self.error}"
        if self.status == RefreshStatus.NOT_MODIFIED:
            return f"{self.source}: not modified"
        if self.status == RefreshStatus.BUSY:
            return f"{self.source}: another refresh of it is running ({self.error}); skipped"
        head = {
            RefreshStatus.HELD: f"HELD ({self.held_reason or 'shrink'}; nothing applied)",
            RefreshStatus.DRY_RUN: "dry run (nothing applied)",
        }.get(self.status, "ok")
        return (
            f"{self.source}: {head}: {self.entries:,} entries ({self.format}): "
            f"{in_words(self.added, self.removed, self.refused, self.unchanged)}"
            + (f", {self.held:,} held for confirmation" if self.held else "")
            + f"; rules {in_words(self.rules_added, self.rules_removed)}; "
            f"{self.duration:.2f} s"
        )


def refuse(result: RefreshResult, lineno: int, raw: str, reason: str) -> None:
    """Count a refused entry, and keep the first MAX_REFUSALS_KEPT with their reason."""
    result.refused += 1
    if len(result.refusals) < MAX_REFUSALS_KEPT:
        result.refusals.append((lineno, raw.rstrip("\r\n")[:300], reason))


def rules_left(result: RefreshResult) -> str:
    """What a failed refresh left of its source's rules, in words. One that fails
    mid-write (the database restarting mid-load) keeps the chunks it committed, which
    its numbers, set when the writes end, never counted: its change set has them,
    partial until the next refresh finishes it."""
    again = f"`manage.py refresh_feeds {result.source}` again finishes it"
    if result.change_set is None:
        return "its rules are unchanged"
    try:
        row = (
            ChangeSet.objects.filter(pk=result.change_set)
            .values_list("added", "removed", "finished")
            .first()
        )
    except DatabaseError:
        return (
            f"perhaps partial: change set #{result.change_set} may hold some of its rules "
            f"(the database did not answer); {again}"
        )
    if row is None or row[:2] == (0, 0):
        return "its rules are unchanged"
    written = f"rules {in_words(row[0], row[1])}"
    if row[2] is not None:
        return f"its rules changed all the same: {written} in change set #{result.change_set}"
    return f"partial: {written} committed in change set #{result.change_set}; {again}"
