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
from urlguard.models.database import in_batches

__all__ = ["ZoneDelta", "delta", "zone_records"]

Record = tuple[str, str]
_ALLOWLIST_ACTIONS = (ChangeEvent.Action.ALLOW, ChangeEvent.Action.UNALLOW)
#: The `source` of the allowlist rows migration 0018 wrote for the hosts then in force.
UPGRADE_SOURCE = "allowlist:upgrade"


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
    None when the log between them is longer than the journal window (or crosses the
    upgrade that first logged the allowlist: the secondary's exceptions predate it)."""
    new_seq = snap.position.seq
    if old_seq > new_seq or new_seq - old_seq > conf.DNS_JOURNAL_CHANGES:
        return None
    events = (
        ChangeEvent.objects.filter(seq__gt=old_seq, seq__lte=new_seq)
        .order_by("seq")
        .values_list("action", "expression", "source")
    )
    first: dict[str, str] = {}
    last: dict[str, str] = {}
    allowlist_touched: set[str] = set()
    for action, expression, source in events.iterator(chunk_size=10_000):
        if action in _ALLOWLIST_ACTIONS:
            if source == UPGRADE_SOURCE:
                return None
            allowlist_touched.add(expression)
            continue
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
    # A host's passthru is in the zone while the host is allowlisted and no whole-host
    # rule above it is listed: it comes and goes with either.
    touched = set(first)
    allowed_now = set(snap.position.allowlist)
    hosts = allowlist_touched | {h for h in allowed_now if not touched.isdisjoint(parent_rules(h))}
    if not hosts:
        return ZoneDelta(deleted, added)
    allowed_then = (allowed_now - allowlist_touched) | _allowed_at(allowlist_touched, old_seq)
    parents = sorted({p for host in hosts for p in parent_rules(host)})
    listed_now: set[str] = set()
    for batch in in_batches(parents):
        listed_now.update(
            SpamRule.objects.filter(expression__in=batch).values_list("expression", flat=True)
        )
    listed_then = {p for p in parents if (p in was) or (p in listed_now and p not in touched)}
    for host in sorted(hosts):
        above = parent_rules(host)
        then = host in allowed_then and listed_then.isdisjoint(above)
        passthru_now = host in allowed_now and listed_now.isdisjoint(above)
        if then and not passthru_now:
            deleted.extend(passthru_records(host, zone))
        elif passthru_now and not then:
            added.extend(passthru_records(host, zone))
    return ZoneDelta(deleted, added)


def _allowed_at(hosts: set[str], seq: int) -> set[str]:
    """Those of `hosts` the allowlist held at position `seq`: their latest allowlist
    row at or before it is an `allow`."""
    latest: dict[str, str] = {}
    for batch in in_batches(sorted(hosts)):
        rows = ChangeEvent.objects.filter(
            action__in=_ALLOWLIST_ACTIONS, expression__in=batch, seq__lte=seq
        ).order_by("seq")
        for host, action in rows.values_list("expression", "action"):
            latest[host] = action
    return {h for h, action in latest.items() if action == ChangeEvent.Action.ALLOW}
