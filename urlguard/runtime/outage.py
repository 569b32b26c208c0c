"""How a background loop or a server logs a dependency that fails over and over (the
database away, a full disk): the first failure once, with its traceback; then one
line a minute counting the failures meanwhile; then one line when it works again.
A loop retrying every second must not write a traceback every second."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["OutageLog"]


class OutageLog:
    """The log of one outage at a time of `what` (e.g. "pre-rendering the exports"):
    call `failed(exc)` on each failure and `recovered()` on each success."""

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
        self._lock = threading.Lock()
        self._since: float | None = None  # when the outage began; None while it works
        self._failures = 0  # in the whole outage
        self._unreported = 0  # since the last line
        self._reported_at = 0.0

    @property
    def failing(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException) -> None:
        now = self.clock()
        with self._lock:
            self._failures += 1
            if self._since is None:
                self._since = self._reported_at = now
                first = True
            else:
                self._unreported += 1
                if now - self._reported_at < self.interval:
                    return
                first = False
                count, self._unreported = self._unreported, 0
                span, self._reported_at = now - self._reported_at, now
                lasted = now - self._since
        if first:
            self.logger.error(
                "%s failed: %s (logged once; a count a minute until it recovers)",
                self.what,
                _describe(exc),
                exc_info=exc,
            )
        else:
            self.logger.error(
                "%s still failing: %d more failure(s) in the last %.0f s, %.0f s in all (last: %s)",
                self.what,
                count,
                span,
                lasted,
                _describe(exc),
            )

    def recovered(self) -> None:
        if self._since is None:  # the common case, without the lock
            return
        now = self.clock()
        with self._lock:
            if self._since is None:
                return
            lasted, failures = now - self._since, self._failures
            self._since, self._failures, self._unreported = None, 0, 0
        self.logger.warning(
            "%s works again after %.0f s and %d failure(s)", self.what, lasted, failures
        )


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
