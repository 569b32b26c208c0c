"""An outage of something a loop or a server depends on (the database, a disk), logged
as an operator wants to read it: once when it starts (with its traceback), then a
count at most once a minute while it lasts, then once when it is over. A server that
fails every request during an outage must not write a traceback per request."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["OutageLog"]


class OutageLog:
    """`failed(exc)` after each failure of `what`, `recovered()` after each success;
    cheap when nothing is wrong (a flag read), safe from any thread."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.what = what
        self.interval = interval
        self.clock = clock
        self.down = False
        self._lock = threading.Lock()
        self._since = 0.0
        self._reported = 0.0
        self._failures = 0  # since the outage began
        self._unreported = 0  # since the last line about it

    def failed(self, exc: BaseException) -> None:
        now = self.clock()
        with self._lock:
            if not self.down:
                self.down = True
                self._since = self._reported = now
                self._failures, self._unreported = 1, 0
                first = True
            else:
                first = False
                self._failures += 1
                self._unreported += 1
                if now - self._reported < self.interval:
                    return
                self._reported = now
                count, self._unreported = self._unreported, 0
                lasted = now - self._since
        if first:
            self.logger.error("%s failed: %s", self.what, _describe(exc), exc_info=exc)
        else:
            self.logger.error(
                "%s still failing after %.0f s: %d more failure(s) since the last report (%s)",
                self.what,
                lasted,
                count,
                _describe(exc),
            )

    def recovered(self) -> None:
        if not self.down:  # the common case: no lock taken
            return
        now = self.clock()
        with self._lock:
            if not self.down:
                return
            self.down = False
            failures, lasted = self._failures, now - self._since
        self.logger.warning(
            "%s works again after %.0f s (%d failure(s) in all)", self.what, lasted, failures
        )


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())  # a driver's message may span lines
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__
