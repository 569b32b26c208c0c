"""Refreshing a source: fetch, read its entries, diff them against what this source
listed last time (RuleSource, as 64-bit keys, so a million entries diff as two numpy
arrays), and apply only the difference through urlguard.changes in one change set:
new entries become rules or gain this source, entries that left lose it, and a rule
goes only when no source lists it any more.

Reading is two passes. The parsers split the body into entries without normalizing
them; each entry's text is looked up in the source's memo (urlguard.feeds.memo) and
only the texts it does not know, or whose rule this source no longer lists, are
normalized. So a refresh's cost is reading the body plus normalizing what changed.

A broken upstream never removes protection: a failed fetch, a body that is cut
short, undecodable or of the wrong kind, or zero entries changes nothing and is
recorded; a refresh that would remove more than FEED_SHRINK_THRESHOLD of the
source's entries is held until accepted. Two refreshes of one source at once: the
second finds the source claimed and does nothing (and were both to apply, the writes
are idempotent: an addition of a listed rule only adds a listing, a withdrawal of a
listing that is gone does nothing)."""

from __future__ import annotations

import ctypes
import logging
import tempfile
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

import mmh3
import numpy as np
from django.db import connections, router, transaction
from django.db.models import F, Max
from django.utils import timezone

from urlguard import changes, ownership
from urlguard.conf import conf
from urlguard.feeds import allowlist, formats, holds, memo
from urlguard.feeds.decoding import FeedError, numbered, open_text
from urlguard.feeds.fetching import FetchSettings, TransientFeedError, fetch
from urlguard.feeds.health import in_words
from urlguard.impact import impact_of_listing
from urlguard.importing import pending_entry
from urlguard.models import (
    AllowedHost,
    ChangeSet,
    FeedRefresh,
    RuleSource,
    Source,
    expression_key,
)
from urlguard.rules import RuleError, normalize_rule

logger = logging.getLogger(__name__)

__all__ = [
    "RefreshResult",
    "accept_held",
    "due_sources",
    "held_for_impact",
    "refresh_source",
]

# The end of a change set's reason when the refresh applied a held shrink.
SHRINK_ACCEPTED = " (shrink accepted)"
# In a change set's reason (before SHRINK_ACCEPTED) when it applied an impact hold.
IMPACT_ACCEPTED = " (impact accepted)"
# In the held_reason of a refresh held for the short links it would block (not a shrink).
IMPACT_HOLD = "CONFIRM_IMPACT_LINKS"
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
        verb = "blocks" if self.status == Source.Status.OK else "would block"
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
        if self.status == Source.Status.FAILED:
            return f"{self.source}: failed: {self.error}"
        if self.status == Source.Status.NOT_MODIFIED:
            return f"{self.source}: not modified"
        if self.status == "busy":
            return f"{self.source}: another refresh of it is running ({self.error}); skipped"
        head = {
            Source.Status.HELD: f"HELD ({self.held_reason or 'shrink'}; nothing applied)",
            "dry-run": "dry run (nothing applied)",
        }.get(self.status, "ok")
        return (
            f"{self.source}: {head}: {self.entries:,} entries ({self.format}): "
            f"{in_words(self.added, self.removed, self.refused, self.unchanged)}"
            + (f", {self.held:,} held for confirmation" if self.held else "")
            + f"; rules {in_words(self.rules_added, self.rules_removed)}; "
            f"{self.duration:.2f} s"
        )


def fetch_settings() -> FetchSettings:
    return FetchSettings(
        connect_timeout=float(conf.FEED_CONNECT_TIMEOUT),
        read_timeout=float(conf.FEED_READ_TIMEOUT),
        deadline=float(conf.FEED_DEADLINE),
        max_bytes=int(conf.FEED_MAX_BYTES),
        max_redirects=int(conf.FEED_MAX_REDIRECTS),
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
    user: Any = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> RefreshResult:
    """Refresh `source` once. Never raises for the feed's own faults: they come back
    as a result with status "failed" (recorded on the source unless `dry_run`).

    A refresh is held whole for a shrink (more than FEED_SHRINK_THRESHOLD of the
    source's entries removed, or drained below its high-water mark) unless
    `accept_shrink`, and for its impact (more than CONFIRM_IMPACT_LINKS short links
    blocked) unless `accept_impact`: each acceptance covers only its own hold."""
    started = time.perf_counter()
    result = RefreshResult(source=source.name)
    if not source.is_feed or not source.url:
        result.status, result.error = Source.Status.FAILED, "not a feed (no URL to fetch)"
        return result
    owner = str(ownership.me())
    if not dry_run:
        busy = _claim(source, owner)
        if busy:
            result.status, result.error = "busy", busy
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
        protected = allowlist.load() if not source.is_allowlist else allowlist.Allowlist({})
        stamp = memo.stamp(staged.format, protected.digest())
        remembered = None if source.is_allowlist else memo.load(source.pk, stamp)
        report("listing", 0, 0)
        listed = _listed_now(source)
        report("normalizing", 0, len(staged))
        staged.resolve(remembered, listed[0], protected, result)
        del remembered
        if not dry_run and not source.is_allowlist:
            _remember(staged, source, stamp)
        staged.forget_units()
        result.entries = staged.count()
        if result.entries == 0:
            raise FeedError(
                f"no entries in the body ({result.refused:,} refused): an empty or wrong "
                "list is never taken for a source that listed nothing"
            )
        if source.is_allowlist:
            _apply_allowlist(source, staged, result, dry_run=dry_run, user=user)
        else:
            _diff_and_apply(
                source,
                staged,
                listed,
                result,
                dry_run=dry_run,
                accept_shrink=accept_shrink,
                accept_impact=accept_impact,
                user=user,
                report=report,
            )
        if dry_run and result.status == Source.Status.OK:
            result.status = "dry-run"
        if not dry_run and result.status == Source.Status.OK and not source.is_allowlist:
            unchanged = allowlist.load().digest() == staged.allowlist_digest
            allowlist.record_refusals(source, staged.allowlisted, forget=unchanged)
        if not dry_run:
            if result.status == Source.Status.OK:
                source.etag, source.last_modified = fetched.etag, fetched.last_modified
            result.duration = time.perf_counter() - started
            _record(source, result)
            if result.rules_added and _may_block_links(result.impact):
                result.rescan_job = _start_rescan(user)
    except FeedError as exc:
        result.status, result.error = Source.Status.FAILED, str(exc)
        result.transient = isinstance(exc, TransientFeedError)
        result.duration = time.perf_counter() - started
        logger.warning("feed %s: refresh failed, nothing changed: %s", source.name, exc)
        if not dry_run:
            _record(source, result)
    except Exception as exc:
        # Recorded like a feed's own fault, so that FEED_UNHEALTHY_FAILURES trips and
        # the source is not fetched again as if it had never been tried.
        result.status = Source.Status.FAILED
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
    if result.status not in (Source.Status.FAILED, "busy"):
        logger.info("feed %s", result.summary())
    return result


def _remember(staged: _Staged, source: Source, stamp: str) -> None:
    """Save the memo; it is a cache, so a disk that is full (or a folder that cannot be
    written) costs the next refresh its speed, never this refresh its result."""
    try:
        staged.remember(source.pk, stamp)
    except OSError as exc:
        logger.warning(
            "feed %s: the normalization memo (a cache) could not be saved, the refresh "
            "goes on and the next one normalizes every entry again: %s",
            source.name,
            exc,
        )


def _may_block_links(impact: dict[str, Any] | None) -> bool:
    return impact is None or not impact["exact"] or impact["changed"] > 0


def _start_rescan(user: Any) -> int | None:
    """The rescan of the short links an import runs too, where the site has them."""
    from urlguard.admin.jobs import rescan_after_adding

    person = user if getattr(user, "is_authenticated", False) else None
    job = rescan_after_adding(user=person)
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


def accept_held(source: Source, *, user: Any = None) -> RefreshResult:
    """Apply the held refresh of `source`: a refresh that accepts what it was held
    for (its shrink, or its impact on the short links), nothing else (fetched again,
    so what is applied is the source as it is now, with its numbers recorded)."""
    if held_for_impact(source.held_reason):
        return refresh_source(source, accept_impact=True, user=user)
    return refresh_source(source, accept_shrink=True, user=user)


def _claim(source: Source, owner: str) -> str:
    """Claim `source` for a refresh by `owner`: "" when claimed, else who holds it. A
    claim whose owner is gone (urlguard.ownership), or older than FEED_CLAIM_TIMEOUT,
    is taken over at once."""
    held = (
        Source.objects.filter(pk=source.pk)
        .values_list("refreshing_since", "refresh_owner", "refresh_heartbeat")
        .first()
    )
    if held is None:
        return "the source was deleted"
    since, holder, heartbeat = held
    now = timezone.now()
    gone = ""
    if since is not None:
        # A claim of no recorded owner (made before claims named one) waits out
        # FEED_CLAIM_TIMEOUT.
        gone = ownership.gone_reason(holder, heartbeat, since) if holder else ""
        if not gone and since > now - timedelta(seconds=float(conf.FEED_CLAIM_TIMEOUT)):
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


# -- reading the body into a diffable form --------------------------------------------


class _Staged:
    """A body as units, in body order: its lines for a LINE_FORMATS body, its entries'
    texts (before normalization) for the others. Before resolve(): each unit's text
    in a spool file, its 128-bit digest, line number and category. After: the
    accepted entries' keys with the unit each came from, and in a second spool the
    expressions of the entries resolve() normalized."""

    def __init__(self, fmt: str, source_category: str) -> None:
        self.format = fmt
        self.by_line = fmt in formats.LINE_FORMATS
        self.source_category = source_category
        self.high, self.low = array("q"), array("q")
        self.ends = array("q")  # where each unit's text ends in the spool
        self.linenos = array("q")  # each unit's line number
        self.category_of = array("H")
        self.categories: list[str] = []
        self._category_index: dict[str, int] = {}
        self._end = 0
        # Both closed by close(), which refresh_source always calls.
        self.units = tempfile.TemporaryFile("w+b", prefix="urlguard-entries-")  # noqa: SIM115
        self.expressions = tempfile.TemporaryFile(  # noqa: SIM115
            "w+", encoding="utf-8", prefix="urlguard-expressions-"
        )
        self.keys = np.zeros(0, dtype=np.int64)  # accepted entries, after resolve()
        self.unit_of = np.zeros(0, dtype=np.int64)
        self.unique_keys = np.zeros(0, dtype=np.int64)  # sorted
        self.refused_units = np.zeros(0, dtype=np.int64)
        # Entries the allowlist refused, expression -> category (AllowlistRefusal).
        self.allowlisted: dict[str, str] = {}
        self.allowlist_digest = ""

    def __len__(self) -> int:
        return len(self.ends)

    def add_lines(
        self,
        lines: Iterable[tuple[int, str]],
        *,
        max_line: int = 0,
        max_units: int = 0,
        refuse: Callable[[int, str, str], None] = lambda lineno, raw, reason: None,
    ) -> None:
        """Stage each numbered line (blank and comment lines are left out before:
        decoding.numbered); a line longer than `max_line` is refused, and more than
        `max_units` lines fail the body."""
        high_of, low_of, ends, units = self.high, self.low, self.ends, self.units
        linenos = self.linenos
        end = self._end
        for lineno, line in lines:
            if max_line and len(line.rstrip("\r\n")) > max_line:
                refuse(lineno, line[:300], f"longer than {max_line:,} characters (FEED_MAX_LINE)")
                continue
            if max_units and len(ends) >= max_units:
                raise FeedError(
                    f"the body lists more than {max_units:,} entries (FEED_MAX_ENTRIES): "
                    "refused, nothing applied"
                )
            data = line.encode("utf-8", "surrogatepass")
            high, low = mmh3.hash64(data, signed=True)
            high_of.append(high)
            low_of.append(low)
            units.write(data)
            end += len(data)
            ends.append(end)
            linenos.append(lineno)
        self._end = end

    def add_entry(self, token: str, category: str, lineno: int, *, max_units: int = 0) -> None:
        self.add_lines(((lineno, token),), max_units=max_units)
        index = self._category_index.get(category)
        if index is None:
            index = self._category_index[category] = len(self.categories)
            self.categories.append(category)
        self.category_of.append(index)

    def _text(self, index: int, ends: np.ndarray) -> str:
        start = int(ends[index - 1]) if index else 0
        self.units.seek(start)
        return self.units.read(int(ends[index]) - start).decode("utf-8", "surrogatepass")

    def resolve(
        self,
        remembered: memo.Memo | None,
        listed: np.ndarray,
        protected: allowlist.Allowlist,
        result: RefreshResult,
    ) -> None:
        """Find every unit's entries: from the memo where it knows the unit's text and
        this source lists that rule now; by parsing the line (by_line) and
        normalizing the entries (then the allowlist) otherwise."""
        count = len(self)
        self.allowlist_digest = protected.digest()
        high = np.frombuffer(self.high, dtype=np.int64)
        low = np.frombuffer(self.low, dtype=np.int64)
        found = np.zeros(count, dtype=bool)
        known = np.zeros(count, dtype=np.int64)
        if remembered is not None and count:
            found, known = remembered.lookup(high, low)
        # A remembered rule this source no longer lists (a held refresh, a rule
        # deleted by hand) is added again, and adding needs its expression.
        found &= _member(known, listed)
        known_units = np.flatnonzero(found)
        known_keys = known[found]
        todo = np.flatnonzero(~found)
        del found, known
        # Entries found here, numbered after the known ones.
        unit_of, keys = array("q"), array("q")
        refused_units = array("q")  # never remembered: their refusals count each time
        base = len(known_keys)
        ends = np.frombuffer(self.ends, dtype=np.int64)
        self.units.flush()
        for index in _each(todo):
            text = self._text(index, ends)
            if self.by_line:
                entries = [
                    (parsed.lineno, parsed.token or "", parsed.category, parsed.error)
                    for parsed in formats.parse_line(
                        self.format, text, self.linenos[index], self.source_category, pending_entry
                    )
                ]
            else:
                category = self.categories[self.category_of[index]]
                entries = [(self.linenos[index], text, category, None)]
            for lineno, token, category, error in entries:
                if error is not None:
                    _refuse(result, lineno, text, error)
                    refused_units.append(index)
                    continue
                try:
                    expression = normalize_rule(token)
                except RuleError as exc:
                    _refuse(result, lineno, token, str(exc))
                    refused_units.append(index)
                    continue
                reason = protected.refusal(expression)
                if reason is not None:
                    _refuse(result, lineno, token, reason)
                    refused_units.append(index)
                    self.allowlisted[expression] = category or self.source_category
                    continue
                self.expressions.write(
                    f"{base + len(keys)}\t{category or self.source_category}\t{expression}\n"
                )
                keys.append(expression_key(expression))
                unit_of.append(index)
        self.keys = np.concatenate((known_keys, np.frombuffer(keys, dtype=np.int64)))
        del known_keys, keys
        self.unit_of = np.concatenate((known_units, np.frombuffer(unit_of, dtype=np.int64)))
        del known_units, unit_of
        self.refused_units = np.frombuffer(refused_units, dtype=np.int64)
        self.unique_keys = _sorted_unique(self.keys)
        result.refusals.sort(key=lambda refusal: refusal[0])

    def remember(self, source_id: int, stamp: str) -> None:
        """Save, as the source's memo, the key of every unit that gave one entry."""
        per_unit = np.bincount(self.unit_of, minlength=len(self))
        per_unit[self.refused_units] = 0  # a line that also had a refused entry
        entries = per_unit[self.unit_of] == 1
        del per_unit
        units = self.unit_of[entries]
        # Handed over as temporaries that memo.save alone holds, so it frees each
        # array as it replaces it with the sorted one.
        memo.save(
            source_id,
            stamp,
            np.frombuffer(self.high, dtype=np.int64)[units],
            np.frombuffer(self.low, dtype=np.int64)[units],
            self.keys[entries],
        )

    def forget_units(self) -> None:
        """Free the units' digests and places (what is left to do needs the entries)."""
        self.high, self.low, self.ends = array("q"), array("q"), array("q")

    def count(self) -> int:
        """Distinct accepted entries."""
        return len(self.unique_keys)

    def lines(self, picked: np.ndarray) -> Iterator[tuple[str, str]]:
        """(expression, category) of the entries `picked` marks, which must be among
        those resolve() normalized (an entry new to the source always is)."""
        for _, expression, category in self.entries(picked):
            yield expression, category

    def entries(self, picked: np.ndarray) -> Iterator[tuple[int, str, str]]:
        """(index, expression, category) of the entries `picked` marks (see lines)."""
        self.expressions.flush()
        self.expressions.seek(0)
        for line in self.expressions:
            index, category, expression = line.rstrip("\n").split("\t", 2)
            if picked[int(index)]:
                yield int(index), expression, category

    def close(self) -> None:
        self.units.close()
        self.expressions.close()


def _each(indices: np.ndarray, step: int = 1 << 16) -> Iterator[int]:
    """The indices as ints, a slice at a time (a million as one list is 36 MB)."""
    for start in range(0, len(indices), step):
        yield from indices[start : start + step].tolist()


def _refuse(result: RefreshResult, lineno: int, raw: str, reason: str) -> None:
    result.refused += 1
    if len(result.refusals) < MAX_REFUSALS_KEPT:
        result.refusals.append((lineno, raw.rstrip("\r\n")[:300], reason))


# Lines a LINE_FORMATS body may comment out: skipped before they are staged.
_COMMENTS = {"urls": "#", "hosts": "#", "adblock": "!"}


def _stage(body: Any, source: Source, result: RefreshResult) -> _Staged:
    max_line, max_units = int(conf.FEED_MAX_LINE), int(conf.FEED_MAX_ENTRIES)
    with open_text(body, limit=int(conf.FEED_MAX_BYTES), max_line=max_line) as text:
        fmt, stream = formats.sniff(text, source.format)  # type: ignore[arg-type]
        result.format = fmt
        staged = _Staged(fmt, source.category)
        try:
            if staged.by_line:
                staged.add_lines(
                    numbered(stream, _COMMENTS.get(fmt, "")),  # type: ignore[arg-type]
                    max_line=max_line,
                    max_units=max_units,
                    refuse=lambda lineno, raw, reason: _refuse(result, lineno, raw, reason),
                )
            else:
                _, entries = formats.parse(stream, fmt, source.category, make=pending_entry)  # type: ignore[arg-type]
                for parsed in entries:
                    if parsed.error is not None:
                        _refuse(result, parsed.lineno, parsed.raw, parsed.error)
                    elif parsed.token is not None:
                        category = parsed.category or source.category
                        staged.add_entry(parsed.token, category, parsed.lineno, max_units=max_units)
        except BaseException:
            staged.close()
            raise
    return staged


# -- applying -------------------------------------------------------------------------


def _listed_now(source: Source) -> tuple[np.ndarray, np.ndarray]:
    """(keys, rule ids) of what `source` lists now, sorted by key."""
    connection = connections[router.db_for_read(RuleSource)]
    if connection.vendor == "postgresql":
        keys, ids = _listed_aggregated(connection, source)
    else:
        key_list, id_list = array("q"), array("q")
        rows = RuleSource.objects.filter(source=source).values_list("key", "rule_id")
        for key, rule_id in rows.iterator(chunk_size=_FETCH_ROWS):
            key_list.append(key)
            id_list.append(rule_id)
        keys = np.frombuffer(key_list, dtype=np.int64)
        ids = np.frombuffer(id_list, dtype=np.int64)
    order = np.argsort(keys)
    keys = keys[order]
    ids = ids[order]
    return keys, ids


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    # np.unique took its hash-table path here: 0.66 s a million keys (profiled); a sort
    # and a comparison of neighbours, a fraction of that.
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def _member(values: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """values[i] in `pool` (sorted): a binary search each, where np.isin sorts both."""
    inside = np.zeros(len(values), dtype=bool)
    if not len(pool):
        return inside
    for start in range(0, len(values), 1 << 16):  # small temporaries
        part = values[start : start + (1 << 16)]
        at = np.searchsorted(pool, part)
        at[at == len(pool)] = 0
        inside[start : start + len(part)] = pool[at] == part
    return inside


def _listed_aggregated(connection: Any, source: Source) -> tuple[np.ndarray, np.ndarray]:
    """The listing as two byte strings of big-endian int64s, aggregated in one pass
    (so in the same row order), read straight into numpy: a million rows in a
    fraction of a second, where the ORM spends seconds building a million tuples."""
    table = connection.ops.quote_name(RuleSource._meta.db_table)
    key = connection.ops.quote_name("key")
    connection.ensure_connection()
    # A server-side-binding cursor of its own: Django's client-side cursors cannot
    # ask for binary results, and in text the 16 MB of a million rows arrive as 32 MB
    # of hex. Both aggregates take the rows in the one order of the scan (asking for
    # key order made PostgreSQL walk the index: twice the time of a sort here).
    import psycopg  # only on PostgreSQL (the `postgres` extra)

    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(
            f"SELECT string_agg(int8send({key}), ''), string_agg(int8send(rule_id), '') "
            f"FROM {table} WHERE source_id = %s",
            [source.pk],
            binary=True,
        )
        key_bytes, id_bytes = cursor.fetchone()  # type: ignore[misc]
    if key_bytes is None:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    keys = np.frombuffer(key_bytes, dtype=">i8").astype(np.int64)
    del key_bytes
    ids = np.frombuffer(id_bytes, dtype=">i8").astype(np.int64)
    return keys, ids


def _diff_and_apply(
    source: Source,
    staged: _Staged,
    listed: tuple[np.ndarray, np.ndarray],
    result: RefreshResult,
    *,
    dry_run: bool,
    accept_shrink: bool,
    accept_impact: bool,
    user: Any,
    report: Callable[[str, int, int], None],
) -> None:
    old_keys, old_ids = listed  # sorted by key
    # The first entry of each key the source does not list yet.
    fresh = np.flatnonzero(~_member(staged.keys, old_keys))
    _, first = np.unique(staged.keys[fresh], return_index=True)
    gone_mask = ~_member(old_keys, staged.unique_keys)
    picked = np.zeros(len(staged.keys), dtype=bool)
    picked[fresh[first]] = True
    held = holds.screen(source, lambda: staged.entries(picked), len(first))
    for entry in held:
        picked[entry.index] = False
    result.held = len(held)
    result.holds = [(entry.expression, entry.reason) for entry in held[:MAX_REFUSALS_KEPT]]
    result.added = len(first) - len(held)
    result.removed = int(gone_mask.sum())
    result.unchanged = staged.count() - len(first)
    threshold = float(conf.FEED_SHRINK_THRESHOLD)
    high_water = _high_water(source, len(old_keys))
    shrunk = len(old_keys) and result.removed > threshold * len(old_keys)
    drained = high_water and staged.count() < (1 - threshold) * high_water
    if (shrunk or drained) and not accept_shrink:
        result.status = Source.Status.HELD
        result.held_reason = (
            f"it would remove {result.removed:,} of {len(old_keys):,} entries, more than "
            f"FEED_SHRINK_THRESHOLD={threshold}"
        )
        if not dry_run:
            logger.warning(
                "feed %s: refresh held: it would remove %d of %d entries, leaving %d of "
                "the %d it listed at most within FEED_SHRINK_WINDOW (FEED_SHRINK_THRESHOLD"
                "=%s); accept it in the admin or with "
                "`manage.py refresh_feeds %s --accept-shrink`",
                source.name,
                result.removed,
                len(old_keys),
                staged.count(),
                high_water,
                threshold,
                source.name,
            )
        return
    if result.added:
        report("impact", 0, 0)
        impact = impact_of_listing(expression for expression, _ in staged.lines(picked))
        result.impact = impact.as_dict()
        limit = int(conf.CONFIRM_IMPACT_LINKS)
        if limit and impact.exact and impact.changed > limit and not accept_impact:
            result.status = Source.Status.HELD
            result.held_reason = (
                f"it would block {impact.changed:,} short links, more than {IMPACT_HOLD}={limit:,}"
            )
            if not dry_run:
                logger.warning(
                    "feed %s: refresh held: %s; accept it in the admin or with "
                    "`manage.py refresh_feeds %s --accept-impact`",
                    source.name,
                    result.held_reason,
                    source.name,
                )
            return
    if dry_run:
        return
    total = result.added + result.removed
    partial = changes.interrupted(kind=ChangeSet.Kind.REFRESH, source=source)
    if partial is not None:
        logger.warning(
            "feed %s: finishing %s, a refresh interrupted after %d added, %d removed",
            source.name,
            partial,
            partial.added,
            partial.removed,
        )
    with changes.change_set(
        kind=ChangeSet.Kind.REFRESH,
        actor=user,
        source=source,
        reason=(
            f"refresh of {source.url}"
            + (IMPACT_ACCEPTED if accept_impact else "")
            + (SHRINK_ACCEPTED if accept_shrink else "")
        ),
        resume=partial,
    ) as cs:
        result.change_set = cs.pk
        if result.added:
            bulk = changes.add_rules(
                _still_allowed(staged.lines(picked), staged, result),
                source=source,
                user=user,
                category=source.category,
                change_set=cs,
                normalized=True,
                chunk_size=20_000,
                keep_names=False,
                progress=lambda done: report("adding", done, total),
            )
            result.rules_added = bulk.added_count
        if result.removed:
            report("removing", result.added, total)
            withdrawn = changes.withdraw_rules(
                source, old_ids[gone_mask].tolist(), user=user, change_set=cs
            )
            result.rules_removed = withdrawn.removed
        changes.record_refused(cs, result.refused)
    holds.record(source, held, staged.unique_keys)
    report("done", total, total)


def _high_water(source: Source, listed_now: int) -> int:
    """The most entries `source` listed within FEED_SHRINK_WINDOW (since its last
    accepted shrink, which sets a new mark), so that a feed drained a little at a
    time is held as one drained at once."""
    window = float(conf.FEED_SHRINK_WINDOW)
    if not window:
        return listed_now
    refreshes = FeedRefresh.objects.filter(
        source=source,
        status=Source.Status.OK,
        at__gte=timezone.now() - timedelta(seconds=window),
    )
    accepted = (
        refreshes.filter(change_set__reason__endswith=SHRINK_ACCEPTED)
        .order_by("-at")
        .values_list("at", flat=True)
        .first()
    )
    if accepted is not None:
        refreshes = refreshes.filter(at__gte=accepted)
    most = refreshes.aggregate(most=Max("entries"))["most"] or 0
    return max(listed_now, most)


def _still_allowed(
    lines: Iterator[tuple[str, str]], staged: _Staged, result: RefreshResult
) -> Iterator[tuple[str, str]]:
    """The entries to add, less any a host allowlisted since this refresh read the
    allowlist now refuses (the allowlist acts at once, also on a refresh under way)."""
    protected = allowlist.load()
    if protected.digest() == staged.allowlist_digest:
        yield from lines
        return
    for expression, category in lines:
        reason = protected.refusal(expression)
        if reason is None:
            yield expression, category
        else:
            _refuse(result, 0, expression, reason)
            staged.allowlisted[expression] = category


def _apply_allowlist(
    source: Source, staged: _Staged, result: RefreshResult, *, dry_run: bool, user: Any = None
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
            actor=user,
            source=source,
            reason=f"refresh of {source.url}",
        ) as cs,
    ):
        AllowedHost.objects.filter(source=source, host__in=present - hosts).delete()
        AllowedHost.objects.bulk_create(
            [AllowedHost(source=source, host=host) for host in sorted(hosts - present)],
            ignore_conflicts=True,
        )
        changes.record_allowlist(sorted(hosts ^ present), change_set=cs, user=user)
        if source.enabled:
            allowlist.release(sorted(present - hosts), change_set=cs, user=user)
            allowlist.enforce(sorted(hosts - present), change_set=cs, user=user)
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
            held_reason="",
            held_at=None,
            held_entries=None,
            held_added=None,
            held_removed=None,
        )
    elif result.status == Source.Status.HELD:
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
