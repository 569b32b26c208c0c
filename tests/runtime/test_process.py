"""urlguard.runtime.process: a per-process value is made once and remade after fork
where asked, a daemon thread starts once and stops within its bound, and reset_all()
leaves nothing of a test behind."""

from __future__ import annotations

import os
import threading

import pytest

from urlguard.runtime import process
from urlguard.runtime.process import Daemon, PerProcess


@pytest.fixture
def registered():
    """Values and daemons a test makes are dropped from the process's lists after it."""
    values, daemons, resets = (
        list(process._values),
        list(process._daemons),
        list(process._resets),
    )
    yield
    for daemon in process._daemons[len(daemons) :]:
        daemon.stop(5)
    process._values[:], process._daemons[:], process._resets[:] = values, daemons, resets


def in_child(func) -> str:
    """func() run in a forked child of this process; what it returned, as text."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            os.write(write, str(func()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    return answer


def test_a_value_is_made_once_for_all_threads(registered):
    made = []
    gate = threading.Barrier(8)

    def make():
        made.append(1)
        return object()

    value = PerProcess(make, name="test")
    seen = []

    def get():
        gate.wait()
        seen.append(value.get())

    threads = [threading.Thread(target=get) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and len({id(v) for v in seen}) == 1


def test_reset_makes_it_anew_and_use_puts_it_back(registered):
    value = PerProcess(object, name="test")
    first = value.get()
    stand_in = object()
    with value.use(stand_in):
        assert value.get() is stand_in
    assert value.get() is first
    with value.use(None):
        assert value.get() is not first
    assert value.get() is first
    value.reset()
    assert value.get() is not first


def test_reset_all_forgets_values_runs_resets_and_stops_daemons(registered):
    value = PerProcess(object, name="test")
    kept = PerProcess(object, name="kept", resettable=False)
    first, always = value.get(), kept.get()
    calls = []
    process.on_reset(lambda: calls.append(1))
    daemon = Daemon("test-daemon", lambda stopped: stopped.wait())
    daemon.start()
    process.reset_all()
    assert value.get() is not first and kept.get() is always
    assert calls == [1]
    assert daemon.thread is None and not daemon.running()


def test_after_fork_a_child_remakes_only_what_asks_for_it(registered):
    made = iter(range(100))
    remade = PerProcess(lambda: next(made), name="buffer", remake_after_fork=True)
    shared = PerProcess(lambda: next(made), name="shared")
    assert (remade.get(), shared.get()) == (0, 1)
    assert in_child(lambda: (remade.get(), shared.get())) == "(2, 1)"
    assert (remade.get(), shared.get()) == (0, 1)


def test_a_lock_held_at_the_fork_does_not_hang_the_child(registered):
    value = PerProcess(object, name="test", remake_after_fork=True)
    with value._lock:  # another thread making it, at the moment gunicorn forks
        answer = in_child(lambda: value.get() is not None)
    assert answer == "True"


def test_a_daemon_starts_once_and_stops_within_its_bound(registered):
    rounds = []

    def loop(stopped):
        while not stopped.is_set():
            rounds.append(daemon.wait(60))

    daemon = Daemon("test-daemon", loop)
    assert daemon.start() is True
    first = daemon.thread
    assert daemon.start() is False and daemon.thread is first and first.is_alive()
    daemon.wake()
    daemon.stop(5)
    assert not first.is_alive() and daemon.thread is None
    assert rounds and all(rounds)  # woken, never timed out
    daemon.stop(5)  # idempotent


def test_a_disabled_daemon_does_not_start(registered):
    daemon = Daemon("test-daemon", lambda stopped: stopped.wait())
    daemon.enabled = False
    assert daemon.start() is False and daemon.thread is None


def test_a_thread_that_outlives_the_join_still_stops_after_its_round(registered):
    busy, release = threading.Event(), threading.Event()
    finished = []

    def loop(stopped):
        while not stopped.is_set():
            busy.set()
            release.wait(10)  # a long catch-up
            finished.append(threading.current_thread())

    daemon = Daemon("test-daemon", loop)
    daemon.start()
    old = daemon.thread
    busy.wait(5)
    daemon.stop(0.01)  # the bound runs out first
    assert old.is_alive()
    busy.clear()
    daemon.start()  # a new one, with its own stop flag
    new = daemon.thread
    assert new is not old
    release.set()
    old.join(5)
    assert not old.is_alive() and new.is_alive()  # the old one ended after its round
    daemon.stop(5)
    assert not new.is_alive()


def test_a_forked_child_has_no_thread_and_starts_its_own(registered):
    daemon = Daemon("test-daemon", lambda stopped: stopped.wait())
    daemon.start()
    parent = daemon.thread

    def child():
        before = daemon.thread
        started = daemon.start()
        running = daemon.running()
        daemon.stop(5)
        return (before, started, running)

    assert in_child(child) == "(None, True, True)"
    assert daemon.thread is parent and parent.is_alive()


def test_a_wake_before_the_start_runs_the_first_round_at_once(registered):
    woken = []
    done = threading.Event()

    def loop(stopped):
        woken.append(daemon.wait(60))
        done.set()
        stopped.wait()

    daemon = Daemon("test-daemon", loop)
    daemon.wake()  # e.g. a request found the file behind before the thread ran
    daemon.start()
    assert done.wait(5) and woken == [True]
    daemon.stop(5)
