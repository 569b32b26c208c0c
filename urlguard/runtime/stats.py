"""Statistics written in batches, off the request path: per-key counter increments,
raw rows and custom batches are buffered in the process and written by one
background thread at least every STATS_FLUSH_INTERVAL seconds, one statement per
table per flush.

    from urlguard.runtime import stats

    HITS = stats.counter("rule_hits", RuleHitCount, keys=("rule_id", "day"),
                         fields=("hits",), upsert=True)
    HITS.add((rule_id, day))                  # hits += 1, merged in memory
    LOG = stats.rows("rule_hit_log", RuleHit)
    LOG.append(RuleHit(rule_id=rule_id, url=url))   # bulk_create'd
    CLICKS = stats.batch("clicks", flush=write_clicks)  # write_clicks(items) in a transaction
    CLICKS.append(item)

Why in the process and not in Redis: an append here costs well under a microsecond
and cannot fail; a Redis round trip costs ~50-100 µs per event on loopback and
makes every redirect depend on one more server. What must hold across processes
and nodes (unique visitors) is decided in the database at flush time anyway.

Guarantees:
- A flush that fails with a database error keeps its items and retries on the
  next tick (IntegrityError/DataError excepted: that batch can never be written,
  so it is dropped and counted as lost).
- Each kind holds at most STATS_BUFFER_MAX pending entries (keys for a counter,
  items otherwise); beyond that the oldest are dropped, logged, and added to the
  kind's loss counter: `lost()` in this process, the StatsLoss table for the
  admin and metrics of every process.
- A graceful stop (SIGTERM/SIGINT from gunicorn or runserver, interpreter exit,
  gunicorn's worker_exit hook) flushes everything. `kill -9` loses what was
  buffered since the last flush: at most STATS_FLUSH_INTERVAL seconds of events
  while the database is up (plus, while it is down, what the buffer held).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import (
    DatabaseError,
    DataError,
    IntegrityError,
    connections,
    models,
    router,
    transaction,
)

from urlguard.conf import conf
from urlguard.models import StatsLoss, database
from urlguard.runtime import metrics
from urlguard.runtime.outage import OutageLog
from urlguard.runtime.process import Daemon, PerProcess, on_reset

__all__ = [
    "Batch",
    "Counter",
    "Rows",
    "batch",
    "counter",
    "flush",
    "lost",
    "pending",
    "rows",
    "set_background",
    "stop",
]

log = logging.getLogger(__name__)

_lock = threading.Lock()  # guards every kind's pending items
_flush_lock = threading.Lock()  # one flush at a time (the thread, exit, tests)
_kinds: dict[str, _Kind] = {}
# Tests' choice (set_background); the flusher's own `enabled` is also off after stop().
_background = True
_lost: dict[str, int] = {}


class _Kind:
    """One named kind of statistic: its pending items and how to write them."""

    name: str
    model: type[models.Model] | None
    bound: int

    def __init__(self, name: str, model: type[models.Model] | None) -> None:
        self.name = name
        self.model = model
        self.bound = conf.STATS_BUFFER_MAX

    # take, give_back and size are called with _lock held; write without it.
    def take(self) -> Any:
        raise NotImplementedError

    def give_back(self, taken: Any) -> None:
        raise NotImplementedError

    def size(self) -> int:
        raise NotImplementedError

    def write(self, taken: Any) -> None:
        raise NotImplementedError

    def count(self, taken: Any) -> int:
        """Events held in `taken` (what a dropped batch loses)."""
        return len(taken)

    def using(self) -> str:
        return router.db_for_write(self.model) if self.model is not None else "default"


class Counter(_Kind):
    """Integer columns incremented per key; increments of one key merge in memory.

    keys: the columns naming a row (a unique constraint when upsert); fields: the
    integer columns incremented. upsert=False updates existing rows only (an
    increment for a missing row is dropped silently: e.g. a deleted link);
    upsert=True inserts missing rows (the table's other columns need defaults in
    the database or must be nullable)."""

    def __init__(
        self,
        name: str,
        model: type[models.Model],
        keys: Sequence[str],
        fields: Sequence[str],
        upsert: bool,
    ) -> None:
        super().__init__(name, model)
        opts = model._meta
        self.key_fields: list[Any] = [opts.get_field(k) for k in keys]
        self.count_fields: list[Any] = [opts.get_field(f) for f in fields]
        self.upsert = upsert
        # key -> [events, increment per field]
        self.pending: OrderedDict[Hashable, list[int]] = OrderedDict()

    def add(self, key: Hashable, *increments: int, **by_field: int) -> None:
        """Add to the counters of `key` (a tuple when there are several key columns):
        positionally in `fields` order, or by field name; none given = +1 to the first."""
        if by_field:
            increments = tuple(by_field.get(f.name, 0) for f in self.count_fields)
        elif not increments:
            increments = (1,)
        with _lock:
            entry = self.pending.get(key)
            if entry is None:
                entry = self.pending[key] = [0] * (1 + len(self.count_fields))
                if len(self.pending) > self.bound:
                    _drop(self, self.pending.popitem(last=False)[1][0])
            entry[0] += 1
            for i, n in enumerate(increments, 1):
                entry[i] += n
        _started()

    def take(self) -> OrderedDict[Hashable, list[int]]:
        taken, self.pending = self.pending, OrderedDict()
        return taken

    def give_back(self, taken: OrderedDict[Hashable, list[int]]) -> None:
        # The failed batch is older than what arrived meanwhile: it goes first.
        for key, entry in self.pending.items():
            old = taken.get(key)
            if old is None:
                taken[key] = entry
            else:
                for i, n in enumerate(entry):
                    old[i] += n
        self.pending = taken
        while len(self.pending) > self.bound:
            _drop(self, self.pending.popitem(last=False)[1][0])

    def size(self) -> int:
        return len(self.pending)

    def count(self, taken: OrderedDict[Hashable, list[int]]) -> int:
        return sum(entry[0] for entry in taken.values())

    def write(self, taken: OrderedDict[Hashable, list[int]]) -> None:
        # In key order: two flushes (other processes) that lock the same rows take
        # them in the same order, so they wait for each other, never deadlock.
        items = sorted(taken.items(), key=lambda item: item[0])  # type: ignore[arg-type,return-value]
        several = len(self.key_fields) > 1
        rows = [(*(key if several else (key,)), *entry[1:]) for key, entry in items]  # type: ignore[misc]
        assert self.model is not None
        database.add_counts(
            self.using(), self.model, self.key_fields, self.count_fields, rows, upsert=self.upsert
        )


class _Queue(_Kind):
    """Items kept in arrival order; the oldest are dropped beyond the bound."""

    def __init__(self, name: str, model: type[models.Model] | None) -> None:
        super().__init__(name, model)
        self.pending: deque[Any] = deque()

    def append(self, item: Any) -> None:
        with _lock:
            self.pending.append(item)
            if len(self.pending) > self.bound:
                self.pending.popleft()
                _drop(self, 1)
        _started()

    def extend(self, items: Iterable[Any]) -> None:
        for item in items:
            self.append(item)

    def take(self) -> deque[Any]:
        taken, self.pending = self.pending, deque()
        return taken

    def give_back(self, taken: deque[Any]) -> None:
        taken.extend(self.pending)
        self.pending = taken
        excess = len(self.pending) - self.bound
        if excess > 0:
            for _ in range(excess):
                self.pending.popleft()
            _drop(self, excess)

    def size(self) -> int:
        return len(self.pending)


class Rows(_Queue):
    """Unsaved model instances, written with bulk_create."""

    def write(self, taken: deque[models.Model]) -> None:
        assert self.model is not None
        self.model._default_manager.using(self.using()).bulk_create(
            list(taken), batch_size=database.STATEMENT_ROWS
        )


class Batch(_Queue):
    """Arbitrary items handed to `flush(items)`, which runs inside a transaction."""

    def __init__(
        self, name: str, flush: Callable[[list[Any]], None], model: type[models.Model] | None
    ) -> None:
        super().__init__(name, model)
        self.flush = flush

    def write(self, taken: deque[Any]) -> None:
        self.flush(list(taken))


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    # A kind reads its bound at each flush; an append before the next flush must not
    # drop against the bound of a setting that no longer holds.
    if setting == "URLGUARD":
        try:
            bound = conf.STATS_BUFFER_MAX
        except ImproperlyConfigured:
            return  # the system check reports it; the flush reads it again
        with _lock:
            for kind in _kinds.values():
                kind.bound = bound


setting_changed.connect(_on_setting_changed)


def _register(kind: _Kind) -> Any:
    with _lock:
        old = _kinds.get(kind.name)
        if old is not None and type(old) is type(kind) and old.model is kind.model:
            # A module imported twice (tests, autoreload) keeps its pending items.
            kind.pending = old.pending  # type: ignore[attr-defined]
        _kinds[kind.name] = kind
    return kind


def counter(
    name: str,
    model: type[models.Model],
    *,
    keys: Sequence[str] = ("pk",),
    fields: Sequence[str],
    upsert: bool = False,
) -> Counter:
    """Register (or re-register) the counter kind `name`; see Counter."""
    keys = [model._meta.pk.name if k == "pk" else k for k in keys]
    return _register(Counter(name, model, keys, fields, upsert))


def rows(name: str, model: type[models.Model]) -> Rows:
    """Register the row kind `name`: append(instance) now, bulk_create later."""
    return _register(Rows(name, model))


def batch(
    name: str,
    flush: Callable[[list[Any]], None],
    *,
    model: type[models.Model] | None = None,
) -> Batch:
    """Register a custom kind: append(item) now; `flush(items)` later, inside a
    transaction on `model`'s database, may write what it likes. Raise a
    DatabaseError to have the items kept and retried."""
    return _register(Batch(name, flush, model))


# -- losses ----------------------------------------------------------------------


def _drop(kind: _Kind, events: int) -> None:
    # Caller holds _lock. Logged per flush (see _report_losses), not per drop: a
    # full buffer drops on every append.
    if events:
        _lost[kind.name] = _lost.get(kind.name, 0) + events
        _unreported[kind.name] = _unreported.get(kind.name, 0) + events


_unreported: dict[str, int] = {}


def lost() -> dict[str, int]:
    """Events this process dropped since it started, per kind (for metrics)."""
    with _lock:
        return dict(_lost)


def pending() -> dict[str, int]:
    """Entries waiting for the next flush, per kind."""
    with _lock:
        return {name: kind.size() for name, kind in _kinds.items()}


def _report_losses() -> None:
    with _lock:
        unreported = dict(_unreported)
        _unreported.clear()
    if not unreported:
        return
    for name, n in unreported.items():
        log.warning(
            "statistics buffer %r was full (STATS_BUFFER_MAX=%s): dropped the oldest %d",
            name,
            conf.STATS_BUFFER_MAX,
            n,
        )
    losses = _loss_counter()
    node = conf.NODE_NAME
    for name, n in unreported.items():
        if name != losses.name:
            losses.add((name, node), n)


def _loss_counter() -> Counter:
    kind = _kinds.get("stats.lost")
    if not isinstance(kind, Counter):
        kind = counter(
            "stats.lost", StatsLoss, keys=("kind", "node"), fields=("lost",), upsert=True
        )
    return kind


# -- flushing ----------------------------------------------------------------------


def flush() -> dict[str, int]:
    """Write every kind's pending items now; returns what is still pending per kind
    (items kept after a database error). Safe from any thread."""
    with _flush_lock:
        _report_losses()
        bound = conf.STATS_BUFFER_MAX
        left = {}
        wrote = False
        for kind in list(_kinds.values()):
            with _lock:
                kind.bound = bound
                taken = kind.take()
            if not taken:
                continue
            try:
                with transaction.atomic(using=kind.using()):
                    kind.write(taken)
                metrics.stats_written(kind.name, kind.count(taken))
                wrote = True
            except (IntegrityError, DataError):
                n = kind.count(taken)
                log.exception(
                    "statistics %r: dropped a batch of %d that cannot be written", kind.name, n
                )
                with _lock:
                    _drop(kind, n)
            except DatabaseError as exc:
                metrics.stats_failed(kind.name)
                # Every tick of an outage fails alike: logged once, then counted (the
                # metric counts each kind's).
                _outage.get().failed(exc)
                with _lock:
                    kind.give_back(taken)
                    left[kind.name] = kind.size()
                # The connection may be broken: the next flush opens a new one
                # (not inside a caller's transaction, e.g. a test's).
                connection = connections[kind.using()]
                if not connection.in_atomic_block:
                    with contextlib.suppress(Exception):
                        connection.close()
        if wrote and not left:
            _outage.get().recovered()
        return left


def _loop(stopped: threading.Event) -> None:
    try:
        while not stopped.is_set():
            _flusher.wait(conf.STATS_FLUSH_INTERVAL)
            if stopped.is_set():
                break
            try:
                flush()
            except Exception as exc:
                _outage.get().failed(exc)
    finally:
        connections.close_all()


_flusher = Daemon("urlguard-stats", _loop)
_outage = PerProcess(
    lambda: OutageLog(log, "writing statistics (kept in memory and retried)"),
    name="urlguard.runtime.stats outage",
    remake_after_fork=True,
)


def _started() -> None:
    # The common case is one attribute test; the thread is started by the first
    # statistic a process records (never in a gunicorn master that only forks).
    if _flusher.thread is None:
        _flusher.start()


def stop(timeout: float | None = None) -> None:
    """Stop the background thread and flush everything (graceful stop). Idempotent;
    no thread starts again in this process (a late statistic waits for a flush)."""
    deadline = time.monotonic() + (conf.STATS_STOP_TIMEOUT if timeout is None else timeout)
    _flusher.enabled = False
    _flusher.stop(max(0.0, deadline - time.monotonic()))
    while True:
        left = flush()
        if not left:
            break
        if time.monotonic() >= deadline:
            log.error(
                "statistics not written at exit (the database kept failing): %s",
                ", ".join(f"{n} {name}" for name, n in left.items()),
            )
            break
        time.sleep(0.2)
    with contextlib.suppress(Exception):
        connections.close_all()


def set_background(enabled: bool) -> None:
    """Tests: False keeps the thread from starting (they call flush() themselves)."""
    global _background
    _background = _flusher.enabled = enabled


@on_reset
def discard() -> None:
    """Forget every pending item and loss (tests)."""
    with _lock:
        for kind in _kinds.values():
            kind.take()
        _lost.clear()
        _unreported.clear()


def _after_fork_in_child() -> None:
    # The parent writes what it buffered; a copy here would be counted twice.
    # (runtime.process has forgotten the parent's thread by now.)
    global _lock, _flush_lock
    _lock = threading.Lock()
    _flush_lock = threading.Lock()
    _flusher.enabled = _background
    for kind in _kinds.values():
        kind.take()
    _lost.clear()
    _unreported.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def gunicorn_worker_exit(server: Any, worker: Any) -> None:
    """gunicorn's worker_exit hook (urlguard_service.gunicornconf installs it): flush
    before the worker exits."""
    stop()


_hooks_installed = False


def install_exit_hooks() -> None:
    """Flush at interpreter exit, and turn a SIGTERM that would kill the process
    outright (runserver, manage.py) into a normal exit that does. A handler someone
    else installed (gunicorn's, celery's) is left alone: they exit normally."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(stop)
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)
