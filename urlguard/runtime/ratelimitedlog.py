"""A logger wrapper that writes at most one record per kind and interval: a filter
that cannot be read must be visible in the log without flooding it at thousands of
redirects per second."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

__all__ = ["RateLimitedLog", "log_limited"]


class RateLimitedLog:
    """At most one record per `interval` seconds per kind, counting the rest."""

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 60.0,
        suppressed: str = "similar messages suppressed",
    ) -> None:
        self.logger = logger
        self.interval = interval
        # How the next record counts the ones left out, e.g. "more requests failed".
        self.suppressed = suppressed
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, kind: str, level: int, msg: str, *args: Any, exc_info: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self.interval:
                self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
                return
            self._last[kind] = now
            suppressed = self._suppressed.pop(kind, 0)
        if suppressed:
            msg += f" (%d {self.suppressed})"
            args = (*args, suppressed)
        self.logger.log(level, msg, *args, exc_info=exc_info)


# One instance for the guard and the middleware: their degraded answers are one
# condition, logged under the guard's name.
log_limited = RateLimitedLog(logging.getLogger("urlguard.hotpath.guard"))
