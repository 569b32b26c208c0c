"""What this node reports of its filter file: one NodeStatus row per node (the admin
dashboard's lag column, `filter_info`'s node table), written after every sync."""

from __future__ import annotations

import json
import logging
from typing import Any

from django.utils import timezone

from urlguard.conf import conf
from urlguard.models import NodeStatus
from urlguard.nodesync import registry

logger = logging.getLogger(__name__)

__all__ = ["jsonable", "report_status", "report_verify"]


def jsonable(value: Any) -> Any:
    """`value` with numpy scalars made plain (info() may carry them; JSON fields
    and `filter_info --json` need plain values)."""
    return json.loads(
        json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else str(v))
    )


def report_status(
    path: str | None = None,
    *,
    error: str = "",
    rebuild_seconds: float | None = None,
    rebuild_reason: str = "",
    full: bool = False,
) -> None:
    """Write what this node's file looks like now into its NodeStatus row. Never
    raises: reporting must not turn a successful apply into a failed task.

    info() reads every counter (O(file size)), so the stage figures are refreshed
    only when `full` or after a rebuild (`rebuild_seconds` given); a plain apply
    records its high-water mark and state, which is what lag needs."""
    if path is None:
        path = conf.FILTER_PATH
    try:
        defaults: dict[str, Any] = {"filter_path": path, "last_error": error[:10_000]}
        filt = registry.get_filter(path)
        if filt is not None:
            defaults.update(applied_seq=filt.applied_seq, is_clean=filt.is_clean)
            if full or rebuild_seconds is not None:
                defaults["info"] = jsonable(filt.info())
        elif not error:
            defaults["last_error"] = "the filter file is missing or unreadable"
        if rebuild_seconds is not None:
            defaults.update(
                last_rebuild_at=timezone.now(),
                last_rebuild_seconds=rebuild_seconds,
                last_rebuild_reason=rebuild_reason[:1000],
            )
        NodeStatus.objects.update_or_create(node=conf.NODE_NAME, defaults=defaults)
    except Exception:
        logger.exception("could not report the status of filter %s", path)


def report_verify(seconds: float, missing: int, *, path: str | None = None) -> None:
    """Record a full verify of this node's file (the dashboard shows when it last ran
    and what it found). Never raises."""
    if path is None:
        path = conf.FILTER_PATH
    try:
        NodeStatus.objects.update_or_create(
            node=conf.NODE_NAME,
            defaults={
                "filter_path": path,
                "last_verify_at": timezone.now(),
                "last_verify_seconds": seconds,
                "last_verify_missing": missing,
            },
        )
    except Exception:
        logger.exception("could not report the verify of filter %s", path)
