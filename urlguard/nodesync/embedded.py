"""The embedded default has no broker and so no Celery beat: each process that serves
requests runs the node's upkeep itself, in one daemon thread started by its first
request (a management command or the runserver reloader parent never starts it).

The thread looks at the filter every WATCH_SECONDS (the registry's once-a-second
check: no database): a missing, unreadable or dirty file is caught up at once,
not at the next CATCHUP_INTERVAL, and so is everything missed while the database
was away, as soon as it answers again. It also runs the periodic catch-up and,
every VERIFY_INTERVAL, the full verify.

A Celery worker runs the same watch (`watch`, started when the worker is ready)
without the periodic work, which beat schedules there: a file moved, copied or
restored at the path is caught up within WATCH_SECONDS, not at the next catch-up."""

from __future__ import annotations

import logging
import math
import threading
import time

from django.db import DatabaseError, connections

from urlguard.conf import conf
from urlguard.nodesync import registry, sync
from urlguard.runtime.firstrequest import FirstRequest
from urlguard.runtime.process import Daemon

logger = logging.getLogger(__name__)

# How often the thread asks the registry whether the file is usable.
WATCH_SECONDS = 1.0

# Whether the thread runs the periodic work too, or only watches (a Celery worker).
_periodic = True


def install() -> None:
    """Start the upkeep thread on this process's first request."""
    _first_request.install()
    registry.when_behind(_wake_for)


def _wake_for(path: str) -> None:
    # A request found the file behind the log: catch it up now, not in a second.
    wake()


def watch() -> None:
    """Start the watch alone (a Celery worker: beat runs its periodic work)."""
    _start(periodic=False)


_first_request = FirstRequest("urlguard.nodesync.embedded", lambda: _start(periodic=True))


def _start(*, periodic: bool) -> None:
    global _periodic
    if upkeep.thread is None:
        _periodic = periodic
        upkeep.start()


def wake() -> None:
    """Catch up now (e.g. the database is back), not at the next interval."""
    upkeep.wake()


class Upkeep:
    """What the thread does each WATCH_SECONDS: decide from the clock and the file's
    state whether to catch up or verify now, do it, and back off after a failure (a
    file that cannot be repaired, e.g. on a full or read-only disk, is retried at
    growing intervals up to CATCHUP_INTERVAL, not every second). A catch-up that
    failed on the database is repeated as soon as the database answers again."""

    def __init__(self, now: float, path: str | None = None, *, periodic: bool = True) -> None:
        self.path = path or conf.FILTER_PATH
        #: False: only watch the file (catch it up when unusable); no interval work.
        self.periodic = periodic
        self.catch_up_at = now + conf.CATCHUP_INTERVAL if periodic else math.inf
        interval = conf.VERIFY_INTERVAL
        self.verify_at = now + interval if interval > 0 and periodic else None
        self.retry_at = now
        self.failures = 0
        self.database_down = False

    def due(self, now: float, *, unusable: bool, woken: bool) -> tuple[bool, bool]:
        """(catch up, verify) now?"""
        catch_up = now >= self.catch_up_at or ((unusable or woken) and now >= self.retry_at)
        verify = self.verify_at is not None and now >= self.verify_at and not unusable
        return catch_up, verify

    def tick(self, now: float, *, woken: bool = False) -> tuple[bool, bool]:
        """One round; returns what it ran (catch-up, verify)."""
        if self.database_down:
            if not _database_answers():
                return False, False
            logger.info("the database answers again: catching up the filter now")
            self.database_down = False
            self.retry_at = now
            woken = True
        unusable = registry.get_filter(self.path) is None
        catch_up, verify = self.due(now, unusable=unusable, woken=woken)
        if catch_up or verify:
            self.run(catch_up, verify)
        else:
            # A file mapped anew was compared with the log: no idle connection kept.
            connections.close_all()
        return catch_up, verify

    def run(self, catch_up: bool, verify: bool) -> None:
        ok = True
        try:
            if catch_up:
                sync.sync_and_report(periodic=self.periodic)
            if verify:
                sync.verify_and_repair(self.path)
        except Exception as exc:
            ok = False
            self.database_down = isinstance(exc, DatabaseError)
            logger.exception(
                "upkeep of the filter failed; retrying %s",
                "when the database answers again"
                if self.database_down
                else f"in at most {conf.CATCHUP_INTERVAL} s",
            )
        finally:
            # A thread's connections are its own; never leave one open between rounds.
            connections.close_all()
        self.done(time.monotonic(), caught_up=catch_up, verified=verify, ok=ok)

    def done(self, now: float, *, caught_up: bool, verified: bool, ok: bool) -> None:
        interval = conf.CATCHUP_INTERVAL
        if ok:
            self.failures = 0
            self.retry_at = now
        else:
            self.failures += 1
            self.retry_at = now + min(interval, 2.0**self.failures)
        if caught_up and self.periodic:
            self.catch_up_at = now + interval
        if verified and self.verify_at is not None:
            self.verify_at = now + conf.VERIFY_INTERVAL


def _database_answers() -> bool:
    try:
        connections["default"].ensure_connection()
        return True
    except Exception:
        connections.close_all()
        return False


def _loop(stopped: threading.Event) -> None:
    # A thread that outlives stop()'s join (busy in a catch-up) still stops after it.
    state = Upkeep(time.monotonic(), periodic=_periodic)
    while not stopped.is_set():
        woken = upkeep.wait(WATCH_SECONDS)
        if stopped.is_set():
            break
        state.tick(time.monotonic(), woken=woken)


#: The upkeep thread of this process.
upkeep = Daemon("urlguard-catch-up", _loop)


def stop(timeout: float = 5.0) -> None:
    """Stop the thread (tests), so that a later install() starts a new one."""
    upkeep.stop(timeout)
    _first_request.uninstall()
