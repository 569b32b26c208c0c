"""Planning a refresh: a read body diffed against what its source lists, screened,
and made a listing plan (urlguard.writepath.plan), the data the write path
applies. Screening holds single entries (urlguard.feeds.holds: the admin's safety
policy) and the whole refresh for a shrink (more than FEED_SHRINK_THRESHOLD of the
source's entries removed, or drained below its high-water mark) or for its impact
(more than CONFIRM_IMPACT_LINKS short links blocked), each unless accepted."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from django.db.models import Max
from django.utils import timezone

from urlguard.conf import conf
from urlguard.feeds import holds
from urlguard.feeds.outcome import MAX_REFUSALS_KEPT, RefreshResult, RefreshStatus
from urlguard.feeds.staging import Staged
from urlguard.models import FeedRefresh, Source
from urlguard.writepath.impact import impact_of_listing
from urlguard.writepath.plan import ListingPlan

logger = logging.getLogger(__name__)

__all__ = ["IMPACT_ACCEPTED", "IMPACT_HOLD", "SHRINK_ACCEPTED", "plan_listing"]

# The end of a change set's reason when the refresh applied a held shrink.
SHRINK_ACCEPTED = " (shrink accepted)"
# In a change set's reason (before SHRINK_ACCEPTED) when it applied an impact hold.
IMPACT_ACCEPTED = " (impact accepted)"
# In the held_reason of a refresh held for the short links it would block (not a shrink).
IMPACT_HOLD = "CONFIRM_IMPACT_LINKS"


def plan_listing(
    source: Source,
    staged: Staged,
    listed: int,
    result: RefreshResult,
    *,
    dry_run: bool,
    accept_shrink: bool,
    accept_impact: bool,
    report: Callable[[str, int, int], None],
) -> tuple[ListingPlan | None, list[holds.Held]]:
    """The plan of `staged` (resolved) for `source`, which lists `listed` entries
    (those `staged` was staged against), and the entries held from it; its figures
    go into `result`. None: the refresh is held whole (`result` says why) or
    `dry_run`. The plan's additions
    are the staged spool and keys, valid until `staged` is closed."""
    diff = staged.diff()
    new = diff.new
    report("screening", 0, diff.count)
    held = holds.screen(source, staged, new, diff.count)
    for entry in held:
        new[entry.index] = False
    result.held = len(held)
    result.holds = [(entry.expression, entry.reason) for entry in held[:MAX_REFUSALS_KEPT]]
    result.added = diff.count - len(held)
    result.removed = len(diff.gone)
    result.unchanged = staged.count() - diff.count
    if _shrunk(source, listed, staged.count(), result, dry_run=dry_run, accept=accept_shrink):
        return None, held
    if result.added:
        report("impact", 0, 0)
        impact = impact_of_listing(expression for expression, _ in staged.lines(new))
        result.impact = impact.as_dict()
        limit = conf.CONFIRM_IMPACT_LINKS
        if limit and impact.exact and impact.changed > limit and not accept_impact:
            result.status = RefreshStatus.HELD
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
            return None, held
    if dry_run:
        return None, held
    plan = ListingPlan(
        source=source,
        reason=(
            f"refresh of {source.url}"
            + (IMPACT_ACCEPTED if accept_impact else "")
            + (SHRINK_ACCEPTED if accept_shrink else "")
        ),
        additions=staged.additions(new),
        withdrawals=diff.gone,
        listed=listed,
        refused=result.refused,
        allowlist_digest=staged.allowlist_digest,
    )
    return plan, held


def _shrunk(
    source: Source, listed: int, entries: int, result: RefreshResult, *, dry_run: bool, accept: bool
) -> bool:
    """Whether the refresh is held for a shrink (then `result` says so)."""
    threshold = conf.FEED_SHRINK_THRESHOLD
    high_water = _high_water(source, listed)
    shrunk = listed and result.removed > threshold * listed
    drained = high_water and entries < (1 - threshold) * high_water
    if not (shrunk or drained) or accept:
        return False
    result.status = RefreshStatus.HELD
    result.held_reason = (
        f"it would remove {result.removed:,} of {listed:,} entries, more than "
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
            listed,
            entries,
            high_water,
            threshold,
            source.name,
        )
    return True


def _high_water(source: Source, listed_now: int) -> int:
    """The most entries `source` listed within FEED_SHRINK_WINDOW (since its last
    accepted shrink, which sets a new mark), so that a feed drained a little at a
    time is held as one drained at once."""
    window = conf.FEED_SHRINK_WINDOW
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
