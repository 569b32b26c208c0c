"""How far an export's newest render is behind the change log, in changes and in
seconds (since the oldest change it lacks was logged): said in each export's HTTP
headers, by the node's /readyz (an export further behind than EXPORT_MAX_LAG_SECONDS
makes the node degraded, never not ready: the redirect guard still answers right)
and by /metrics. A node whose renders fail (a full disk) keeps serving its newest
one, and this is how it says so."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from urlguard.conf import conf
from urlguard.exports.projection import Position, current_position
from urlguard.exports.render import export_dir, kept_keys, newest
from urlguard.models import ChangeEvent

if TYPE_CHECKING:
    from prometheus_client.core import GaugeMetricFamily

__all__ = ["ExportLagCollector", "Lag", "exports_check", "lag_of"]


@dataclass(frozen=True)
class Lag:
    changes: int
    seconds: float

    @property
    def stale(self) -> bool:
        return self.seconds > conf.EXPORT_MAX_LAG_SECONDS

    def sentence(self) -> str:
        return (
            f"{self.changes} change(s) behind the change log, the oldest {self.seconds:.0f} s old"
        )


CURRENT = Lag(0, 0.0)


def lag_of(position: Position | None, head: Position, now: datetime | None = None) -> Lag:
    """How far a render at `position` (None: no render) is behind `head`."""
    seq = position.seq if position is not None else 0
    if position is not None and (position.key == head.key or seq > head.seq):
        return CURRENT  # current, or rendered after `head` was read
    if position is None and head.seq == 0:
        return CURRENT  # nothing logged yet: nothing to render
    oldest = (
        ChangeEvent.objects.filter(seq__gt=seq)
        .order_by("seq")
        .values_list("created", flat=True)
        .first()
    )
    # No row after it: the allowlist changed without one (a table edited by hand).
    since = oldest or head.time
    seconds = max(0.0, ((now or timezone.now()) - since).total_seconds())
    return Lag(head.seq - seq, seconds)


def _render_bytes(name: str) -> int:
    total = 0
    directory = export_dir(name)
    for key in kept_keys(directory):
        for suffix in (".txt", ".json"):
            with contextlib.suppress(FileNotFoundError):
                total += (directory / f"{key}{suffix}").stat().st_size
    return total


def _free_bytes() -> int | None:
    try:
        found = os.statvfs(conf.DATA_DIR)
    except OSError:
        return None
    return found.f_bavail * found.f_frsize


def _lags() -> dict[str, tuple[Position | None, Lag]]:
    """Each pre-rendered export's newest render and its lag (a list rendered on
    demand is rendered by its first poll: it has no lag of its own)."""
    head = current_position()
    found = {}
    for name in conf.EXPORTS_PRERENDER:
        kept = newest(export_dir(name))
        position = kept.position if kept is not None else None
        found[name] = (position, lag_of(position, head))
    return found


def exports_check() -> dict[str, Any]:
    """/readyz's "exports" condition (health.DEGRADING_CHECKS): ok unless an export
    is further behind than EXPORT_MAX_LAG_SECONDS."""
    lags = _lags()
    free = _free_bytes()
    check: dict[str, Any] = {
        "max_seconds": conf.EXPORT_MAX_LAG_SECONDS,
        "free_bytes": free,
        "exports": {
            name: {
                "position": position.seq if position is not None else None,
                "changes": lag.changes,
                "seconds": round(lag.seconds, 3),
            }
            for name, (position, lag) in lags.items()
        },
    }
    behind = [
        f"{name} is {lag.sentence()}" if position is not None else f"{name} has no render yet"
        for name, (position, lag) in lags.items()
        if lag.stale
    ]
    check["ok"] = not behind
    if behind:
        where = f"; {free:,} bytes free in {conf.DATA_DIR}" if free is not None else ""
        check["error"] = (
            f"{'; '.join(behind)} (more than {conf.EXPORT_MAX_LAG_SECONDS:g} s): its "
            f"pollers are served an old list{where}; the pre-render's log says why"
        )
    return check


class ExportLagCollector:
    """Each pre-rendered export's lag and the bytes its renders take, when scraped."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        # prometheus_client is the optional [metrics] extra: only a scrape gets here.
        from prometheus_client.core import GaugeMetricFamily

        changes = GaugeMetricFamily(
            "urlguard_export_lag_changes",
            "Change-log rows this node's newest render of an export lacks",
            labels=["export"],
        )
        seconds = GaugeMetricFamily(
            "urlguard_export_lag_seconds",
            "Age of the oldest change this node's newest render of an export lacks",
            labels=["export"],
        )
        size = GaugeMetricFamily(
            "urlguard_export_render_bytes",
            "Bytes of the renders this node keeps of an export",
            labels=["export"],
        )
        try:
            lags = _lags()
        except Exception:  # the database away: /readyz and the ready metrics say so
            lags = {}
        for name, (_, lag) in lags.items():
            changes.add_metric([name], float(lag.changes))
            seconds.add_metric([name], lag.seconds)
        for name in conf.EXPORTS_PRERENDER:
            size.add_metric([name], float(_render_bytes(name)))
        yield changes
        yield seconds
        yield size
