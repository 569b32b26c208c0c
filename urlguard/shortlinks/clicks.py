"""Click accounting for short links, off the request path.

A redirect only adds the click to buffers (urlguard.runtime.stats); a background thread
writes them at least every STATS_FLUSH_INTERVAL. A click adds one to its link's
pending count, merged in memory, so a flush writes one UPDATE of the links'
click_count however many clicks came in: its work grows with the links clicked, not
with the clicks (a viral link costs it one row). Only a click that may need a row
or may be a new visitor is kept whole, for the visitors' flush (its own
transaction: row locks of those links, the lookup, one UPDATE of unique_visitors,
one INSERT of the rows).

- click_count counts every click (exact, except what a `kill -9` loses: the clicks
  of that process's last flush interval; see urlguard.runtime.stats).
- A raw Click row is written at least once per (link, visitor, hour) and close
  duplicates are dropped: an OppositeBloomFilter remembers the recent (link,
  visitor, hour) keys. It may forget one (then a second row is written, harmless)
  but never claims to have seen one it has not (a row is never wrongly skipped).
  A row carries the time of its click, not of its flush.
- unique_visitors counts a visitor once per link per 24 hours: a time-to-live filter
  says whether this process saw the visitor on this link within the window; if
  not, the flush confirms it in the Click table while holding the link's row lock,
  because other processes and nodes have their own filters and buffers: two
  flushes of the same new visitor take turns, and the second finds the first's
  row. A false "seen" from the filter undercounts by its false-positive rate;
  nothing overcounts. It is a RotatingBloomFilter: in bench/variants.py it has a
  third of the ContinuousBloomFilter's false-positive rate in less memory.

The visitor is a keyed hash (BLAKE2b keyed by SECRET_KEY) of the client address and
user agent: stable enough to deduplicate, never stored raw, useless without the key."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from django.http import HttpRequest

from filterengine import OppositeBloomFilter, RotatingBloomFilter
from urlguard.models import Click, ShortLink, database
from urlguard.runtime import stats
from urlguard.runtime.process import PerProcess
from urlguard.runtime.visitors import visitor_id

__all__ = ["UNIQUE_WINDOW", "record_click", "reset", "visitor_id", "write_clicks"]

#: A visitor counts once per link within this window.
UNIQUE_WINDOW = timedelta(hours=24)
#: The filter keeps a key for (ttl, 1.5·ttl] after its last add: with ttl = 2/3 of
#: the window, "seen by the filter" always means "clicked within the window", so
#: the filter never hides a visitor who is new again (that would undercount by
#: more than its false-positive rate). "Not seen" is checked in the Click table.
_FILTER_TTL = UNIQUE_WINDOW.total_seconds() * 2 / 3
#: Click rows exist per (link, visitor, hour), so a click is recorded by a row up
#: to an hour older than itself: the table check looks back this much further.
_ROW_GRANULARITY = timedelta(hours=1)
#: Recent (link, visitor, hour) keys remembered per process: 2**16 slots is ~4 MiB.
#: Forgetting only costs a duplicate row.
RECENT_CLICK_SLOTS = 1 << 16
#: (link, visitor) pairs a process can tell apart within one window at 1% error;
#: beyond it the filter's error grows, which undercounts (never overcounts).
UNIQUE_CAPACITY = 200_000
UNIQUE_ERROR_RATE = 0.01

#: Wall-clock seconds; the hour of a click and the filter's ticks both read it
#: (the filter survives a clock stepped backwards: nothing expired comes back).
_clock: Callable[[], float] = time.time


class PendingClick(NamedTuple):
    """A click waiting in the buffer."""

    link_id: int
    visitor: str
    at: float  # _clock() seconds
    write_row: bool  # the recent-rows filter had not seen (link, visitor, hour)
    maybe_new: bool  # the unique filter had not seen (link, visitor) in the window


def _make_filters() -> tuple[OppositeBloomFilter, RotatingBloomFilter]:
    return (
        OppositeBloomFilter(RECENT_CLICK_SLOTS),
        # The clock is looked up on each tick: tests move it.
        RotatingBloomFilter(
            UNIQUE_CAPACITY, UNIQUE_ERROR_RATE, _FILTER_TTL, clock=lambda: _clock()
        ),
    )


#: (recent rows, unique visitors) of this process.
_filters: PerProcess[tuple[OppositeBloomFilter, RotatingBloomFilter]] = PerProcess(
    _make_filters, name="click filters"
)
#: Forget this process's filters (tests).
reset = _filters.reset


def record_click(request: HttpRequest, link: Any) -> None:
    """Count a click on `link` (anything with the link's `pk`): appended to the
    buffer, written by the next flush. Never touches the database."""
    recent, unique = _filters.get()
    visitor = visitor_id(request)
    now = _clock()
    write_row = not recent.contains_and_add(f"{link.pk}:{visitor}:{int(now // 3600)}")
    maybe_new = unique.add(f"{link.pk}:{visitor}")
    _COUNTS.add(link.pk)
    if write_row or maybe_new:
        _VISITS.append(PendingClick(link.pk, visitor, now, write_row, maybe_new))


def _when(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def write_clicks(clicks: list[PendingClick]) -> None:
    """Write the kept clicks (inside the flush's transaction): lock their links' rows,
    find which maybe-new visitors are new, then one UPDATE of unique_visitors and one
    INSERT of the rows. click_count is not written here (see _COUNTS)."""
    first: dict[tuple[int, str], PendingClick] = {}  # maybe-new pairs, first click of each
    for click in clicks:
        if click.maybe_new:
            first.setdefault((click.link_id, click.visitor), click)
    ids = sorted({click.link_id for click in clicks})
    live: set[int] = set()
    for batch in database.in_batches(ids):
        # The row locks, in id order (two flushes never wait on each other in a
        # cycle), are held to the commit: a flush of the same new visitor in
        # another process waits here, then its lookup (a new statement, reading
        # committed rows) finds this flush's row and does not count it again.
        # SQLite has no row locks: its write transaction already excludes others.
        live.update(
            ShortLink.objects.select_for_update()
            .filter(pk__in=batch)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
    new = _new_visitors({pair: c for pair, c in first.items() if pair[0] in live})
    uniques: OrderedDict[Any, list[int]] = OrderedDict()
    for link_id, _visitor in sorted(new):
        entry = uniques.setdefault(link_id, [0, 0])
        entry[0] += 1
        entry[1] += 1
    _UNIQUE.write(uniques)
    Click.objects.bulk_create(
        [
            Click(link_id=c.link_id, visitor=c.visitor, at=_when(c.at))
            for c in clicks
            if c.link_id in live
            and (
                c.write_row
                or first.get((c.link_id, c.visitor)) is c
                and (c.link_id, c.visitor) in new
            )
        ],
        batch_size=database.STATEMENT_ROWS,
    )


def _new_visitors(first: dict[tuple[int, str], PendingClick]) -> set[tuple[int, str]]:
    """The pairs with no Click row within the window before their click."""
    if not first:
        return set()
    since = _when(min(c.at for c in first.values())) - UNIQUE_WINDOW - _ROW_GRANULARITY
    latest: dict[tuple[int, str], datetime] = {}
    link_ids = sorted({link_id for link_id, _ in first})
    visitors = sorted({visitor for _, visitor in first})
    # Two IN lists in one statement: half the batch each.
    for link_batch in database.in_batches(link_ids, database.IN_BATCH // 2):
        for visitor_batch in database.in_batches(visitors, database.IN_BATCH // 2):
            found = Click.objects.filter(
                link_id__in=link_batch,
                visitor__in=visitor_batch,
                at__gte=since,
            ).values_list("link_id", "visitor", "at")
            for link_id, visitor, at in found:
                pair = (link_id, visitor)
                if pair in first and (pair not in latest or at > latest[pair]):
                    latest[pair] = at
    return {
        pair
        for pair, click in first.items()
        if pair not in latest or latest[pair] < _when(click.at) - UNIQUE_WINDOW - _ROW_GRANULARITY
    }


# Flushed in this order, each in its own transaction: a failed visitors' flush keeps
# its clicks for the next try without holding back the counts.
_VISITS = stats.batch("clicks.visitors", write_clicks, model=Click)
_COUNTS = stats.counter("clicks", ShortLink, fields=["click_count"])
# Not registered: written by write_clicks inside its transaction, after the lookup.
_UNIQUE = stats.Counter("clicks.unique", ShortLink, ["id"], ["unique_visitors"], upsert=False)
