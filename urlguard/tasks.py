"""The Celery side of keeping this node's filter current: thin task wrappers around
urlguard.sync (retries with backoff on a worker) and the worker's boot-time catch-up.

Every task is broadcast to every node (urlguard.celery routes them); the message
carries no change, only a nudge, so duplicate, late or lost deliveries are harmless.
Boot-time (worker_ready) and periodic (beat) catch-ups cover a node that missed one.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from celery import bootsteps, shared_task
from celery.signals import worker_init, worker_ready
from celery.utils.time import get_exponential_backoff_interval
from django.core.management.base import SystemCheckError
from django.db import DatabaseError

from urlguard import ownership, registry, sync
from urlguard.celery import (
    APPLY_CHANGES_TASK,
    CATCH_UP_TASK,
    REBUILD_FILTER_TASK,
    VERIFY_FILTER_TASK,
)
from urlguard.celery import app as celery_app
from urlguard.checks import refuse_to_start

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


def _catch_up_now(why: str) -> None:
    try:
        result = sync.sync_and_report(periodic=True)
    except Exception:
        logger.exception("%s catch-up of the filter failed; beat will retry", why)
        return
    logger.info(
        "%s catch-up: filter %s at change #%d (%d applied%s)",
        why,
        result.path,
        result.applied_seq,
        result.applied,
        f"; rebuilt: {result.rebuilt}" if result.rebuilt else "",
    )


@worker_init.connect
def _refuse_wrong_settings(sender: Any = None, **kwargs: Any) -> None:
    # Celery's Django fixup runs the system checks but ignores what they find: a
    # worker with a wrong setting would apply changes to the wrong file, or fail
    # each task. It stops here, as gunicorn and runserver do (a SystemExit is the
    # one exception Celery's signal dispatch does not swallow).
    try:
        refuse_to_start()
    except SystemCheckError as exc:
        logger.critical("%s", exc)
        raise SystemExit(1) from exc


@worker_ready.connect
def _catch_up_at_boot(sender: Any = None, **kwargs: Any) -> None:
    # Runs in the worker before it takes messages: a node that was down while rules
    # changed is current again before it applies the next nudge.
    _catch_up_now("boot-time")
    # Work a killed worker of this host left claimed or running is let go at once.
    try:
        ownership.recover_orphans()
    except Exception:
        logger.exception("boot-time recovery of orphaned jobs and claims failed")


class CatchUpOnReconnect(bootsteps.StartStopStep):
    """A consumer step: started each time the worker (re)connects to the broker.
    Nudges published while it was away are lost, so a reconnect catches up at once
    and staleness after a broker outage is the outage, not up to CATCHUP_INTERVAL
    more."""

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.connections = 0

    def start(self, parent: Any) -> None:
        self.connections += 1
        if self.connections > 1:  # the first is boot, caught up by worker_ready
            _catch_up_now("broker-reconnect")


celery_app.steps["consumer"].add(CatchUpOnReconnect)
