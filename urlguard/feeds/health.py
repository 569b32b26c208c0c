"""A source's health at a glance, for feeds_info, the sources admin and the
dashboard: never refreshed, fresh, stale (no success for over two intervals),
held (a shrink waits for an admin), failing (FEED_UNHEALTHY_FAILURES in a row;
its rules stay), or disabled."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from urlguard.conf import conf
from urlguard.models import Source

__all__ = ["HEALTH_LABELS", "health"]

HEALTH_LABELS = {
    "ok": "OK",
    "never": "never refreshed",
    "stale": "stale",
    "held": "shrink held",
    "failing": "failing",
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
    if source.failures >= int(conf.FEED_UNHEALTHY_FAILURES):
        return "failing"
    if source.last_success_at is None:
        return "failing" if source.failures else "never"
    if timezone.now() - source.last_success_at > timedelta(seconds=2 * source.interval + 60):
        return "stale"
    return "ok"
