"""The process-wide filter registry: one read-only mapping of the node's filter file
per process (opened at start-up, shared by every request and thread), and the
short-lived writer that the change-applying code uses.

A read-only ScalingCountingBloomFilter notices by itself (cheaply, before it answers)
a new stage or a file replaced by a rebuild, so the registry never reopens per
request; it only retries, at most once a second, a file that could not be opened.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from filterengine import FilterFileError, FilterLockedError, ScalingCountingBloomFilter
from urlguard.conf import conf

logger = logging.getLogger(__name__)

__all__ = ["get_filter", "writer", "open_writer", "file_written", "forget", "reset", "WriterBusy"]

# An unreadable file is retried at most this often: a missing filter must not cost
# every request a failed open() and a log line.
RETRY_SECONDS = 1.0

_lock = threading.Lock()
_filters: dict[str, ScalingCountingBloomFilter] = {}
# path -> (monotonic time of the next attempt, reason of the last failure)
_failures: dict[str, tuple[float, str]] = {}


class WriterBusy(FilterLockedError):
    """Another process kept the filter's writer lock longer than the bounded wait."""

    @classmethod
    def after(cls, exc: FilterLockedError, timeout: float) -> WriterBusy:
        """The engine's FilterLockedError after waiting `timeout` seconds, with what to do."""
        return cls(
            f"{exc} (waited {timeout:g} s; if no rebuild is running, look for a stuck worker)"
        )


def get_filter(path: str | None = None) -> ScalingCountingBloomFilter | None:
    """The read-only filter for `path` (default: URLGUARD FILTER_PATH), or None when
    it is missing or unreadable (logged once per condition; never raises)."""
    if path is None:
        path = conf.FILTER_PATH
    filt = _filters.get(path)
    if filt is not None:
        return filt
    failure = _failures.get(path)
    if failure is not None and time.monotonic() < failure[0]:
        return None
    return _open(path)


def _open(path: str) -> ScalingCountingBloomFilter | None:
    with _lock:
        filt = _filters.get(path)
        if filt is not None:
            return filt
        previous = _failures.get(path)
        try:
            filt = ScalingCountingBloomFilter.open(path, readonly=True)
        except FileNotFoundError:
            reason = "missing (run `manage.py rebuild_filter`, or let a worker catch up)"
        except (OSError, FilterFileError) as exc:
            reason = f"unreadable: {exc}"
        except Exception as exc:  # never let a request die on the filter
            reason = f"unreadable ({type(exc).__name__}): {exc}"
        else:
            _filters[path] = filt
            if previous is not None:
                logger.info("filter file %s is readable again", path)
                del _failures[path]
            return filt
        if previous is None or previous[1] != reason:
            logger.warning(
                "filter file %s is %s; checks follow ON_FILTER_ERROR=%r",
                path,
                reason,
                conf.ON_FILTER_ERROR,
            )
        _failures[path] = (time.monotonic() + RETRY_SECONDS, reason)
        return None


def open_at_startup() -> None:
    """AppConfig.ready: map the filter once, if it exists, so the first request does
    not pay for it. A missing file is reported by the system check (W001), not here."""
    path = conf.FILTER_PATH
    try:
        if os.path.exists(path):
            get_filter(path)
    except Exception:  # start-up must never fail because of the filter
        logger.exception("could not open filter file %s at start-up", path)


def file_written(path: str) -> None:
    """This process just (re)wrote `path`: a remembered failure to open it is stale,
    so the next get_filter() tries again at once instead of after RETRY_SECONDS."""
    with _lock:
        _failures.pop(path, None)


def forget(path: str | None = None) -> None:
    """Drop this process's mapping of `path` (e.g. after it raised), so that the next
    get_filter() opens the file afresh."""
    if path is None:
        path = conf.FILTER_PATH
    with _lock:
        filt = _filters.pop(path, None)
        _failures.pop(path, None)
    if filt is not None:
        try:
            filt.close()
        except Exception:
            logger.debug("closing %s failed", path, exc_info=True)


def reset() -> None:
    """Forget every mapping (tests; settings changes)."""
    for path in list(_filters):
        forget(path)
    with _lock:
        _failures.clear()


def open_writer(
    path: str | None = None, *, timeout: float | None = None
) -> ScalingCountingBloomFilter:
    """Open this node's filter file for writing under the engine's lock, waiting at
    most `timeout` seconds (default URLGUARD WRITER_LOCK_TIMEOUT) for another writer
    to finish. The caller closes it (close() flushes).

    Raises FileNotFoundError / FilterFileError for a missing / unreadable file, and
    WriterBusy when the wait runs out."""
    if path is None:
        path = conf.FILTER_PATH
    if timeout is None:
        timeout = float(conf.WRITER_LOCK_TIMEOUT)
    try:
        return ScalingCountingBloomFilter.open(path, readonly=False, lock_timeout=timeout)
    except FilterLockedError as exc:
        raise WriterBusy.after(exc, timeout) from exc


@contextmanager
def writer(
    path: str | None = None, *, timeout: float | None = None
) -> Iterator[ScalingCountingBloomFilter]:
    """open_writer() as a context manager: closes it (flush, release the lock) on the
    way out. Keep the block short: in-process (eager) mode, every web process
    that applies a change takes this lock."""
    filt = open_writer(path, timeout=timeout)
    try:
        yield filt
    finally:
        filt.close()  # flushes first (msync, then the clean mark), unless a change is open
