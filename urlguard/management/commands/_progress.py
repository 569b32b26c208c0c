"""A one-line progress display for management commands, shown only on a terminal
(piped output and logs stay clean)."""

from __future__ import annotations

import time
from typing import Any


class Progress:
    def __init__(self, stream: Any, label: str, *, every: float = 0.2):
        self.stream = stream
        self.label = label
        self.every = every
        self.enabled = bool(getattr(stream, "isatty", lambda: False)())
        self.started = time.monotonic()
        self._last = 0.0

    def __call__(self, done: int, total: int | None = None) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < self.every and done != total:
            return
        self._last = now
        rate = done / max(now - self.started, 1e-9)
        of = f" / {total:,} ({100 * done / total:.0f}%)" if total else ""
        self.stream.write(f"\r{self.label}: {done:,}{of}  {rate:,.0f}/s ", ending="")
        self.stream.flush()

    def end(self) -> None:
        if self.enabled:
            self.stream.write("")
