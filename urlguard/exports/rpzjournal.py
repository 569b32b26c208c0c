"""The RPZ zone's records at a change-log position, and the difference between two
positions read from the change log itself (IXFR, RFC 1995): the log is the journal.
A serial further back than DNS_JOURNAL_CHANGES gets the whole zone instead."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from urlguard.conf import conf
from urlguard.exports.projection import Snapshot, parent_rules
from urlguard.exports.rpz import passthru_records, rpz_records
from urlguard.models import ChangeEvent, SpamRule

__all__ = ["ZoneDelta", "delta", "zone_records"]

Record = tuple[str, str]


def zone_records(snap: Snapshot, zone: str) -> Iterator[Record]:
    """(owner, CNAME target) of every record of the zone at `snap`, exceptions first."""
    for host in snap.exceptions:
        yield from passthru_records(host, zone)
    for expression, _category in snap.rules():
        records = rpz_records(expression, zone)
        if not isinstance(records, str):
            yield from records


@dataclass(frozen=True)
class ZoneDelta:
    deleted: list[Record]
    added: list[Record]


def delta(snap: Snapshot, old_seq: int, zone: str) -> ZoneDelta | None:
    """The records to delete and add to go from `old_seq` to `snap`'s position, or
    None when the log between them is longer than the journal window."""
    new_seq = snap.position.seq
    if old_seq > new_seq or new_seq - old_seq > conf.DNS_JOURNAL_CHANGES:
        return None
    events = (
        ChangeEvent.objects.filter(seq__gt=old_seq, seq__lte=new_seq)
        .order_by("seq")
        .values_list("action", "expression")
    )
    first: dict[str, str] = {}
    last: dict[str, str] = {}
    for action, expression in events.iterator(chunk_size=10_000):
        first.setdefault(expression, action)
        last[expression] = action
    was = {e for e, action in first.items() if action == ChangeEvent.Action.REMOVE}
    now = {e for e, action in last.items() if action == ChangeEvent.Action.ADD}
    deleted: list[Record] = []
    added: list[Record] = []
    for expression in sorted(was - now):
        records = rpz_records(expression, zone)
        if not isinstance(records, str):
            deleted.extend(records)
    for expression in sorted(now - was):
        records = rpz_records(expression, zone)
        if not isinstance(records, str):
            added.extend(records)
    # An allowlisted host's passthru comes and goes with whole-host rules above it.
    touched = set(first)
    for host in snap.position.allowlist:
        parents = parent_rules(host)
        if touched.isdisjoint(parents):
            continue
        listed_now = set(
            SpamRule.objects.filter(expression__in=parents).values_list("expression", flat=True)
        )
        listed_then = {p for p in parents if (p in was) or (p in listed_now and p not in touched)}
        if bool(listed_now) != bool(listed_then):
            records = passthru_records(host, zone)
            if listed_now:
                deleted.extend(records)
            else:
                added.extend(records)
    return ZoneDelta(deleted, added)
