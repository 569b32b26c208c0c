"""The embedded default has no broker and so no beat: each serving process refreshes
due feeds in one daemon thread of its own, started by its first request (like the
embedded catch-up, and apart from it, so a long refresh never delays a catch-up).
Two processes refreshing one source at once are harmless: the source's claim
lets one of them through."""

from __future__ import annotations

import logging
import threading

from django.db import connections

from urlguard.conf import conf
from urlguard.feeds.refresh import due_sources, refresh_source
from urlguard.runtime import ownership
from urlguard.runtime.firstrequest import FirstRequest
from urlguard.runtime.process import Daemon

logger = logging.getLogger(__name__)


def install() -> None:
    _first_request.install()


def run_once() -> list[str]:
    """Refresh every due source now, in this thread; returns their names. First marks
    admin jobs whose runner died failed and releases claims whose owner is gone."""

    ownership.recover_orphans()
    names = []
    for source in due_sources():
        refresh_source(source)
        names.append(source.name)
    return names


def _loop(stopped: threading.Event) -> None:
    while not stopped.wait(conf.FEED_CHECK_INTERVAL):
        try:
            run_once()
        except Exception:
            logger.exception(
                "refreshing due feeds failed; retrying in %s s", conf.FEED_CHECK_INTERVAL
            )
        finally:
            connections.close_all()


#: The refreshing thread of this process.
refresher = Daemon("urlguard-feeds", _loop)
_first_request = FirstRequest("urlguard.feeds.runner", refresher.start)


def stop(timeout: float = 5.0) -> None:
    """Stop the thread (tests), so that a later install() starts a new one."""
    refresher.stop(timeout)
    _first_request.uninstall()
