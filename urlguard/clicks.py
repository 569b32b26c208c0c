"""Click accounting for short links, cheap enough for the redirect path.

- Every click increments ShortLink.click_count (one UPDATE with F()).
- A raw Click row is written at least once per (link, visitor, hour) and close
  duplicates are dropped: an OppositeBloomFilter remembers the recent (link,
  visitor, hour) keys. It may forget one (then a second row is written, harmless)
  but never claims to have seen one it has not (a row is never wrongly skipped).
- unique_visitors counts a visitor once per link per 24 hours: a time-to-live filter
  says whether this process saw the visitor on this link within the window; if
  not, the Click table confirms it, because other worker processes have their own
  filters. A false "seen" from the filter undercounts by its false-positive rate;
  nothing overcounts. It is a RotatingBloomFilter: in bench/variants.py it has a
  third of the ContinuousBloomFilter's false-positive rate in less memory, i.e.
  fewer undercounted visitors, and its slower add is noise beside the click's
  database writes.

The visitor is a keyed hash (BLAKE2b keyed by SECRET_KEY) of the client address and
user agent: stable enough to deduplicate, never stored raw, useless without the key."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import F
from django.http import HttpRequest
from django.utils import timezone

from filterengine import OppositeBloomFilter, RotatingBloomFilter
from urlguard.models import Click, ShortLink

__all__ = ["UNIQUE_WINDOW", "record_click", "reset", "visitor_id"]

log = logging.getLogger(__name__)

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

_lock = threading.Lock()
_recent: OppositeBloomFilter | None = None
_unique: RotatingBloomFilter | None = None
_visitor_key: tuple[str, bytes] | None = None


def reset() -> None:
    """Forget this process's filters (tests)."""
    global _recent, _unique
    with _lock:
        _recent = _unique = None


def _filters() -> tuple[OppositeBloomFilter, RotatingBloomFilter]:
    global _recent, _unique
    if _recent is None or _unique is None:
        with _lock:
            if _recent is None:
                _recent = OppositeBloomFilter(RECENT_CLICK_SLOTS)
            if _unique is None:
                _unique = RotatingBloomFilter(
                    UNIQUE_CAPACITY, UNIQUE_ERROR_RATE, _FILTER_TTL, clock=lambda: _clock()
                )
    return _recent, _unique


def _key() -> bytes:
    # Derived once per SECRET_KEY (override_settings in tests changes it); BLAKE2b
    # keys are at most 64 bytes, and a personalised hash keeps this key apart
    # from any other use of the secret.
    global _visitor_key
    secret = settings.SECRET_KEY
    if _visitor_key is None or _visitor_key[0] != secret:
        derived = hashlib.blake2b(
            secret.encode(), digest_size=32, person=b"urlguard.visitor"
        ).digest()
        _visitor_key = (secret, derived)
    return _visitor_key[1]


def visitor_id(request: HttpRequest) -> str:
    """32 hex characters identifying (client address, user agent) under SECRET_KEY."""
    address = request.META.get("REMOTE_ADDR", "") or ""
    agent = request.META.get("HTTP_USER_AGENT", "") or ""
    # NUL cannot occur in either header value: the join is unambiguous.
    data = f"{address}\x00{agent}".encode("utf-8", "surrogateescape")
    return hashlib.blake2b(data, key=_key(), digest_size=16).hexdigest()


def record_click(request: HttpRequest, link: ShortLink) -> None:
    """Count a click on `link`. Never raises for a database error: the redirect
    matters more than the counter (the error is logged)."""
    recent, unique = _filters()
    visitor = visitor_id(request)
    hour = int(_clock() // 3600)
    row_key = f"{link.pk}:{visitor}:{hour}"
    write_row = not recent.contains_and_add(row_key)
    maybe_new = unique.add(f"{link.pk}:{visitor}")
    try:
        with transaction.atomic():
            # The UPDATE first: it holds the link's row lock until the commit, so two
            # workers seeing the same new visitor at once take turns, and the second
            # one's lookup finds the first one's row (PostgreSQL reads committed
            # rows per statement) instead of both counting the visitor.
            ShortLink.objects.filter(pk=link.pk).update(click_count=F("click_count") + 1)
            new_visitor = (
                maybe_new
                and not Click.objects.filter(
                    link_id=link.pk,
                    visitor=visitor,
                    at__gte=timezone.now() - UNIQUE_WINDOW - _ROW_GRANULARITY,
                ).exists()
            )
            if write_row or new_visitor:
                Click.objects.create(link_id=link.pk, visitor=visitor)
            if new_visitor:
                ShortLink.objects.filter(pk=link.pk).update(
                    unique_visitors=F("unique_visitors") + 1
                )
    except DatabaseError:
        log.exception("could not record a click on short link %s", link.pk)
        # Nothing was written: let the next click of this visitor try again.
        recent.discard(row_key)
