"""Refreshing a source: fetch, read its entries, diff them against what this source
listed last time (RuleSource, as 64-bit keys, so a million entries diff as two numpy
arrays), and apply only the difference in one change set: new entries become rules
or gain this source, entries that left lose it, and a rule goes only when no source
lists it any more.

A refresh is a plan, then an apply. Reading is two passes. What the source lists
and its memo (urlguard.feeds.memo) are read first; the body is then split into
units (lines, or a structured format's entries) a block at a time, each unit's text
looked up in the memo as it is read, and only the texts it does not know, or whose
rule this source no longer lists, are kept for the second pass, which parses and
normalizes them (urlguard.feeds.staging; a body of millions of entries is staged
in partitions on disk instead, urlguard.feeds.partitions, so that its memory is a
partition's, not the feed's). urlguard.feeds.planning diffs and
screens the result into a listing plan, data only, which
urlguard.writepath.apply.apply_listing writes; the write path never calls back here.

A broken upstream never removes protection: a failed fetch, a body that is cut
short, undecodable or of the wrong kind, or zero entries changes nothing and is
recorded; a refresh that would remove more than FEED_SHRINK_THRESHOLD of the
source's entries is held until accepted. Two refreshes of one source at once: the
second finds the source claimed and does nothing (and were both to apply, the writes
are idempotent: an addition of a listed rule only adds a listing, a withdrawal of a
listing that is gone does nothing).

This module is the orchestration; what the source lists now is
urlguard.feeds.listing's, and how a refresh ended urlguard.feeds.outcome's."""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np
from django.db import DatabaseError, router, transaction
from django.db.models import F
from django.utils import timezone

from urlguard.conf import conf
from urlguard.feeds import holds, listing, memo, partitions, planning, staging
from urlguard.feeds.decoding import FeedError
from urlguard.feeds.fetching import FetchSettings, TransientFeedError, fetch
from urlguard.feeds.outcome import RefreshResult, RefreshStatus, refuse
from urlguard.feeds.planning import IMPACT_HOLD
from urlguard.feeds.staging import Staged
from urlguard.jobs.rescans import rescan_after_adding
from urlguard.models import Actor, AllowedHost, ChangeSet, FeedRefresh, Source
from urlguard.runtime import ownership
from urlguard.writepath import allowlist, changes
from urlguard.writepath.apply import Applied, apply_listing

logger = logging.getLogger(__name__)

__all__ = [
    "RefreshResult",
    "RefreshStatus",
    "accept_held",
    "due_sources",
    "held_for_impact",
    "refresh_source",
]


def fetch_settings() -> FetchSettings:
    return FetchSettings(
        connect_timeout=conf.FEED_CONNECT_TIMEOUT,
        read_timeout=conf.FEED_READ_TIMEOUT,
        deadline=conf.FEED_DEADLINE,
        max_bytes=conf.FEED_MAX_BYTES,
        max_redirects=conf.FEED_MAX_REDIRECTS,
        file_root=conf.FEED_FILE_ROOT,
        allowed_networks=conf.FEED_ALLOWED_NETWORKS,
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
    accept_impact: bool = False,
    actor: Actor = None,
    progress: Callable[[str, int, int], None] | None = None,
    job: int | None = None,
) -> RefreshResult:
    """Refresh `source` once. Never raises for the feed's own faults: they come back
    as a result with status "failed" (recorded on the source unless `dry_run`).

    A refresh is held whole for a shrink (more than FEED_SHRINK_THRESHOLD of the
    source's entries removed, or drained below its high-water mark) unless
    `accept_shrink`, and for its impact (more than CONFIRM_IMPACT_LINKS short links
    blocked) unless `accept_impact`: each acceptance covers only its own hold.
    `job`: the AdminJob whose row the apply writes its progress to."""
    started = time.perf_counter()
    result = RefreshResult(source=source.name)
    if not source.is_feed or not source.url:
        result.status, result.error = RefreshStatus.FAILED, "not a feed (no URL to fetch)"
        return result
    owner = str(ownership.me())
    if not dry_run:
        busy = _claim(source, owner)
        if busy:
            result.status, result.error = RefreshStatus.BUSY, busy
            return result
    staged: Staged | None = None
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
            result.status = RefreshStatus.NOT_MODIFIED
            result.duration = time.perf_counter() - started
            if not dry_run:
                _record(source, result)
            return result
        protected = allowlist.load() if not source.is_allowlist else allowlist.Allowlist({})
        size = partitions.estimate(fetched.body, fetched.size, source)
        with fetched.body, staging.opened(fetched.body, source, result) as body:
            # The listing and the memo before the body: the units the memo knows
            # (and whose rules the source lists) are resolved as they are read.
            report("listing", 0, 0)
            listed = listing.listed_keys(source)
            listed_count = len(listed)
            stamp = memo.stamp(body.format, protected.digest())
            report("reading", 0, 0)
            staged, remembered = _stage(body, source, result, stamp, listed, size)
            del listed  # a Staged keeps it, a Partitioned on disk
        _give_back_memory()  # the body's blocks, between the arrays of each step
        report("normalizing", staged.known, len(staged))
        staged.resolve(protected, result)
        if not dry_run and not source.is_allowlist:
            _remember(staged, source, stamp, remembered)
        del remembered
        _give_back_memory()
        staged.forget_units()
        result.entries = staged.count()
        if result.entries == 0:
            raise FeedError(
                f"no entries in the body ({result.refused:,} refused): an empty or wrong "
                "list is never taken for a source that listed nothing"
            )
        if source.is_allowlist:
            _apply_allowlist(source, staged, result, dry_run=dry_run, actor=actor)
        else:
            _diff_and_apply(
                source,
                staged,
                listed_count,
                result,
                dry_run=dry_run,
                accept_shrink=accept_shrink,
                accept_impact=accept_impact,
                actor=actor,
                report=report,
                job=job,
            )
        if dry_run and result.status == RefreshStatus.OK:
            result.status = RefreshStatus.DRY_RUN
        if not dry_run and result.status == RefreshStatus.OK and not source.is_allowlist:
            unchanged = allowlist.load().digest() == staged.allowlist_digest
            allowlist.record_refusals(source, staged.allowlisted, forget=unchanged)
        if not dry_run:
            if result.status == RefreshStatus.OK:
                source.etag, source.last_modified = fetched.etag, fetched.last_modified
            result.duration = time.perf_counter() - started
            _record(source, result)
            if result.rules_added and _may_block_links(result.impact):
                result.rescan_job = _start_rescan(actor)
    except FeedError as exc:
        result.status, result.error = RefreshStatus.FAILED, str(exc)
        result.transient = isinstance(exc, TransientFeedError)
        result.duration = time.perf_counter() - started
        logger.warning("feed %s: refresh failed, nothing changed: %s", source.name, exc)
        if not dry_run:
            _record(source, result)
    except Exception as exc:
        # Recorded like a feed's own fault, so that FEED_UNHEALTHY_FAILURES trips and
        # the source is not fetched again as if it had never been tried.
        result.status = RefreshStatus.FAILED
        result.error = f"the refresh stopped on an unexpected error: {type(exc).__name__}: {exc}"
        result.duration = time.perf_counter() - started
        logger.exception("feed %s: refresh failed on an unexpected error", source.name)
        if not dry_run:
            _record(source, result)
    finally:
        if staged is not None:
            staged.close()
            staged = None
            _give_back_memory()
        if not dry_run:
            # Only our own claim: one taken over from us is the new owner's.
            Source.objects.filter(pk=source.pk, refresh_owner=owner).update(
                refreshing_since=None, refresh_owner="", refresh_heartbeat=None
            )
    result.duration = time.perf_counter() - started
    if result.status not in (RefreshStatus.FAILED, RefreshStatus.BUSY):
        logger.info("feed %s", result.summary())
    return result


def _stage(
    body: staging.Opened,
    source: Source,
    result: RefreshResult,
    stamp: str,
    listed: np.ndarray,
    size: int,
) -> tuple[Staged, memo.Memo | None]:
    """`body` staged, and the memo it was staged with when it is held whole: a body
    of more entries than partitions.PARTITION_ENTRIES (by its listing, its memo or
    its size) is staged in partitions on disk, a smaller one in memory."""
    if source.is_allowlist:
        return staging.stage(body, source, result, None, listed), None
    file = memo.open_file(source.pk, stamp)
    parts = partitions.partitions_for(max(len(listed), len(file) if file else 0, size))
    if parts > 1:
        into = partitions.Partitioned(body.format, source.category, parts, file, listed)
        return staging.stage(body, source, result, into=into), None
    if file is not None:
        file.close()
    remembered = memo.load(source.pk, stamp)
    return staging.stage(body, source, result, remembered, listed), remembered


def _remember(staged: Staged, source: Source, stamp: str, remembered: memo.Memo | None) -> None:
    """Save the memo; it is a cache, so a disk that is full (or a folder that cannot be
    written) costs the next refresh its speed, never this refresh its result."""
    try:
        staged.remember(source.pk, stamp, remembered)
    except OSError as exc:
        logger.warning(
            "feed %s: the normalization memo (a cache) could not be saved, the refresh "
            "goes on and the next one normalizes every entry again: %s",
            source.name,
            exc,
        )
    try:
        memo.prune(lambda: Source.objects.values_list("pk", flat=True))
    except DatabaseError as exc:  # the refresh's own reads and writes say more
        logger.info("feed %s: deleted sources' memos not pruned: %s", source.name, exc)


def _may_block_links(impact: dict[str, Any] | None) -> bool:
    return impact is None or not impact["exact"] or impact["changed"] > 0


def _start_rescan(actor: Actor) -> int | None:
    """The rescan of the short links an import runs too, where the site has them."""

    person = actor if getattr(actor, "is_authenticated", False) else None
    job = rescan_after_adding(actor=person)
    return job.pk if job else None


def _give_back_memory() -> None:
    """Return the freed heap of a big refresh to the OS, which glibc keeps otherwise
    (bench/feeds.py, after a million-entry first load: 160 -> 138 MB resident)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to do
        return
    libc.malloc_trim(0)


def held_for_impact(held_reason: str) -> bool:
    """Whether a refresh's (or a source's) `held_reason` is an impact hold, which
    `accept_impact` accepts, rather than a shrink, which `accept_shrink` accepts."""
    return IMPACT_HOLD in held_reason


def accept_held(source: Source, *, actor: Actor = None) -> RefreshResult:
    """Apply the held refresh of `source`: a refresh that accepts what it was held
    for (its shrink, or its impact on the short links), nothing else (fetched again,
    so what is applied is the source as it is now, with its numbers recorded)."""
    if held_for_impact(source.held_reason):
        return refresh_source(source, accept_impact=True, actor=actor)
    return refresh_source(source, accept_shrink=True, actor=actor)


def _claim(source: Source, owner: str) -> str:
    """Claim `source` for a refresh by `owner`: "" when claimed, else who holds it. A
    claim whose owner is gone (urlguard.runtime.ownership), or older than FEED_CLAIM_TIMEOUT,
    is taken over at once."""
    held = (
        Source.objects.filter(pk=source.pk)
        .values_list("refreshing_since", "refresh_owner", "refresh_heartbeat")
        .first()
    )
    if held is None:
        return "the source was deleted"
    since, holder, heartbeat = held
    now = ownership.database_now()
    gone = ""
    if since is not None:
        # A claim of no recorded owner (made before claims named one) waits out
        # FEED_CLAIM_TIMEOUT.
        gone = ownership.gone_reason(holder, heartbeat, since) if holder else ""
        if not gone and since > now - timedelta(seconds=conf.FEED_CLAIM_TIMEOUT):
            beat = f", heartbeat {(now - (heartbeat or since)).total_seconds():.0f} s ago"
            return f"{ownership.describe(holder)} since {since:%Y-%m-%d %H:%M:%S}{beat}"
        gone = gone or f"claimed over FEED_CLAIM_TIMEOUT={conf.FEED_CLAIM_TIMEOUT:g} s ago"
    # Only the claim as read: another process may take it over at the same moment.
    taken = Source.objects.filter(
        pk=source.pk, refreshing_since=since, refresh_owner=holder
    ).update(refreshing_since=now, refresh_owner=owner, refresh_heartbeat=now)
    if not taken:
        return "claimed by another process a moment ago"
    if since is not None:
        logger.warning(
            "feed %s: took over the refresh claimed at %s (%s)", source.name, since, gone
        )
    ownership.beat_while_owned()
    return ""


# -- applying -------------------------------------------------------------------------


def _diff_and_apply(
    source: Source,
    staged: Staged,
    listed: int,
    result: RefreshResult,
    *,
    dry_run: bool,
    accept_shrink: bool,
    accept_impact: bool,
    actor: Actor,
    report: Callable[[str, int, int], None],
    job: int | None = None,
) -> None:
    """Plan the refresh (urlguard.feeds.planning) of `staged` for `source`, which
    lists `listed` entries, and unless it is held or a dry run, hand the plan to the
    write path and keep the entries held from it."""
    plan, held = planning.plan_listing(
        source,
        staged,
        listed,
        result,
        dry_run=dry_run,
        accept_shrink=accept_shrink,
        accept_impact=accept_impact,
        report=report,
    )
    if plan is None:
        return
    applied = Applied()
    try:
        report("writing", 0, plan.additions.count + len(plan.withdrawals))
        apply_listing(plan, actor=actor, job=job, applied=applied)
    finally:
        result.change_set = applied.change_set  # a partial set too, for the record
    result.rules_added, result.rules_removed = applied.rules_added, applied.rules_removed
    for expression, category, reason in applied.refused:
        refuse(result, 0, expression, reason)
        staged.allowlisted[expression] = category
    holds.record(source, held, staged.has)
    total = result.added + result.removed
    report("done", total, total)


def _apply_allowlist(
    source: Source, staged: Staged, result: RefreshResult, *, dry_run: bool, actor: Actor = None
) -> None:
    """An allowlist's entries are hosts, never rules: replace its AllowedHost rows, and
    act on the hosts that came and went as a person's allowlisting does."""
    everything = np.ones(len(staged.keys), dtype=bool)
    hosts = {expression.partition("/")[0] for expression, _ in staged.lines(everything)}
    present = set(AllowedHost.objects.filter(source=source).values_list("host", flat=True))
    result.entries = len(hosts)
    result.added = len(hosts - present)
    result.removed = len(present - hosts)
    result.unchanged = len(hosts & present)
    if dry_run:
        return
    with (
        transaction.atomic(using=router.db_for_write(AllowedHost)),
        changes.change_set(
            kind=ChangeSet.Kind.ALLOWLIST,
            actor=actor,
            source=source,
            reason=f"refresh of {source.url}",
        ) as cs,
    ):
        AllowedHost.objects.filter(source=source, host__in=present - hosts).delete()
        AllowedHost.objects.bulk_create(
            [AllowedHost(source=source, host=host) for host in sorted(hosts - present)],
            ignore_conflicts=True,
        )
        changes.record_allowlist(sorted(hosts ^ present), change_set=cs, actor=actor)
        if source.enabled:
            allowlist.release(sorted(present - hosts), change_set=cs, actor=actor)
            allowlist.enforce(sorted(hosts - present), change_set=cs, actor=actor)
    if cs.added or cs.removed or cs.events.exists():
        result.change_set = cs.pk
    else:
        cs.delete()


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
    if result.status == RefreshStatus.FAILED:
        fields["failures"] = F("failures") + 1
    else:
        fields["failures"] = 0
        fields["last_success_at"] = now
    if result.status in (RefreshStatus.OK, RefreshStatus.HELD):
        fields.update(
            last_bytes=result.bytes,
            last_entries=result.entries,
            last_added=result.added,
            last_removed=result.removed,
            last_unchanged=result.unchanged,
            last_refused=result.refused,
        )
    if result.status == RefreshStatus.OK:
        fields.update(
            etag=source.etag[:500],
            last_modified=source.last_modified[:100],
            held_reason="",
            held_at=None,
            held_entries=None,
            held_added=None,
            held_removed=None,
        )
    elif result.status == RefreshStatus.HELD:
        fields.update(
            held_at=now,
            held_reason=result.held_reason[:500],
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
        held=result.held,
        impact=result.impact or {},
    )
