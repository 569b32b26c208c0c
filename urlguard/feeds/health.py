"""A source's health at a glance, for feeds_info, the sources admin and the
dashboard: never refreshed, fresh, stale (no success for over two intervals),
held (a refresh waits for an admin), failing (FEED_UNHEALTHY_FAILURES in a row;
its rules stay), failed (its last refresh failed, fewer times in a row than that:
a retry may mend it), or disabled; and a refresh that runs, is stuck (its owner died)
or left a partial change set, in words."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from urlguard.conf import conf
from urlguard.models import ChangeSet, Source
from urlguard.runtime import ownership
from urlguard.writepath import changes

__all__ = ["HEALTH_LABELS", "health", "in_words", "refresh_state"]

HEALTH_LABELS = {
    "ok": "OK",
    "never": "never refreshed",
    "stale": "stale",
    "held": "held",
    "failing": "failing",
    "failed": "last refresh failed",
    "disabled": "disabled",
    "manual": "manual",
}


def health(source: Source) -> str:
    if not source.is_feed:
        return "manual"
    if not source.enabled:
        return "disabled"
    if source.held_at is not None:
        return "held"
    if source.failures >= conf.FEED_UNHEALTHY_FAILURES:
        return "failing"
    if source.failures:
        return "failed"
    if source.last_success_at is None:
        return "never"
    if timezone.now() - source.last_success_at > timedelta(seconds=2 * source.interval + 60):
        return "stale"
    return "ok"


def refresh_state(source: Source) -> str:
    """A refresh running now, stuck (its owner is gone) or interrupted with its
    change set partial, in words; "" when none is."""
    if not source.is_feed:
        return ""
    parts = []
    since = source.refreshing_since
    if since is not None:
        owner = source.refresh_owner
        gone = ownership.gone_reason(owner, source.refresh_heartbeat, since) if owner else ""
        when = f"{timezone.localtime(since):%Y-%m-%d %H:%M:%S}"
        if gone:
            parts.append(
                f"stuck: the refresh claimed at {when} stopped ({gone}); the next refresh "
                "takes it over"
            )
        else:
            parts.append(f"refreshing since {when} ({ownership.describe(owner)})")
    partial = changes.interrupted(kind=ChangeSet.Kind.REFRESH, source=source)
    if partial is not None:
        stopped = timezone.localtime(partial.heartbeat or partial.created)
        removed = f", {partial.removed:,} removed" if partial.removed else ""
        parts.append(
            f"partial: {partial.added:,} rules{' added' if removed else ''}{removed} of a "
            f"refresh interrupted at {stopped:%Y-%m-%d %H:%M:%S} ({partial}); the next "
            "refresh finishes it"
        )
    return "; ".join(parts)


def _number(n: int | None) -> str:
    return "none" if not n else f"{n:,}"


def in_words(
    added: int | None,
    removed: int | None,
    refused: int | None = None,
    unchanged: int | None = None,
) -> str:
    """Numbers of a refresh as a person says them: "5 added, none removed, 1,000
    unchanged, 2 refused" (each part only when given, added and removed always)."""
    parts = [f"{_number(added)} added", f"{_number(removed)} removed"]
    if unchanged is not None:
        parts.append(f"{_number(unchanged)} unchanged")
    if refused is not None:
        parts.append(f"{_number(refused)} refused")
    return ", ".join(parts)
