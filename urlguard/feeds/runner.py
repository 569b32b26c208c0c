"""The embedded default has no broker and so no beat: each serving process refreshes
due feeds in one daemon thread of its own, started by its first request (like the
embedded catch-up, and apart from it, so a long refresh never delays a catch-up).
Two processes refreshing one source at once are harmless: the source's claim
lets one of them through."""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.core.signals import request_started
from django.db import connections

from urlguard.conf import conf

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_stop = threading.Event()
_thread: threading.Thread | None = None
_UID = "urlguard.feeds.runner"


def install() -> None:
    request_started.connect(_on_first_request, dispatch_uid=_UID)


def _on_first_request(sender: Any = None, **kwargs: Any) -> None:
    global _thread
    with _lock:
        if _thread is not None:
            return
        request_started.disconnect(dispatch_uid=_UID)
        _stop.clear()
        _thread = threading.Thread(target=_loop, name="urlguard-feeds", daemon=True)
        _thread.start()


def run_once() -> list[str]:
    """Refresh every due source now, in this thread; returns their names. First marks
    admin jobs whose runner died failed and releases claims whose owner is gone."""
    from urlguard.feeds.refresh import due_sources, refresh_source
    from urlguard.runtime import ownership

    ownership.recover_orphans()
    names = []
    for source in due_sources():
        refresh_source(source)
        names.append(source.name)
    return names


def _loop() -> None:
    while not _stop.wait(conf.FEED_CHECK_INTERVAL):
        try:
            run_once()
        except Exception:
            logger.exception(
                "refreshing due feeds failed; retrying in %s s", conf.FEED_CHECK_INTERVAL
            )
        finally:
            connections.close_all()


def stop(timeout: float = 5.0) -> None:
    """Stop the thread (tests), so that a later install() starts a new one."""
    global _thread
    with _lock:
        thread, _thread = _thread, None
    _stop.set()
    if thread is not None:
        thread.join(timeout)
    request_started.disconnect(dispatch_uid=_UID)
