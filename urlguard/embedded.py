"""The embedded default has no broker and so no Celery beat: each process that serves
requests runs the periodic catch-up itself, in one daemon thread started by its first
request (a management command or the runserver reloader parent never starts it)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.core.signals import request_started
from django.db import connections

from urlguard import sync
from urlguard.conf import conf

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_stop = threading.Event()
_thread: threading.Thread | None = None


def install() -> None:
    """Start the catch-up thread on this process's first request."""
    request_started.connect(_on_first_request, dispatch_uid="urlguard.embedded")


def _on_first_request(sender: Any = None, **kwargs: Any) -> None:
    global _thread
    with _lock:
        if _thread is not None:
            return
        # Later requests pay nothing for this signal.
        request_started.disconnect(dispatch_uid="urlguard.embedded")
        _stop.clear()
        _thread = threading.Thread(target=_loop, name="urlguard-catch-up", daemon=True)
        _thread.start()


def _loop() -> None:
    while not _stop.wait(float(conf.CATCHUP_INTERVAL)):
        try:
            sync.sync_and_report(periodic=True)
        except Exception:
            logger.exception(
                "periodic catch-up of the filter failed; retrying in %s s", conf.CATCHUP_INTERVAL
            )
        finally:
            # A thread's connections are its own; never leave one open between rounds.
            connections.close_all()


def stop(timeout: float = 5.0) -> None:
    """Stop the thread (tests), so that a later install() starts a new one."""
    global _thread
    with _lock:
        thread, _thread = _thread, None
    _stop.set()
    if thread is not None:
        thread.join(timeout)
    request_started.disconnect(dispatch_uid="urlguard.embedded")
