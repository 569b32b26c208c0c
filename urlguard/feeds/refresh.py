"""Refreshing a source: fetch, read its entries, diff them against what this source
listed last time (RuleSource, as 64-bit keys, so a million entries diff as two numpy
arrays), and apply only the difference through urlguard.changes in one change set:
new entries become rules or gain this source, entries that left lose it, and a rule
goes only when no source lists it any more.

A broken upstream never removes protection: a failed fetch, a body that is cut
short, undecodable or of the wrong kind, or zero entries changes nothing and is
recorded; a refresh that would remove more than FEED_SHRINK_THRESHOLD of the
source's entries is held until accepted. Two refreshes of one source at once: the
second finds the source claimed and does nothing (and were both to apply, the writes
are idempotent: an addition of a listed rule only adds a listing, a withdrawal of a
listing that is gone does nothing)."""

from __future__ import annotations

import logging
import tempfile
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
from django.db.models import F, Q
from django.utils import timezone

from urlguard import changes
from urlguard.conf import conf
from urlguard.feeds import allowlist, formats
from urlguard.feeds.decoding import FeedError, open_text
from urlguard.feeds.fetching import FetchSettings, TransientFeedError, fetch
from urlguard.models import (
    AllowedHost,
    ChangeSet,
    FeedRefresh,
    RuleSource,
    Source,
    expression_key,
)

logger = logging.getLogger(__name__)

__all__ = ["RefreshResult", "accept_held", "due_sources", "refresh_source"]

# Refused entries kept (with line and reason) for the history page; all are counted.
MAX_REFUSALS_KEPT = 50
_FETCH_ROWS = 20_000


@dataclass
class RefreshResult:
    """What one refresh did (or, with dry_run or held, would do)."""

    source: str
    status: str = Source.Status.OK
    http_status: int | None = None
    bytes: int = 0
    format: str = ""
    entries: int = 0  # distinct entries the source lists now
    added: int = 0  # entries new to this source
    removed: int = 0  # entries that left this source
    unchanged: int = 0
    refused: int = 0
    rules_added: int = 0  # rows written: rules that were listed by no other source
    rules_removed: int = 0  # rules no source lists any more
    duration: float = 0.0
    error: str = ""
    transient: bool = False  # a retry may help (network, timeout, 5xx)
    change_set: int | None = None
    refusals: list[tuple[int, str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        if self.status == Source.Status.FAILED:
            return f"{self.source}: failed: {self.error}"
        if self.status == Source.Status.NOT_MODIFIED:
            return f"{self.source}: not modified"
        if self.status == "busy":
            return f"{self.source}: another refresh of it is running; skipped"
        head = {
            Source.Status.HELD: "HELD (shrink over FEED_SHRINK_THRESHOLD; nothing applied)",
            "dry-run": "dry run (nothing applied)",
        }.get(self.status, "ok")
        return (
            f"{self.source}: {head}: {self.entries:,} entries ({self.format}), "
            f"+{self.added:,} -{self.removed:,} ={self.unchanged:,}, {self.refused:,} refused; "
            f"rules written: +{self.rules_added:,} -{self.rules_removed:,}; "
            f"{self.duration:.2f} s"
        )


def fetch_settings() -> FetchSettings:
    return FetchSettings(
        connect_timeout=float(conf.FEED_CONNECT_TIMEOUT),
        read_timeout=float(conf.FEED_READ_TIMEOUT),
        deadline=float(conf.FEED_DEADLINE),
        max_bytes=int(conf.FEED_MAX_BYTES),
        max_redirects=int(conf.FEED_MAX_REDIRECTS),
    )


def due_sources() -> list[Source]:
    """Enabled feeds whose interval has passed since their last refresh."""
    now = timezone.now()
    due = []
    for source in Source.objects.filter(kind=Source.Kind.FEED, enabled=True).exclude(url=""):
        last = source.last_refresh_at
        if last is None or last + timedelta(seconds=source.interval) <= now:
            due.append(source)
    return due


# -- the refresh ----------------------------------------------------------------------


def refresh_source(
    source: Source,
    *,
    dry_run: bool = False,
    accept_shrink: bool = False,
    user: Any = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> RefreshResult:
    """Refresh `source` once. Never raises for the feed's own faults: they come back
    as a result with status "failed" (recorded on the source unless `dry_run`)."""
    started = time.perf_counter()
    result = RefreshResult(source=source.name)
    if not source.is_feed or not source.url:
        result.status, result.error = Source.Status.FAILED, "not a feed (no URL to fetch)"
        return result
    if not dry_run and not _claim(source):
        result.status = "busy"
        return result
    staged: _Staged | None = None
    try:
        report = progress or (lambda stage, done, total: None)
        report("fetching", 0, 0)
        fetched = fetch(
            source.url,
            etag=source.etag,
            last_modified=source.last_modified,
            settings=fetch_settings(),
        )
        result.http_status, result.bytes = fetched.status, fetched.size
        if fetched.body is None:
            result.status = Source.Status.NOT_MODIFIED
            result.duration = time.perf_counter() - started
            if not dry_run:
                _record(source, result)
            return result
        report("reading", 0, 0)
        with fetched.body:
            staged = _stage(fetched.body, source, result)
        result.entries = staged.count()
        if result.entries == 0:
            raise FeedError(
                f"no entries in the body ({result.refused:,} refused): an empty or wrong "
                "list is never taken for a source that listed nothing"
            )
        if source.is_allowlist:
            _apply_allowlist(source, staged, result, dry_run=dry_run)
        else:
            _diff_and_apply(
                source,
                staged,
                result,
                dry_run=dry_run,
                accept_shrink=accept_shrink,
                user=user,
                report=report,
            )
        if dry_run and result.status == Source.Status.OK:
            result.status = "dry-run"
        if not dry_run:
            if result.status == Source.Status.OK:
                source.etag, source.last_modified = fetched.etag, fetched.last_modified
            result.duration = time.perf_counter() - started
            _record(source, result)
    except FeedError as exc:
        result.status, result.error = Source.Status.FAILED, str(exc)
        result.transient = isinstance(exc, TransientFeedError)
        result.duration = time.perf_counter() - started
        logger.warning("feed %s: refresh failed, nothing changed: %s", source.name, exc)
        if not dry_run:
            _record(source, result)
    finally:
        if staged is not None:
            staged.close()
        if not dry_run:
            Source.objects.filter(pk=source.pk).update(refreshing_since=None)
    result.duration = time.perf_counter() - started
    if result.status not in (Source.Status.FAILED, "busy"):
        logger.info("feed %s", result.summary())
    return result


def accept_held(source: Source, *, user: Any = None) -> RefreshResult:
    """Apply the held shrink of `source`: a refresh that accepts it (fetched again,
    so what is applied is the source as it is now, with its numbers recorded)."""
    return refresh_source(source, accept_shrink=True, user=user)


def _claim(source: Source) -> bool:
    now = timezone.now()
    stale = now - timedelta(seconds=float(conf.FEED_CLAIM_TIMEOUT))
    return bool(
        Source.objects.filter(pk=source.pk)
        .filter(Q(refreshing_since__isnull=True) | Q(refreshing_since__lt=stale))
        .update(refreshing_since=now)
    )


# -- reading the body into a diffable form --------------------------------------------


class _Staged:
    """The accepted entries of one body: their keys (in entry order, repeats
    included) and a spool file of "category<TAB>expression" lines, one per key."""

    def __init__(self) -> None:
        self.keys = array("q")
        # Closed by close(), which refresh_source always calls.
        self.spool = tempfile.TemporaryFile(  # noqa: SIM115
            "w+", encoding="utf-8", prefix="urlguard-entries-"
        )

    def count(self) -> int:
        """Distinct entries."""
        return len(np.unique(np.frombuffer(self.keys, dtype=np.int64))) if self.keys else 0

    def add(self, expression: str, category: str) -> None:
        self.keys.append(expression_key(expression))
        self.spool.write(f"{category}\t{expression}\n")

    def lines(self, picked: np.ndarray) -> Iterator[tuple[str, str]]:
        """(expression, category) of the entries whose index `picked` marks."""
        self.spool.flush()
        self.spool.seek(0)
        for index, line in enumerate(self.spool):
            if picked[index]:
                category, _, expression = line.rstrip("\n").partition("\t")
                yield expression, category

    def close(self) -> None:
        self.spool.close()


def _stage(body: Any, source: Source, result: RefreshResult) -> _Staged:
    staged = _Staged()
    protected = allowlist.load() if not source.is_allowlist else allowlist.Allowlist({})
    try:
        with open_text(body, limit=int(conf.FEED_MAX_BYTES)) as text:
            result.format, entries = formats.parse(text, source.format, source.category)  # type: ignore[arg-type]
            for parsed in entries:
                reason = parsed.error
                if reason is None and parsed.expression is not None:
                    reason = protected.refusal(parsed.expression)
                if reason is not None:
                    result.refused += 1
                    if len(result.refusals) < MAX_REFUSALS_KEPT:
                        result.refusals.append((parsed.lineno, parsed.raw[:300], reason))
                    continue
                if parsed.expression is not None:
                    staged.add(parsed.expression, parsed.category or source.category)
    except BaseException:
        staged.close()
        raise
    return staged


# -- applying -------------------------------------------------------------------------


def _listed_now(source: Source) -> tuple[np.ndarray, np.ndarray]:
    """(keys, rule ids) of what `source` lists now."""
    keys, ids = array("q"), array("q")
    rows = RuleSource.objects.filter(source=source).values_list("key", "rule_id")
    for key, rule_id in rows.iterator(chunk_size=_FETCH_ROWS):
        keys.append(key)
        ids.append(rule_id)
    return np.frombuffer(keys, dtype=np.int64), np.frombuffer(ids, dtype=np.int64)


def _diff_and_apply(
    source: Source,
    staged: _Staged,
    result: RefreshResult,
    *,
    dry_run: bool,
    accept_shrink: bool,
    user: Any,
    report: Callable[[str, int, int], None],
) -> None:
    keys = np.frombuffer(staged.keys, dtype=np.int64)
    unique, first = np.unique(keys, return_index=True)
    old_keys, old_ids = _listed_now(source)
    new_mask = ~np.isin(unique, old_keys, assume_unique=True)
    gone_mask = ~np.isin(old_keys, unique, assume_unique=True)
    result.added = int(new_mask.sum())
    result.removed = int(gone_mask.sum())
    result.unchanged = len(unique) - result.added
    threshold = float(conf.FEED_SHRINK_THRESHOLD)
    if len(old_keys) and result.removed > threshold * len(old_keys) and not accept_shrink:
        result.status = Source.Status.HELD
        if not dry_run:
            logger.warning(
                "feed %s: refresh held: it would remove %d of %d entries (over "
                "FEED_SHRINK_THRESHOLD=%s); accept it in the admin or with "
                "`manage.py refresh_feeds %s --accept-shrink`",
                source.name,
                result.removed,
                len(old_keys),
                threshold,
                source.name,
            )
        return
    if dry_run:
        return
    picked = np.zeros(len(keys), dtype=bool)
    picked[first[new_mask]] = True
    total = result.added + result.removed
    with changes.change_set(
        kind=ChangeSet.Kind.REFRESH,
        actor=user,
        source=source,
        reason=f"refresh of {source.url}" + (" (shrink accepted)" if accept_shrink else ""),
    ) as cs:
        result.change_set = cs.pk
        if result.added:
            bulk = changes.add_rules(
                (pair for pair in staged.lines(picked)),
                source=source,
                user=user,
                category=source.category,
                change_set=cs,
                normalized=True,
                progress=lambda done: report("adding", done, total),
            )
            result.rules_added = len(bulk.added)
        if result.removed:
            withdrawn = changes.withdraw_rules(
                source, old_ids[gone_mask].tolist(), user=user, change_set=cs
            )
            result.rules_removed = withdrawn.removed
        changes.record_refused(cs, result.refused)
    report("done", total, total)


def _apply_allowlist(
    source: Source, staged: _Staged, result: RefreshResult, *, dry_run: bool
) -> None:
    """An allowlist's entries are hosts, never rules: replace its AllowedHost rows."""
    hosts = {expression.partition("/")[0] for expression, _ in staged.lines(_all(staged))}
    present = set(AllowedHost.objects.filter(source=source).values_list("host", flat=True))
    result.entries = len(hosts)
    result.added = len(hosts - present)
    result.removed = len(present - hosts)
    result.unchanged = len(hosts & present)
    if dry_run:
        return
    AllowedHost.objects.filter(source=source, host__in=present - hosts).delete()
    AllowedHost.objects.bulk_create(
        [AllowedHost(source=source, host=host) for host in sorted(hosts - present)],
        ignore_conflicts=True,
    )


def _all(staged: _Staged) -> np.ndarray:
    return np.ones(len(staged.keys), dtype=bool)


def _record(source: Source, result: RefreshResult) -> None:
    """Write the refresh's outcome on the source row (only these fields: an admin may
    be editing the others)."""
    now = timezone.now()
    fields: dict[str, Any] = {
        "last_refresh_at": now,
        "last_status": result.status,
        "last_http_status": result.http_status,
        "last_duration": round(result.duration, 3),
        "last_error": result.error[:10_000],
    }
    if result.status == Source.Status.FAILED:
        fields["failures"] = F("failures") + 1
    else:
        fields["failures"] = 0
        fields["last_success_at"] = now
    if result.status in (Source.Status.OK, Source.Status.HELD):
        fields.update(
            last_bytes=result.bytes,
            last_entries=result.entries,
            last_added=result.added,
            last_removed=result.removed,
            last_unchanged=result.unchanged,
            last_refused=result.refused,
        )
    if result.status == Source.Status.OK:
        fields.update(
            etag=source.etag[:500],
            last_modified=source.last_modified[:100],
            held_at=None,
            held_entries=None,
            held_added=None,
            held_removed=None,
        )
    elif result.status == Source.Status.HELD:
        fields.update(
            held_at=now,
            held_entries=result.entries,
            held_added=result.added,
            held_removed=result.removed,
        )
    Source.objects.filter(pk=source.pk).update(**fields)
    source.refresh_from_db(fields=list(fields))
    FeedRefresh.objects.create(
        source=source,
        status=result.status,
        http_status=result.http_status,
        bytes=result.bytes,
        format=result.format,
        entries=result.entries,
        added=result.added,
        removed=result.removed,
        unchanged=result.unchanged,
        refused=result.refused,
        rules_added=result.rules_added,
        rules_removed=result.rules_removed,
        duration=round(result.duration, 3),
        error=result.error[:10_000],
        change_set_id=result.change_set,
        refusals=[list(r) for r in result.refusals],
    )
