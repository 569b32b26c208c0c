"""The tasks that keep this node's filter current: thin wrappers around urlguard.nodesync.sync
(retries with backoff on a Celery worker; in-process without one).

Every task is broadcast to every node (urlguard.celery.configure routes them); the message
carries no change, only a nudge, so duplicate, late or lost deliveries are harmless.
Boot-time and periodic (beat) catch-ups (urlguard.nodesync.worker) cover a node that missed one.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from django.db import DatabaseError

from urlguard.celery import (
    APPLY_CHANGES_TASK,
    CATCH_UP_TASK,
    REBUILD_FILTER_TASK,
    VERIFY_FILTER_TASK,
    shared_task,
)
from urlguard.nodesync import registry, sync

logger = logging.getLogger(__name__)

__all__ = ["apply_changes", "catch_up", "rebuild_filter", "verify_filter"]

# Bounded Celery retries when the writer lock or the database is busy.
MAX_RETRIES = 6


def _run(
    task: Any, up_to_seq: int | None, force_rebuild: str = "", periodic: bool = False
) -> dict[str, Any]:
    try:
        result = sync.sync_and_report(up_to_seq, periodic=periodic, force_rebuild=force_rebuild)
    except (registry.WriterBusy, DatabaseError) as exc:
        if task.request.is_eager:
            # In-process mode runs inside a web request: no sleeping retries there;
            # the next change or `manage.py sync_filter` picks the work up.
            raise
        from celery.utils.time import get_exponential_backoff_interval  # only a worker retries

        countdown = get_exponential_backoff_interval(
            factor=1, retries=task.request.retries, maximum=60, full_jitter=True
        )
        raise task.retry(exc=exc, countdown=countdown, max_retries=MAX_RETRIES) from exc
    return result.as_dict()


@shared_task(bind=True, name=APPLY_CHANGES_TASK, ignore_result=True)
def apply_changes(self: Any, up_to_seq: int | None = None) -> dict[str, Any]:
    """Nudge (broadcast to every node): apply the change log at least up to `up_to_seq`."""
    return _run(self, up_to_seq)


@shared_task(bind=True, name=CATCH_UP_TASK, ignore_result=True)
def catch_up(self: Any) -> dict[str, Any]:
    """Periodic (beat) catch-up for a node that missed a nudge; also compacts a file
    of too many stages and refreshes the node's full status for the dashboard."""
    return _run(self, None, periodic=True)


@shared_task(bind=True, name=REBUILD_FILTER_TASK, ignore_result=True)
def rebuild_filter(self: Any, reason: str = "requested") -> dict[str, Any]:
    """Rebuild this node's file from the spam table (the admin's button)."""
    return _run(self, None, force_rebuild=f"rebuild {reason}")


@shared_task(name=VERIFY_FILTER_TASK, ignore_result=True)
def verify_filter() -> dict[str, Any]:
    """Scheduled (beat, VERIFY_INTERVAL): probe every rule of the table in this node's
    file, and rebuild it on any miss (logged at ERROR, shown on the dashboard)."""
    return asdict(sync.verify_and_repair())
