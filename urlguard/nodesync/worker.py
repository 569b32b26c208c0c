"""The Celery worker's side of keeping this node's filter current: it refuses to
start on a wrong setting, catches up at boot, and again each time it reconnects to
the broker. Loaded (by urlguard's AppConfig) only where Celery is installed."""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from celery.signals import celeryd_init, worker_init, worker_ready
from django.core.management.base import SystemCheckError

from urlguard.checks import refuse_to_start
from urlguard.nodesync import embedded, sync
from urlguard.runtime import ownership

logger = logging.getLogger(__name__)


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
    # Then the node's file is watched (no broker needed): a backup moved or copied
    # over it, or a removed file, is caught up within a second or two.
    embedded.watch()
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


@celeryd_init.connect
def _add_reconnect_step(sender: Any = None, instance: Any = None, **kwargs: Any) -> None:
    # On the site's own Celery app, before the worker builds its consumer (Django, and
    # so this module, is loaded by then).
    instance.app.steps["consumer"].add(CatchUpOnReconnect)
