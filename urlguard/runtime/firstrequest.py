"""Work a serving process starts at its first request: a forked worker's, never the
master that imported the app before forking (gunicorn --preload), nor a management
command that only loaded it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.signals import request_started

__all__ = ["FirstRequest"]


class FirstRequest:
    """Calls `start()` at the first request after install(); later requests pay
    nothing (the receiver disconnects itself)."""

    def __init__(self, uid: str, start: Callable[[], object]) -> None:
        self.uid = uid
        self._start = start

    def install(self) -> None:
        request_started.connect(self._on_request, dispatch_uid=self.uid)

    def uninstall(self) -> None:
        request_started.disconnect(dispatch_uid=self.uid)

    def _on_request(self, sender: Any = None, **kwargs: Any) -> None:
        request_started.disconnect(dispatch_uid=self.uid)
        self._start()
