"""Short links served from memory, so that a redirect reads no database row and
keeps working while the database is away.

Each process keeps the links it served (slug -> destination, disabled). Every
change to what a redirect reads (destination, disabled, slug, a deletion) bumps
ShortLinkGeneration in the same transaction (urlguard.models); a thread per process
reads that one row every LINK_CACHE_POLL seconds and, when it moved, reads its
cached links again (a few IN queries, off the request path), so an edit reaches
every process of every node within a second, from the source of truth, with no
broker. The same thread re-reads, in batches and shortly before they expire, the
links asked for within their LINK_CACHE_TTL (the backstop for writes that bypass
the ORM) and drops the others, so that no redirect waits for a row: links read in
one burst would otherwise expire in one burst, a row read per request.

Why per process and not Redis: a hit here is a dictionary lookup (~0.3 µs), a
Redis GET a loopback round trip (~60 µs, bench/redirect.py prints both), and
Redis would be one more server whose absence fails redirects.

With the database down: a cached link is served as cached (its generation is
still the newest this process knows, so no change to it was seen); a link not in
the cache raises LinkUnavailable (the view answers 503 with Retry-After)."""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from django.db import DatabaseError, connections

from urlguard.conf import conf
from urlguard.models import ShortLink, ShortLinkGeneration, database
from urlguard.runtime.process import Daemon, on_reset

__all__ = ["CachedLink", "LinkUnavailable", "get", "poll", "poller", "refresh_due", "reset"]

log = logging.getLogger(__name__)


class CachedLink(NamedTuple):
    """What a redirect needs of a ShortLink (the templates read slug and reason)."""

    pk: int
    slug: str
    destination: str
    disabled: bool
    disabled_reason: str


class LinkUnavailable(Exception):
    """The link is not cached here and the database cannot be read."""


_clock: Callable[[], float] = time.monotonic

# slug -> (fresh until, generation it was read under, link). Reads take no lock
# (single dict operations are atomic); inserts and clears do.
_entries: dict[str, tuple[float, int | None, CachedLink]] = {}
#: (fresh until, slug) in the order entries were read, which is the order they fall
#: due (a record whose entry was read again or evicted since is skipped).
_due: deque[tuple[float, str]] = deque()
#: Slugs served since their entry was last read: re-read when due, the others dropped.
_used: set[str] = set()
_lock = threading.Lock()
#: The newest ShortLinkGeneration value this process has seen (None: not read yet).
_generation: int | None = None
_poll_failing = False


_FIELDS = ("pk", "slug", "destination", "disabled", "disabled_reason")
#: Entries refresh_due reads per poll: 2,000 a second at the default poll, enough
#: for a full cache (50,000) within its 60 s TTL.
_REFRESH_PER_POLL = 1000


def _read(slug: str) -> CachedLink | None:
    row = ShortLink.objects.filter(slug=slug).values_list(*_FIELDS).first()
    return None if row is None else CachedLink(*row)


def get(slug: str) -> CachedLink | None:
    """The link named `slug`, or None when there is none; LinkUnavailable when it
    is not cached and the database cannot be read."""
    if poller.thread is None:
        poller.start()
    generation = _generation
    entry = _entries.get(slug)
    if entry is not None and entry[1] == generation:
        until = entry[0]
        now = _clock()
        # Past its TTL, the polling thread is re-reading it (for up to another TTL;
        # beyond that, or with no thread, this request reads it itself).
        if now < until or (poller.running() and now < until + conf.LINK_CACHE_TTL):
            _used.add(slug)
            return entry[2]
    try:
        link = _read(slug)
    except DatabaseError as exc:
        if entry is not None and entry[1] == generation:
            # Past its TTL, but no change to it was announced: serve it.
            return entry[2]
        raise LinkUnavailable(
            f"short link /{slug} is not cached and the database failed: {exc}"
        ) from exc
    if link is None:
        return None
    with _lock:
        size = conf.LINK_CACHE_SIZE
        while len(_entries) >= size:
            # Oldest first: a hot link evicted this way costs one query to come back.
            evicted = next(iter(_entries))
            del _entries[evicted]
            _used.discard(evicted)
        # Under the generation read before the query: if a change was announced
        # meanwhile this entry is stale on arrival, and the next get reads again.
        _keep(slug, _clock() + conf.LINK_CACHE_TTL, generation, link)
        if len(_due) > 2 * size:
            _compact_due()
    _used.add(slug)
    return link


def _keep(slug: str, until: float, generation: int | None, link: CachedLink) -> None:
    # Caller holds _lock.
    _entries[slug] = (until, generation, link)
    if _due and until < _due[-1][0]:
        bisect.insort(_due, (until, slug))  # the TTL was lowered: keep due order
    else:
        _due.append((until, slug))


def _compact_due() -> None:
    # Caller holds _lock. Misses that evict (a cache smaller than the links in use)
    # leave records of entries long gone: keep one per live entry.
    global _due
    _due = deque(sorted((entry[0], slug) for slug, entry in _entries.items()))
    _used.intersection_update(_entries)


def refresh_due() -> int:
    """Re-read the entries that fall due within two polls and were served since they
    were read, at most _REFRESH_PER_POLL of them (the rest wait for the next poll,
    served as they are meanwhile, so that a change announced by the generation is not
    held up behind a long refresh); drop the due ones nobody asked for, and those
    whose row is gone. Returns the entries read. Raises what the read raised, keeping
    them due (the next poll retries)."""
    horizon = _clock() + 2 * conf.LINK_CACHE_POLL
    records: list[tuple[float, str]] = []
    with _lock:
        generation = _generation
        while _due and _due[0][0] <= horizon and len(records) < _REFRESH_PER_POLL:
            until, slug = _due.popleft()
            entry = _entries.get(slug)
            if entry is None or entry[0] != until:
                continue
            if slug in _used:
                records.append((until, slug))
            else:
                del _entries[slug]  # not asked for in a whole TTL: not worth a read
    if not records:
        return 0
    try:
        fresh = _read_many([slug for _, slug in records])
    except Exception:
        with _lock:
            _due.extendleft(reversed(records))
        raise
    until = _clock() + conf.LINK_CACHE_TTL
    with _lock:
        if _generation != generation:
            return 0  # a poll elsewhere (tests) moved it and read every entry again
        for _, slug in records:
            _used.discard(slug)
            if slug not in _entries:
                continue  # evicted meanwhile
            # Read after `generation` was known, as get() labels what it reads.
            link = fresh.get(slug)
            if link is None:
                del _entries[slug]  # deleted behind the ORM's back: the next get says so
            else:
                _keep(slug, until, generation, link)
        if len(_used) > len(_entries):
            # Slugs served just as their entry was dropped or evicted.
            _used.intersection_update(_entries)
    return len(records)


def _read_many(slugs: list[str]) -> dict[str, CachedLink]:
    fresh: dict[str, CachedLink] = {}
    for batch in database.in_batches(slugs):
        rows = ShortLink.objects.filter(slug__in=batch)
        for row in rows.values_list(*_FIELDS):
            fresh[row[1]] = CachedLink(*row)
    return fresh


def poll() -> bool:
    """Read the generation once; when it moved, read every cached link again (a few
    IN queries here, off the request path) and keep the fresh copies. True if it
    moved. Raises DatabaseError, leaving the cache as it was (the next poll retries).

    Refreshed rather than dropped: after one edit, a database that goes away must
    not take every other cached link with it (they would all answer 503)."""
    global _generation
    value = ShortLinkGeneration.objects.filter(pk=1).values_list("value", flat=True).first() or 0
    if value == _generation:
        return False
    # Read after the generation: every change up to `value` is committed, so visible.
    fresh = _read_many(list(_entries))
    until = _clock() + conf.LINK_CACHE_TTL
    with _lock:
        # An entry a request added meanwhile carries the old generation: read again.
        _entries.clear()
        _due.clear()
        for slug, link in fresh.items():
            _keep(slug, until, value, link)
        _used.intersection_update(_entries)
        _generation = value
    return True


def _interval() -> float:
    try:
        return conf.LINK_CACHE_POLL
    except Exception:  # a bad setting (the system check names it) must not end the loop
        return 0.5


def _loop(stopped: threading.Event) -> None:
    global _poll_failing
    try:
        while not stopped.is_set():
            poller.wait(_interval())
            if stopped.is_set():
                break
            try:
                poll()
                refresh_due()
                if _poll_failing:
                    log.info("short-link cache: the database answers again")
                _poll_failing = False
            except Exception as exc:
                if not _poll_failing:
                    log.warning(
                        "short-link cache: cannot read link changes (%s); serving the "
                        "cached links as they are until the database answers",
                        exc,
                    )
                _poll_failing = True
                with contextlib.suppress(Exception):
                    connections.close_all()
    finally:
        with contextlib.suppress(Exception):
            connections.close_all()


#: The polling thread, started by the first get() of a process.
poller = Daemon("urlguard-link-cache", _loop)


def set_background(enabled: bool) -> None:
    """Tests: False keeps the polling thread from starting (they call poll())."""
    poller.enabled = enabled


@on_reset
def reset() -> None:
    """Forget every cached link and the generation (tests)."""
    global _generation
    with _lock:
        _entries.clear()
        _due.clear()
        _used.clear()
        _generation = None


def stop(timeout: float = 5.0) -> None:
    poller.stop(timeout)


def _after_fork_in_child() -> None:
    # (runtime.process has forgotten the parent's poller by now.)
    global _lock
    _lock = threading.Lock()
    _compact_due()  # the parent's poller may have been mid-refresh, its records popped


os.register_at_fork(after_in_child=_after_fork_in_child)
