"""Keeping this node's filter file equal to the spam table, without Celery: apply the
change log from the file's own high-water mark (exactly once, in seq order), and
rebuild from the table when the file cannot be trusted.

The work is defined by the file's applied_seq and the log, never by a message, so
the Celery tasks (urlguard.nodesync.tasks), the embedded catch-up thread and the management
commands all call in here, and a duplicate, late or lost nudge is harmless.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from itertools import groupby
from typing import Any

from django.db import connections, router, transaction
from django.db.models import Max, Min

from filterengine import (
    FilterFileError,
    FilterLockedError,
    FilterSpaceError,
    ScalingCountingBloomFilter,
)
from urlguard.conf import conf
from urlguard.models import ChangeEvent, SpamRule, database
from urlguard.nodesync import nodestatus, registry
from urlguard.runtime import metrics

logger = logging.getLogger(__name__)

__all__ = [
    "SyncResult",
    "Verification",
    "first_stage_capacity",
    "log_head",
    "rebuild",
    "restore",
    "sync",
    "sync_and_report",
    "verify",
    "verify_and_repair",
]

# Log rows applied per `with f.change()` (one dirty window, one DB round trip).
APPLY_CHUNK = 5000
# Rows fetched per round trip while streaming the table into a rebuild.
REBUILD_FETCH = 20_000
# Rules probed per contains_many call while verifying.
VERIFY_BATCH = 50_000
# Misses kept for the second look (one IN list; and the examples logged): enough to
# tell damaged counters from rules committed while we looked.
VERIFY_KEEP = database.IN_BATCH


@dataclass
class SyncResult:
    """What one sync did to this node's file."""

    path: str
    applied: int = 0  # log rows applied
    applied_seq: int = 0  # the file's high-water mark afterwards
    head: int = 0  # the log's newest seq when we looked
    rebuilt: str = ""  # why the file was rebuilt ("" = it was not)
    rules: int | None = None  # rules written by the rebuild
    rebuild_seconds: float | None = None
    skipped: bool = False  # the nudge was already satisfied: nothing opened for writing

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def log_head() -> int:
    """The newest seq in the change log (0 if empty): a primary-key lookup."""
    return ChangeEvent.objects.head()


def _mismatch(filt: ScalingCountingBloomFilter) -> str:
    """Why this open file cannot be brought up to date in place ("" if it can)."""
    if not filt.is_clean:
        return "the file is dirty (a writer died in the middle of a change)"
    capacity, error_rate = int(filt.capacity), float(filt.error_rate)
    # A rebuild may size the first stage above FILTER_CAPACITY (it is a minimum).
    if capacity < conf.FILTER_CAPACITY or abs(error_rate - conf.FILTER_ERROR_RATE) > 1e-12:
        return (
            f"the file was built with capacity={capacity}, error_rate={error_rate}, "
            f"but settings say FILTER_CAPACITY={conf.FILTER_CAPACITY}, "
            f"FILTER_ERROR_RATE={conf.FILTER_ERROR_RATE}"
        )
    return ""


def _too_many_stages(filt: ScalingCountingBloomFilter) -> str:
    stages = filt.stage_count
    if stages > conf.FILTER_MAX_STAGES:
        return (
            f"compacting {stages} stages into one (more than FILTER_MAX_STAGES="
            f"{conf.FILTER_MAX_STAGES} slow every lookup)"
        )
    return ""


def first_stage_capacity(rules: int) -> int:
    """The first stage of a rebuilt file: room for the rules it holds and the
    REBUILD_HEADROOM growth after them, so a large list is one stage, not many."""
    return max(conf.FILTER_CAPACITY, math.ceil(rules * conf.REBUILD_HEADROOM))


def _apply_pending(filt: ScalingCountingBloomFilter, result: SyncResult) -> None:
    """Apply every log row after the file's applied_seq, in seq order, in chunks;
    each chunk is one `change()` ending with the new high-water mark, so a crash
    leaves either the old mark or a dirty file (rebuilt), never a double count.

    Raises KeyError when a removal names a key the file does not hold (the file
    disagrees with the log)."""
    while True:
        events = list(
            ChangeEvent.objects.filter(seq__gt=filt.applied_seq)
            .order_by("seq")
            .values_list("seq", "action", "expression", "added_at")[:APPLY_CHUNK]
        )
        if not events:
            break
        with filt.change():
            # Consecutive rows of one action go in one vectorised call; keeping runs
            # in log order makes "add then remove the same rule" exact.
            for action, run in groupby(events, key=lambda e: e[1]):
                if action not in (ChangeEvent.Action.ADD, ChangeEvent.Action.REMOVE):
                    continue  # the allowlist's rows: the filter holds rules only
                rows = list(run)
                keys = [r[2] for r in rows]
                ids = [r[3] for r in rows]
                if action == ChangeEvent.Action.ADD:
                    filt.add_many(keys, ids)
                else:
                    filt.remove_many(keys, ids)
            filt.applied_seq = events[-1][0]
        result.applied += len(events)
        metrics.changes_applied(len(events))
    result.applied_seq = filt.applied_seq


@contextmanager
def _snapshot_transaction(using: str) -> Iterator[None]:
    """A transaction in which the table rows and max(seq) are read from one snapshot,
    so that the rebuilt file's applied_seq says exactly which changes it holds.
    (SQLite: any transaction reads one snapshot.)"""
    connection = connections[using]
    outer = connection.in_atomic_block
    with transaction.atomic(using=using):
        if not outer:
            database.repeatable_read(connection)
        else:
            # Inside someone's transaction the isolation level is fixed: hold
            # the writers off instead, with the lock they take.
            ChangeEvent.objects.lock_log(using)
        yield


def _stream_rules(using: str) -> Iterator[tuple[str, int]]:
    yield from (
        SpamRule.objects.using(using)
        .order_by("added_at")
        .values_list("expression", "added_at")
        .iterator(chunk_size=REBUILD_FETCH)
    )


def rebuild(
    path: str | None = None,
    *,
    writer: ScalingCountingBloomFilter | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[int, int]:
    """Write a new filter file from the spam table (aside, then atomically replaced;
    readers switch on their next check). `writer`: this process's open writer of
    `path`, which keeps the lock throughout and follows the new file; without one
    the lock is taken (bounded wait). Returns (rules, applied_seq)."""
    if path is None:
        path = conf.FILTER_PATH
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    using = router.db_for_read(SpamRule)
    with _snapshot_transaction(using):
        head = log_head()
        total = SpamRule.objects.using(using).count()
        rules = _build(
            path,
            _stream_rules(using),
            total=total,
            progress=progress,
            applied_seq=head,
            writer=writer,
        )
    return rules, head


def _build(
    path: str,
    pairs: Iterator[tuple[str, int]],
    *,
    total: int,
    progress: Callable[[int, int], None] | None,
    applied_seq: int,
    writer: ScalingCountingBloomFilter | None,
) -> int:
    """Build `path` from `pairs`; returns how many were written (the count the
    rebuild reports, and what `progress(done, total)` is told every REBUILD_FETCH rows)."""
    done = 0

    def counted() -> Iterator[tuple[str, int]]:
        nonlocal done
        for pair in pairs:
            yield pair
            done += 1
            if progress is not None and done % REBUILD_FETCH == 0:
                progress(done, total)

    timeout = conf.WRITER_LOCK_TIMEOUT
    try:
        ScalingCountingBloomFilter.build(
            path,
            counted(),
            capacity=first_stage_capacity(total),
            error_rate=conf.FILTER_ERROR_RATE,
            applied_seq=applied_seq,
            writer=writer,
            lock_timeout=timeout,
        )
    except FilterLockedError as exc:
        raise registry.WriterBusy.after(exc, timeout) from exc
    if progress is not None:
        progress(done, total)
    return done


def restore(source: str, path: str | None = None) -> SyncResult:
    """Put the backup `source` in place of this node's file, brought up to date: it
    is validated (a filter file, clean, made with this node's FILTER_CAPACITY and
    FILTER_ERROR_RATE, not ahead of the log), copied beside the file, the log after
    its applied_seq is replayed into the copy, and the copy atomically replaces the
    file (readers switch on their next check, never answering from the old state).
    ValueError (FilterFileError) says why a backup cannot be restored."""
    if path is None:
        path = conf.FILTER_PATH
    result = SyncResult(path=path)
    with ScalingCountingBloomFilter.open(source, readonly=True) as backup:
        reason = _mismatch(backup)
        head = log_head()
        if not reason and backup.applied_seq > head:
            reason = (
                f"it has applied change #{backup.applied_seq} but the change log ends at "
                f"#{head} (a file from another database?)"
            )
    if reason:
        raise FilterFileError(f"{source}: cannot be restored: {reason}; run rebuild_filter")

    def replay(copy: ScalingCountingBloomFilter) -> None:
        result.head = log_head()
        try:
            _apply_pending(copy, result)
        except KeyError as exc:
            raise FilterFileError(
                f"{source}: cannot be restored: the change log removes a rule it does not "
                f"hold ({_refusal(exc)}); run rebuild_filter"
            ) from exc

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    timeout = conf.WRITER_LOCK_TIMEOUT
    with registry.sync_lock(path):
        try:
            ScalingCountingBloomFilter.restore(path, source, catch_up=replay, lock_timeout=timeout)
        except FilterLockedError as exc:
            raise registry.WriterBusy.after(exc, timeout) from exc
        registry.clear_behind(path)
    registry.file_written(path)
    logger.warning(
        "restored filter %s from %s: %d change(s) after the backup replayed, now at #%d",
        path,
        source,
        result.applied,
        result.applied_seq,
    )
    return result


def _refusal(exc: KeyError) -> str:
    # The engine's KeyError carries a sentence naming the key; str() would quote it.
    return str(exc.args[0]) if exc.args else "?"


def _why_not_in_place(filt: ScalingCountingBloomFilter, result: SyncResult) -> str:
    """Apply the pending log to an open writer; return why the file must be rebuilt
    instead ("" when it is now current)."""
    reason = _mismatch(filt)
    if reason:
        return reason
    result.head = log_head()
    if filt.applied_seq > result.head:
        return (
            f"the file has applied_seq {filt.applied_seq} but the change log ends at "
            f"{result.head} (a file from another database?)"
        )
    try:
        _apply_pending(filt, result)
    except KeyError as exc:
        return (
            f"the log removes a rule the file does not hold ({_refusal(exc)}): the file "
            "disagrees with the log"
        )
    return ""


def sync(
    up_to_seq: int | None = None,
    *,
    path: str | None = None,
    force_rebuild: str = "",
    compact: bool = False,
    progress: Callable[[int, int], None] | None = None,
    lock_timeout: float | None = None,
) -> SyncResult:
    """Bring this node's filter file up to the head of the change log.

    `up_to_seq` (from a nudge) lets a duplicate or late delivery return without
    opening the file for writing; otherwise everything pending is applied, not only
    up to `up_to_seq`. A missing, dirty, corrupt or differently configured file, a
    file ahead of the log, or a removal the file cannot honour is rebuilt from the
    table (logged at WARNING with the reason), then the log after the rebuild's
    snapshot is replayed. `force_rebuild` (a reason) rebuilds unconditionally;
    `compact` rebuilds a file of more than FILTER_MAX_STAGES stages. Another sync
    of the file is waited for at most `lock_timeout` seconds (default
    WRITER_LOCK_TIMEOUT), then WriterBusy."""
    if path is None:
        path = conf.FILTER_PATH
    result = SyncResult(path=path)
    if up_to_seq is not None and not force_rebuild:
        current = registry.get_filter(path)
        if current is not None and current.is_clean and current.applied_seq >= up_to_seq:
            result.applied_seq = current.applied_seq
            result.skipped = True
            return result
    # Under the node's sync lock, so that two processes facing a missing or
    # unreadable file decide one after the other, and the second finds it rebuilt.
    with registry.sync_lock(path, timeout=lock_timeout):
        try:
            _sync_locked(path, result, force_rebuild, compact, progress, lock_timeout)
        except Exception as exc:
            if _out_of_space(exc):
                logger.error(
                    "filter %s cannot take the committed changes (%s): this node answers "
                    "from the spam table until a catch-up succeeds",
                    path,
                    exc,
                )
                registry.mark_behind(path, f"{type(exc).__name__}: {exc}")
            raise
        registry.clear_behind(path)
    registry.file_written(path)
    if result.applied:
        logger.info(
            "filter %s: applied %d change(s), now at #%d", path, result.applied, result.applied_seq
        )
    return result


def _sync_locked(
    path: str,
    result: SyncResult,
    force_rebuild: str,
    compact: bool,
    progress: Callable[[int, int], None] | None,
    lock_timeout: float | None,
) -> None:
    try:
        filt: ScalingCountingBloomFilter | None = registry.open_writer(path, timeout=lock_timeout)
        reason = force_rebuild
    except FileNotFoundError:
        filt, reason = None, force_rebuild or "the file is missing"
    except registry.WriterBusy:
        raise
    except FilterFileError as exc:
        filt, reason = None, force_rebuild or f"the file is unreadable: {exc}"
    try:
        if filt is not None:
            _sweep_temps(filt)
        if filt is not None and not reason:
            reason = _why_not_in_place(filt, result)
            if not reason and compact:
                force_rebuild = reason = _too_many_stages(filt)
        if reason:
            _logged_rebuild(
                path, reason, result, writer=filt, progress=progress, forced=bool(force_rebuild)
            )
            if filt is None:
                filt = registry.open_writer(path, timeout=lock_timeout)
            try:
                _apply_pending(filt, result)  # whatever was committed after the snapshot
            except KeyError as exc:
                raise RuntimeError(
                    f"{path}: the change log after the rebuild's snapshot removes a rule the "
                    f"spam table did not hold ({_refusal(exc)}): rules were changed outside "
                    "urlguard.writepath.changes (raw SQL?); `manage.py rebuild_filter` "
                    "rebuilds from the table as it is now"
                ) from exc
            result.head = max(result.head, log_head())
    finally:
        if filt is not None:
            filt.close()  # flushes: durable, and marked clean


def _sweep_temps(filt: ScalingCountingBloomFilter) -> None:
    """Remove what a killed rebuild left beside the file: on a nearly full disk it is
    the room the next stage needs. (A rebuild sweeps too; this covers the syncs and
    catch-ups between rebuilds.)"""
    try:
        removed = filt.remove_stale_temps()
    except OSError as exc:
        logger.warning("could not remove stale temp files beside %s: %s", filt.path, exc)
        return
    if removed:
        logger.warning(
            "removed %d temp file(s) a killed rebuild left beside %s: %s",
            len(removed),
            filt.path,
            ", ".join(os.path.basename(p) for p in removed),
        )


def _out_of_space(exc: BaseException) -> bool:
    if isinstance(exc, FilterSpaceError):
        return True
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _logged_rebuild(
    path: str,
    reason: str,
    result: SyncResult,
    *,
    writer: ScalingCountingBloomFilter | None,
    progress: Callable[[int, int], None] | None,
    forced: bool,
) -> None:
    # A rebuild someone asked for is news; one forced by the file's state is a
    # warning (the file was wrong, and checks may have been degraded meanwhile).
    level = logging.INFO if forced else logging.WARNING
    logger.log(level, "rebuilding filter %s from the spam table: %s", path, reason)
    started = time.perf_counter()
    result.rules, snapshot = rebuild(path, writer=writer, progress=progress)
    result.rebuild_seconds = time.perf_counter() - started
    result.rebuilt = reason
    metrics.rebuilt(reason)
    logger.log(
        level,
        "rebuilt filter %s: %d rules up to change #%d in %.2f s",
        path,
        result.rules,
        snapshot,
        result.rebuild_seconds,
    )


#: Called, without arguments and without waiting, after sync_and_report applied
#: changes (or rebuilt, or caught up periodically); the app's ready() adds the exports'
#: pre-render (urlguard.exports.prerender.after_changes).
AFTER_CHANGES: list[Callable[[], None]] = []


def sync_and_report(
    up_to_seq: int | None = None,
    *,
    periodic: bool = False,
    force_rebuild: str = "",
    lock_timeout: float | None = None,
) -> SyncResult:
    """sync(), then this node's NodeStatus row: what a nudge (`up_to_seq`), the
    periodic catch-up (`periodic`: also compacts and refreshes the stage figures)
    and a requested rebuild do. A failure is reported in the row, then raised."""
    try:
        result = sync(
            up_to_seq, force_rebuild=force_rebuild, compact=periodic, lock_timeout=lock_timeout
        )
    except Exception as exc:
        nodestatus.report_status(error=f"{type(exc).__name__}: {exc}")
        raise
    if periodic and result.applied and not result.rebuilt:
        # A nudge applies changes as they commit, so changes left for the catch-up
        # mean this node answered from a stale filter meanwhile.
        logger.warning(
            "catch-up applied %d change(s) this node had missed (a lost nudge "
            "or a stopped worker): until now its filter was stale, up to #%d",
            result.applied,
            result.applied_seq,
        )
    if not result.skipped or periodic:
        report(result, full=periodic)
    if result.applied or result.rebuilt or periodic:
        # E.g. the exports at the new position, rendered in the background before
        # their pollers ask (a periodic catch-up also covers a node that booted, or
        # lost a render to a kill, with nothing applied since).
        for hook in AFTER_CHANGES:
            hook()
    if periodic and not result.rebuilt and conf.SPOT_CHECK_SAMPLE:
        verify_and_repair(result.path, sample=conf.SPOT_CHECK_SAMPLE)
    return result


def report(result: SyncResult, *, full: bool = False) -> None:
    """Record `result` in this node's NodeStatus row (see nodestatus.report_status)."""
    nodestatus.report_status(
        result.path,
        rebuild_seconds=result.rebuild_seconds if result.rebuilt else None,
        rebuild_reason=result.rebuilt,
        full=full,
    )


@dataclass
class Verification:
    """What probing the spam table's rules in this node's mapping found."""

    path: str
    kind: str  # "full verify" or "spot check"
    checked: int = 0  # rules probed
    missing: int = 0  # of them, absent from the file (a rule passed as clean)
    examples: list[str] = field(default_factory=list)
    seconds: float = 0.0
    unavailable: str = ""  # why nothing was probed ("" = it was)

    def summary(self) -> str:
        if self.unavailable:
            return f"{self.kind} of {self.path} skipped: {self.unavailable}"
        found = f"{self.missing:,} missing" if self.missing else "none missing"
        return (
            f"{self.kind} of {self.path}: {self.checked:,} rule(s) probed, {found} "
            f"({self.seconds:.2f} s)"
        )


def _absent(filt: ScalingCountingBloomFilter, expressions: list[str]) -> list[str]:
    if not expressions:
        return []
    hits = filt.contains_many(expressions).tolist()
    return [e for e, hit in zip(expressions, hits, strict=True) if not hit]


def _all_rules() -> Iterator[list[str]]:
    batch: list[str] = []
    rows = SpamRule.objects.order_by().values_list("expression", flat=True)
    for expression in rows.iterator(chunk_size=VERIFY_BATCH):
        batch.append(expression)
        if len(batch) == VERIFY_BATCH:
            yield batch
            batch = []
    yield batch


def _sampled_rules(size: int) -> Iterator[list[str]]:
    """About `size` rules drawn uniformly: random primary keys in the table's range,
    twice as many as wanted, of which the existing ones are kept (two index lookups
    and one IN query, whatever the table's size)."""
    bounds = SpamRule.objects.aggregate(lo=Min("pk"), hi=Max("pk"))
    lo, hi = bounds["lo"], bounds["hi"]
    if lo is None or size <= 0:
        return
    span = hi - lo + 1
    pks = random.sample(range(lo, hi + 1), min(span, 2 * size))
    found: list[str] = []
    for batch in database.in_batches(pks):
        found.extend(SpamRule.objects.filter(pk__in=batch).values_list("expression", flat=True))
    yield found[:size]


def verify(path: str | None = None, *, sample: int | None = None) -> Verification:
    """Probe the spam table's rules (all of them, or a random `sample`) in the
    mapping this process answers checks from. A listed rule the file lacks is a
    silent false negative (damaged counters: bit rot, tampering, a stray write).

    A miss is looked at twice: after applying the pending log, only rules still
    listed and still absent count, so a rule committed meanwhile is no miss."""
    if path is None:
        path = conf.FILTER_PATH
    check = Verification(path=path, kind="full verify" if sample is None else "spot check")
    started = time.perf_counter()
    filt = registry.get_filter(path)
    if filt is None:
        check.unavailable = registry.problem(path) or "the file is not readable"
        return check
    suspects: list[str] = []
    batches = _all_rules() if sample is None else _sampled_rules(sample)
    for batch in batches:
        check.checked += len(batch)
        absent = _absent(filt, batch)
        check.missing += len(absent)
        suspects.extend(absent[: VERIFY_KEEP - len(suspects)])
    if suspects:
        sync(path=path)
        filt = registry.get_filter(path)
        listed = set(
            SpamRule.objects.filter(expression__in=suspects).values_list("expression", flat=True)
        )
        still = _absent(filt, sorted(listed)) if filt is not None else []
        if not still:
            check.missing = 0
        check.examples = still[:10]
    check.seconds = time.perf_counter() - started
    return check


def verify_and_repair(path: str | None = None, *, sample: int | None = None) -> Verification:
    """verify(), and on any miss: log it at ERROR and rebuild the file from the table.
    The outcome of a full verify goes to this node's NodeStatus row."""
    if path is None:
        path = conf.FILTER_PATH
    check = verify(path, sample=sample)
    if check.missing:
        reason = (
            f"the {check.kind} found {check.missing:,} of {check.checked:,} rule(s) missing "
            f"from the file (e.g. {', '.join(check.examples[:3])}): its counters are damaged"
        )
        logger.error("filter %s: %s; rebuilding it from the spam table", path, reason)
        report(sync(path=path, force_rebuild=reason))
    elif not check.unavailable:
        logger.info("%s", check.summary())
    if sample is None and not check.unavailable:
        nodestatus.report_verify(check.seconds, check.missing, path=path)
    return check
