"""The process-wide filter registry: one read-only mapping of the node's filter file
per process (opened at start-up, shared by every request and thread), and the
short-lived writer that the change-applying code uses.

A read-only ScalingCountingBloomFilter notices by itself (cheaply, before it answers)
a new stage, a file replaced by a rebuild, or a file truncated under it. What it
cannot notice is a file removed, moved over or copied over at the path, or a writer
that died mid-change: so at most once a second (one `stat` and one header read, off
the per-URL cost) the registry checks that its mapping is still the file at the path,
as the writers left it, and clean, and remaps, or answers None (checks follow
ON_FILTER_ERROR) until the file is usable again. A file that could not be opened is
retried at most once a second too.

A file mapped anew (not one our writers rebuilt: those the engine follows by itself)
is trusted only when its applied_seq has reached the change log's head, read once per
remap. Until then checks are degraded and this node's writer is woken (the callbacks
of `when_behind`) to catch it up. Behind is normal lag (another process committed
changes not applied yet: logged at DEBUG); only a file older than one this process
saw at the path (its generation or applied_seq went back: a backup moved or copied
in) is a warning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

from filterengine import (
    FilterFileError,
    FilterLockedError,
    ScalingCountingBloomFilter,
    acquire_lock,
    file_status,
    release_lock,
    writer_active,
)
from urlguard.conf import conf
from urlguard.models import ChangeEvent
from urlguard.runtime.process import on_reset

logger = logging.getLogger(__name__)

__all__ = [
    "WriterBusy",
    "file_written",
    "forget",
    "clear_behind",
    "get_filter",
    "mapped",
    "mark_behind",
    "open_writer",
    "problem",
    "reset",
    "sync_lock",
    "when_behind",
    "writer",
]

# An unreadable file is retried at most this often: a missing filter must not cost
# every request a failed open() and a log line.
RETRY_SECONDS = 1.0
# A mapping checks at most this often that it is still the (clean) file at its path:
# a rule added after the file was removed and rebuilt blocks within this time.
CHECK_SECONDS = 1.0
# Beside the file: present while the node's file is behind committed changes it
# could not take (see mark_behind).
BEHIND_SUFFIX = ".behind"

Identity = tuple[int, int]  # (st_dev, st_ino) of a file
Position = tuple[int, int]  # (generation, applied_seq) of a file


class Behind(NamedTuple):
    """A mapping found behind the change log: it answers as soon as this node's
    writer has brought it to `head`."""

    filt: ScalingCountingBloomFilter
    head: int
    identity: Identity  # of the file it maps, at the time
    went_back: bool  # older than what this process saw at the path (a backup)


@dataclass(slots=True, eq=False)
class PathState:
    """All this process knows of the filter file at one path. Made by the first
    get_filter() (open), updated by the once-a-second checks (check), removed whole
    by forget() and reset(): nothing of a path outlives its record."""

    #: The mapping checks are answered from; None while the file cannot answer.
    mapping: ScalingCountingBloomFilter | None = None
    #: The file the mapping was opened on.
    identity: Identity | None = None
    #: Monotonic time of the mapping's next identity check.
    next_check: float = 0.0
    #: Mapped at start-up, before the database may be asked: its first check
    #: compares it with the log.
    unverified: bool = False
    #: Why the file cannot answer now (None: it can, or it was never tried), and the
    #: monotonic time of the next attempt.
    failure: str | None = None
    retry_at: float = 0.0
    behind: Behind | None = None
    #: The mapping's position at its last check: an older applied_seq or another
    #: generation in the same inode is a file copied over it.
    last_seen: Position | None = None
    #: The newest position seen at the path, kept across remaps: a file mapped anew
    #: below it went back (a backup), and does not merely lag.
    newest_seen: Position | None = None
    #: Files found dirty with no writer alive: they stay dirty until a rebuild
    #: replaces them, even while the writer repairing them holds the lock.
    dirty: set[Identity] = field(default_factory=set)

    def unmap(self) -> None:
        """Stop answering from the mapping without closing it: another thread may be
        answering from it right now; it is unmapped when the last reference goes."""
        self.mapping = None
        self.identity = None
        self.next_check = 0.0
        self.last_seen = None

    def trust(self, filt: ScalingCountingBloomFilter, identity: Identity | None) -> None:
        """Answer checks from `filt`."""
        self.mapping = filt
        if identity is not None:
            self.identity = identity
        self.next_check = time.monotonic() + CHECK_SECONDS
        self.failure = None
        self.remember(filt)

    def remember(self, filt: ScalingCountingBloomFilter) -> None:
        with contextlib.suppress(Exception):
            seen = (int(filt.generation), int(filt.applied_seq))
            self.last_seen = seen
            newest = self.newest_seen or seen
            self.newest_seen = (max(newest[0], seen[0]), max(newest[1], seen[1]))

    def failed(self, path: str, reason: str, *, level: int = logging.WARNING) -> None:
        """The file cannot answer for `reason`: said once (again when the reason
        changes), retried after RETRY_SECONDS."""
        if self.failure != reason:
            logger.log(
                level,
                "filter file %s is %s; checks follow ON_FILTER_ERROR=%r",
                path,
                reason,
                conf.ON_FILTER_ERROR,
            )
        self.failure = reason
        self.retry_at = time.monotonic() + RETRY_SECONDS


# Guards every PathState's changes; get_filter() reads them without it.
_lock = threading.Lock()
_paths: dict[str, PathState] = {}
# Called with the path when a mapping is found behind the log (see when_behind).
_behind_callbacks: list[Callable[[str], None]] = []


def _state(path: str) -> PathState:
    """The record of `path`, made on first use (under _lock)."""
    state = _paths.get(path)
    if state is None:
        state = _paths[path] = PathState()
    return state


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
    state = _paths.get(path)
    if state is None:
        return _open(path)
    filt = state.mapping
    if filt is not None:
        if time.monotonic() < state.next_check:
            return filt
        return _recheck(path, filt)
    if state.failure is None:
        return _open(path)
    if state.behind is not None:
        caught_up = _caught_up(path)
        if caught_up is not None:
            return caught_up
    if time.monotonic() < state.retry_at or _still_behind(path):
        return None
    return _open(path)


def mapped(path: str | None = None) -> ScalingCountingBloomFilter | None:
    """The mapping checks of `path` are answered from now, without checking it."""
    state = _paths.get(conf.FILTER_PATH if path is None else path)
    return state.mapping if state is not None else None


def when_behind(callback: Callable[[str], None]) -> None:
    """Call `callback(path)` whenever this process maps a file that is behind the
    change log (a restored backup): the node's writer should catch it up now."""
    if callback not in _behind_callbacks:
        _behind_callbacks.append(callback)


def _caught_up(path: str) -> ScalingCountingBloomFilter | None:
    """The mapping found behind once its writer has brought it to the head it was
    compared with (read from the mapping: no query); None while it is behind."""
    with _lock:
        state = _state(path)
        behind = state.behind
        if behind is None:
            return state.mapping
        try:
            ready = behind.filt.applied_seq >= behind.head and not _unusable(
                state, path, behind.filt
            )
        except Exception:
            ready = False
        if not ready:
            return None
        state.behind = None
        state.trust(behind.filt, _mapped_identity(behind.filt))
        logger.log(
            logging.INFO if behind.went_back else logging.DEBUG,
            "filter file %s has caught up with the change log (#%d)",
            path,
            behind.head,
        )
        return behind.filt


def _still_behind(path: str) -> bool:
    """Is the file at `path` still the one found behind the log? Then it is not
    mapped and compared again (the writer is at it): one `stat` a second."""
    with _lock:
        state = _state(path)
        if state.behind is None:
            return False
        try:
            same = _identity(os.stat(path)) == state.behind.identity
        except OSError:
            same = False
        if same:
            state.retry_at = time.monotonic() + RETRY_SECONDS
        return same


def _behind_log(path: str, filt: ScalingCountingBloomFilter) -> tuple[str, int, bool]:
    """Is a mapping taken anew behind the change log? (why, head, whether the file
    went back from what this process saw at `path`) with one query; ("", 0, False)
    when it is current, or when the database cannot say (then the file is trusted
    as before: a node without its database answers from the file)."""
    try:
        head = ChangeEvent.objects.head()
        applied = int(filt.applied_seq)
        generation = int(filt.generation)
    except Exception as exc:
        logger.debug("could not compare filter %s with the change log: %s", path, exc)
        return "", 0, False
    if applied >= head:
        return "", 0, False
    state = _paths.get(path)
    newest = state.newest_seen if state is not None else None
    if newest is not None and (generation < newest[0] or applied < newest[1]):
        return (
            f"behind the change log (mapped anew at change #{applied}, the log is at #{head}, "
            f"but this process saw this path at #{newest[1]}: an older file moved or copied "
            "in, e.g. a backup; this node's writer is woken to catch it up)",
            head,
            True,
        )
    return (
        f"behind the change log (mapped at change #{applied}, the log is at #{head}: "
        "changes committed by another process, not applied here yet; this node's writer "
        "is woken to apply them)",
        head,
        False,
    )


def problem(path: str | None = None) -> str:
    """Why checks of `path` are degraded in this process ("" when they are not)."""
    if path is None:
        path = conf.FILTER_PATH
    if get_filter(path) is not None:
        return ""
    state = _paths.get(path)
    failure = state.failure if state is not None else None
    return failure if failure is not None else "not opened yet"


_MISSING = "missing (run `manage.py rebuild_filter`, or let a worker catch up)"


def _open(path: str, *, check_log: bool = True) -> ScalingCountingBloomFilter | None:
    with _lock:
        state = _state(path)
        if state.mapping is not None:
            return state.mapping
        stale, state.behind = state.behind, None
        if stale is not None:
            _close_quietly(stale.filt)
        previous = state.failure
        filt, identity, reason = _map(state, path)
        if filt is None:
            state.failed(path, reason)
            return None
    # The query outside the lock: other threads keep answering meanwhile.
    behind, head, went_back = _behind_log(path, filt) if check_log else ("", 0, False)
    with _lock:
        state = _state(path)  # forget() may have removed it meanwhile
        if state.mapping is not None:  # another thread mapped it meanwhile
            _close_quietly(filt)
            return state.mapping
        if not behind:
            state.trust(filt, _mapped_identity(filt) or identity)
            if not check_log:
                state.unverified = True
                state.next_check = 0.0  # the first lookup compares it
            if previous is not None:
                logger.info("filter file %s is readable again", path)
            return filt
        state.behind = Behind(filt, head, identity, went_back)
        # Lag is normal (a write another process committed a moment ago): not news.
        state.failed(path, behind, level=logging.WARNING if went_back else logging.DEBUG)
    for callback in list(_behind_callbacks):
        try:
            callback(path)
        except Exception:
            logger.exception("waking the writer of %s failed", path)
    return None


def _map(state: PathState, path: str) -> tuple[ScalingCountingBloomFilter | None, Identity, str]:
    """(mapping, identity, "") of a usable file at `path`, else (None, _, why not)."""
    try:
        # The identity first: if the file is replaced between the stat and the
        # open, the next check sees a mismatch and maps it again (never the
        # reverse, a stale mapping taken for the file at the path).
        identity = _identity(os.stat(path))
        filt = ScalingCountingBloomFilter.open(path, readonly=True)
    except FileNotFoundError:
        return None, (0, 0), _MISSING
    except (OSError, FilterFileError) as exc:
        return None, (0, 0), f"unreadable: {exc}"
    except Exception as exc:  # never let a request die on the filter
        return None, (0, 0), f"unreadable ({type(exc).__name__}): {exc}"
    reason = _unusable(state, path, filt)
    if reason:
        _close_quietly(filt)
        return None, identity, reason
    return filt, identity, ""


def _identity(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino)


def _mapped_identity(filt: ScalingCountingBloomFilter) -> Identity | None:
    """(device, inode) of the file `filt` maps now, after following a rebuild (which
    replaces the inode at the path): None if it cannot say (closed)."""
    try:
        identity = filt.file_identity
    except Exception:
        return None
    return (identity.dev, identity.ino)


_NOT_COMPARED = "not compared with the change log yet"


def _recheck(path: str, filt: ScalingCountingBloomFilter) -> ScalingCountingBloomFilter | None:
    """Once a second: is `filt` still the file at `path`, and clean? Remap a replaced
    file; drop a removed or dirty one (None: checks follow ON_FILTER_ERROR)."""
    with _lock:
        state = _state(path)
        if state.mapping is not filt:
            if state.mapping is not None:
                return state.mapping
        elif time.monotonic() < state.next_check:
            return filt  # another thread checked meanwhile
        state.next_check = time.monotonic() + CHECK_SECONDS
        try:
            at_path = _identity(os.stat(path))
        except FileNotFoundError:
            reason = _MISSING
        except OSError as exc:
            reason = f"unreadable: {exc}"
        else:
            mapped = _mapped_identity(filt) or state.identity
            reason = "" if mapped == at_path else "replaced"
            if not reason:
                reason = _copied_over(state, path, filt) or _unusable(state, path, filt)
                if not reason and state.unverified:
                    state.unverified = False
                    reason = _NOT_COMPARED
                if not reason:
                    state.remember(filt)
                    return filt
        state.unmap()
    if reason == _NOT_COMPARED:
        return _open(path)
    if reason in ("replaced", _COPIED_OVER):
        # Removed and rebuilt, or another file moved or copied over it: the file at
        # the path is the one the writers keep current, once it has the log's head.
        logger.warning(
            "filter file %s was %s under this process; mapping the new one", path, reason
        )
        return _open(path)
    with _lock:
        state = _state(path)
        state.failure = None  # said again: it stopped answering just now
        state.failed(path, reason)
    return None


_COPIED_OVER = "copied over in place"


def _copied_over(state: PathState, path: str, filt: ScalingCountingBloomFilter) -> str:
    """The same inode, but another file's contents (a `cp` onto the path): another
    generation, or an applied_seq older than this mapping has seen. Our writers only
    ever move applied_seq forward, and give a new generation only to a new inode."""
    seen = state.last_seen
    try:
        generation = file_status(path).generation
        mapped = int(filt.generation)  # the header parsed when it was mapped
        applied = int(filt.applied_seq)
    except Exception:
        return ""  # unreadable: the mapping's own checks say so
    if generation != mapped or (seen is not None and seen[0] == mapped and applied < seen[1]):
        return _COPIED_OVER
    return ""


def _unusable(state: PathState, path: str, filt: ScalingCountingBloomFilter) -> str:
    """Why an open mapping must not answer checks ("" if it may)."""
    behind = _behind(path)
    if behind:
        return behind
    try:
        if filt.is_clean:
            return ""
    except Exception as exc:
        return f"unreadable: {exc}"
    # Not clean: a writer is in the middle of a change (normal), or one died there.
    identity = _mapped_identity(filt)
    if identity in state.dirty or _torn(path) or not writer_active(path):
        if identity is not None:
            state.dirty.add(identity)
        return (
            "dirty (a writer died in the middle of a change, so counters may be "
            "missing; the next catch-up rebuilds it)"
        )
    return ""


def _behind(path: str) -> str:
    try:
        with open(path + BEHIND_SUFFIX, encoding="utf-8", errors="replace") as f:
            why = f.read(2000).strip() or "the file could not take changes"
    except FileNotFoundError:
        return ""
    except OSError as exc:
        why = str(exc)
    return f"behind the change log ({why}; the next catch-up retries)"


def mark_behind(path: str, why: str) -> None:
    """The node's file could not take committed changes (e.g. the disk is full): every
    process of the node stops answering from it (ON_FILTER_ERROR applies, so the
    table answers and nothing listed passes) until a sync succeeds. Best effort."""
    marker = path + BEHIND_SUFFIX
    try:
        with open(marker, "w", encoding="utf-8") as f:
            f.write(why[:2000])
    except OSError:
        # A full disk may refuse the text but still take the empty file.
        try:
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        except OSError:
            logger.exception("could not mark filter %s as behind the change log", path)
    with _lock:
        state = _paths.get(path)
        if state is not None:
            state.next_check = 0.0


def clear_behind(path: str) -> None:
    """A sync brought `path` up to date: forget mark_behind()."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path + BEHIND_SUFFIX)


def _torn(path: str) -> bool:
    """Has a writer found this file torn (a previous writer died mid-change)? Then it
    stays dirty, whoever holds the lock, until a rebuild replaces it."""
    try:
        return file_status(path).torn
    except Exception:
        return False


def _close_quietly(filt: ScalingCountingBloomFilter) -> None:
    with contextlib.suppress(Exception):
        filt.close()


def open_at_startup() -> None:
    """AppConfig.ready: map the filter once, if it exists, so the first request does
    not pay for it. A missing file is reported by the system check (W001), not here."""
    path = conf.FILTER_PATH
    try:
        if os.path.exists(path):
            # No query while apps load: the first check compares it with the log.
            _open(path, check_log=False)
    except Exception:  # start-up must never fail because of the filter
        logger.exception("could not open filter file %s at start-up", path)


def file_written(path: str) -> None:
    """This process just (re)wrote `path`: a remembered failure to open it is stale,
    so the next get_filter() tries again at once instead of after RETRY_SECONDS."""
    with _lock:
        state = _paths.get(path)
        if state is not None:
            state.failure = None


def forget(path: str | None = None) -> None:
    """Drop all this process knows of `path` (e.g. after its mapping raised), so that
    the next get_filter() opens the file afresh."""
    if path is None:
        path = conf.FILTER_PATH
    with _lock:
        state = _paths.pop(path, None)
    if state is None:
        return
    if state.behind is not None:
        _close_quietly(state.behind.filt)
    if state.mapping is not None:
        try:
            state.mapping.close()
        except Exception:
            logger.debug("closing %s failed", path, exc_info=True)


@on_reset
def reset() -> None:
    """Forget every path (tests; settings changes)."""
    for path in list(_paths):
        forget(path)


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
        timeout = conf.WRITER_LOCK_TIMEOUT
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


@contextmanager
def sync_lock(path: str | None = None, *, timeout: float | None = None) -> Iterator[None]:
    """One sync of `path` per node at a time, from its decision (apply in place or
    rebuild) to its end: held around the engine's writer lock, which a missing or
    unreadable file cannot give (the sidecar `<path>.sync.lock`, an flock released
    when the process dies). Waits at most `timeout` seconds (default URLGUARD
    WRITER_LOCK_TIMEOUT), then raises WriterBusy."""
    if path is None:
        path = conf.FILTER_PATH
    if timeout is None:
        timeout = conf.WRITER_LOCK_TIMEOUT
    lock_path = path + ".sync.lock"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = acquire_lock(lock_path, timeout)
    if fd is None:
        raise WriterBusy(
            f"{path}: another process is syncing this filter (its lock {lock_path} is held; "
            f"waited {timeout:g} s; if no rebuild is running, look for a stuck worker)"
        )
    try:
        yield
    finally:
        release_lock(fd)
