"""Process-wide state and background threads, one pattern for each, and one reset.

A serving process holds a few values made once and shared by every request (the
Guard, the metric files, the click filters) and runs a few daemon threads (the
statistics flusher, the link-cache poller, the embedded upkeep). Both must survive a
fork (gunicorn --preload forks workers from a master that imported everything): a
lock held by a parent's thread at the fork would never be released in the child,
and no thread of the parent runs there. And tests must be able to forget them all
between tests without reaching into any module's private names.

- `PerProcess(make)`: a value made on first use, shared by the process; `reset()`
  forgets it (made again on next use), `use(value)` puts a stand-in in its place for
  a block (a test's fake guard), `remake_after_fork` forgets it in a forked child.
- `Daemon(name, loop)`: one daemon thread per process running `loop(stopped)`;
  `start()` is idempotent and cheap once running, `stop(timeout)` joins with a
  bound, `wake()` cuts a wait short, and a forked child starts with none running
  (the owner starts it again on its next use, as before the fork).
- `on_reset(func)` adds a module's own reset; `reset_all()` stops every daemon and
  runs every reset: the one reset the tests use."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["Daemon", "PerProcess", "on_reset", "reset_all"]

T = TypeVar("T")

_resets: list[Callable[[], None]] = []
_values: list[PerProcess] = []
_daemons: list[Daemon] = []


def on_reset(func: Callable[[], None]) -> Callable[[], None]:
    """Register `func` to run on reset_all() (a decorator; returns `func`)."""
    if func not in _resets:
        _resets.append(func)
    return func


def reset_all(timeout: float = 5.0) -> None:
    """Stop every daemon thread (each joined for at most `timeout` seconds), forget
    every resettable per-process value and run every registered reset: a process as
    if nothing had been used yet. For tests; settings changes reset what they need."""
    for daemon in list(_daemons):
        daemon.stop(timeout)
    for value in list(_values):
        if value.resettable:
            value.reset()
    for func in list(_resets):
        func()


class PerProcess(Generic[T]):
    """A value made by `make()` on first use and shared by the process.

    get() costs one attribute read and a test once made. resettable=False keeps it
    through reset_all() (e.g. metrics registered once with prometheus_client);
    remake_after_fork=True forgets it in a forked child (a buffer the parent
    flushes itself, which the child would count again)."""

    __slots__ = ("_lock", "_make", "name", "remake_after_fork", "resettable", "value")

    def __init__(
        self,
        make: Callable[[], T],
        *,
        name: str,
        resettable: bool = True,
        remake_after_fork: bool = False,
    ) -> None:
        self.name = name
        self.value: T | None = None
        self._make = make
        self._lock = threading.Lock()
        self.resettable = resettable
        self.remake_after_fork = remake_after_fork
        _values.append(self)

    def get(self) -> T:
        value = self.value
        if value is None:
            with self._lock:
                value = self.value
                if value is None:
                    value = self.value = self._make()
        return value

    def reset(self) -> None:
        """Forget the value: the next get() makes a new one."""
        with self._lock:
            self.value = None

    @contextlib.contextmanager
    def use(self, value: T | None) -> Iterator[None]:
        """`value` in place of the process's value for the block (a test's stand-in;
        None: one made anew on first use); the value made before, if any, is back
        afterwards."""
        with self._lock:
            before, self.value = self.value, value
        try:
            yield
        finally:
            with self._lock:
                self.value = before

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        if self.remake_after_fork:
            self.value = None

    def __repr__(self) -> str:
        return f"<PerProcess {self.name}: {'made' if self.value is not None else 'not made'}>"


class Daemon:
    """One daemon thread per process running `loop(stopped)` until `stopped` is set.

    The loop sleeps with `wait(seconds)` (True when woken early by wake() or stop()).
    Each thread gets a stop event of its own: a thread that outlives stop()'s bounded
    join (busy in a long round) still ends after that round, even when a new thread
    has been started meanwhile. enabled=False keeps start() from starting one (tests
    that run the rounds themselves)."""

    def __init__(self, name: str, loop: Callable[[threading.Event], None]) -> None:
        self.name = name
        self.enabled = True
        self.thread: threading.Thread | None = None
        self._loop = loop
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._wake = threading.Event()
        _daemons.append(self)

    def start(self) -> bool:
        """Start the thread unless it runs (or is disabled); True if this call started it."""
        if self.thread is not None or not self.enabled:
            return False
        with self._lock:
            if self.thread is not None or not self.enabled:
                return False
            # A wake() before the start is kept: the first round runs at once.
            self._stopped = stopped = threading.Event()
            self.thread = threading.Thread(
                target=self._loop, args=(stopped,), name=self.name, daemon=True
            )
            self.thread.start()
            return True

    def running(self) -> bool:
        thread = self.thread
        return thread is not None and thread.is_alive()

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True when wake() or stop() cut it short."""
        woken = self._wake.wait(seconds)
        self._wake.clear()
        return woken

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the thread and wait at most `timeout` seconds for it; idempotent. A later
        start() starts a new one."""
        with self._lock:
            thread, self.thread = self.thread, None
            self._stopped.set()
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._wake.clear()

    def _after_fork_in_child(self) -> None:
        # No thread of the parent runs here; its events may be mid-use.
        self._lock = threading.Lock()
        self.thread = None
        self._stopped = threading.Event()
        self._wake = threading.Event()

    def __repr__(self) -> str:
        return f"<Daemon {self.name}: {'running' if self.running() else 'stopped'}>"


def _after_fork_in_child() -> None:
    for value in _values:
        value._after_fork_in_child()
    for daemon in _daemons:
        daemon._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
