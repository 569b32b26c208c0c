"""Shared fixtures: every test gets its own var dir and filter file (nothing touches
var/ of the checkout), a fresh filter registry, and helpers to build the filter from
the rules a test has written."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

ROOT = Path(__file__).resolve().parent.parent

# Hypothesis profiles. `ci` gives the same answer on every run (a fixed seed per test,
# no example database carried between runs, no deadline a busy machine can miss) and
# prints the blob that reproduces a failure: `make test` and .ci/run use it, as does
# any run with CI set. `dev` explores new examples each run and remembers failures
# in .hypothesis/; pin every example it finds with @example.
hypothesis_settings.register_profile(
    "ci", derandomize=True, database=None, print_blob=True, deadline=None
)
hypothesis_settings.register_profile("dev", derandomize=False, print_blob=True)
hypothesis_settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)

# `make test` starts pass two in the background, where sh leaves SIGINT ignored: Ctrl-C
# must stop it too, through pytest's KeyboardInterrupt (which tears its fixtures down).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Metric files of this test run (urlguard.runtime.metrics), not in var/ of the checkout; set
# before anything imports prometheus_client.
_metrics_dir = tempfile.mkdtemp(prefix="urlguard-test-metrics-")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = _metrics_dir
atexit.register(shutil.rmtree, _metrics_dir, True)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    django_db_modify_db_settings_parallel_suffix: None,
) -> Iterator[None]:
    """A PostgreSQL test database per run: several people (and CI) share one server,
    and one fixed name lets a run drop the database another run is using.

    The SQLite test database is a file, as the embedded default has it (WAL, a writer
    waits its turn): the live server's request threads and the admin-job runner
    thread each open their own connection. Django's in-memory default is a shared
    cache, where a write that meets another connection's lock fails at once with
    "database table is locked" instead of waiting, which made the browser tests
    fail by timing."""
    from django.conf import settings

    folder = tempfile.mkdtemp(prefix="urlguard-test-db-")
    for alias, db in settings.DATABASES.items():
        if db["ENGINE"] == "django.db.backends.postgresql":
            db.setdefault("TEST", {})["NAME"] = f"test_{db['NAME']}_{os.getpid()}"
        elif db["ENGINE"] == "django.db.backends.sqlite3":
            db.setdefault("TEST", {})["NAME"] = os.path.join(folder, f"{alias}.sqlite3")
    yield
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def migrated_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded SQLite database as `manage.py migrate` leaves it, migrated once per
    test process: a test that runs the service in processes of its own copies it to its
    var dir as urlguard.sqlite3 (each migration in a subprocess costs seconds of CPU)."""
    var = tmp_path_factory.mktemp("migrated-template")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(URLGUARD_VAR_DIR=str(var), DJANGO_SETTINGS_MODULE="urlguard_service.settings")
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    database = var / "urlguard.sqlite3"
    # Everything in the one file (WAL mode): a copy of it alone is the whole database.
    with contextlib.closing(sqlite3.connect(database)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return database


@pytest.fixture(scope="session", autouse=True)
def _no_embedded_catch_up_thread(django_db_setup: None) -> None:
    """AppConfig.ready installed the embedded threads (catch-up, feed refresh, hit-log
    pruning) on the first request; tests that want one install it themselves."""
    from urlguard.feeds import runner
    from urlguard.hotpath import hitlog
    from urlguard.nodesync import embedded

    embedded.stop()
    runner.stop()
    hitlog.stop()


def _reset_process() -> None:
    # Only if something imported it: engine tests need no Django app state.
    process = sys.modules.get("urlguard.runtime.process")
    if process is not None:
        process.reset_all()


@pytest.fixture(autouse=True)
def _stats_flushed_by_the_test() -> None:
    """No background statistics thread in tests (it would write outside the test's
    transaction): a test that wants its clicks written calls stats.flush(). Nor the
    link cache's poller: a test calls poll()."""
    stats = sys.modules.get("urlguard.runtime.stats")
    if stats is not None:
        from urlguard.shortlinks import linkcache

        stats.set_background(False)
        linkcache.set_background(False)


@pytest.fixture(autouse=True)
def filter_path(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """This test's filter file (tmp_path/var/filter.bin; not created)."""
    var = tmp_path / "var"
    var.mkdir(mode=0o700)
    path = var / "filter.bin"
    settings = request.getfixturevalue("settings")  # pytest-django: undone after the test
    settings.VAR_DIR = var
    settings.URLGUARD = {
        **getattr(settings, "URLGUARD", {}),
        "DATA_DIR": str(var),
        "FILTER_PATH": str(path),
    }
    # Every process-wide value and thread (the filter mappings, the guard, buffered
    # statistics, cached links...) as if this process had just started.
    _reset_process()
    yield path
    _reset_process()


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings: Any) -> None:
    """Passwords hashed with MD5 in tests: the default PBKDF2 costs ~0.5 s a hash, and
    each browser test hashes twice (its user, its login). Subprocesses keep the real one."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _empty_cache(filter_path: Path) -> None:
    """Each test starts with an empty cache: rate-limit counts (the check API's) of
    earlier tests must not refuse its requests."""
    from django.core.cache import caches
    from django.core.cache.backends.locmem import LocMemCache

    cache = caches["default"]
    # Only this process's own memory: clear() of a shared Redis would flush it.
    if isinstance(cache, LocMemCache):
        cache.clear()


@pytest.fixture
def use_guard():
    """use_guard(guard) -> the process-wide Guard for the rest of the test (a fake
    filter, a failure policy); the one made before is back afterwards."""
    from contextlib import ExitStack

    from urlguard.hotpath import guard as guard_module

    with ExitStack() as stack:
        yield lambda guard: stack.enter_context(guard_module.use_guard(guard))


@pytest.fixture
def nudges() -> Iterator[list[int]]:
    """The change-log heads rule writes nudge the nodes to, in order, instead of
    delivering them: the test delivers (or loses) them itself."""
    from urlguard.nodesync import nudge

    sent: list[int] = []
    with nudge.sending_to(sent.append):
        yield sent


@pytest.fixture
def build_filter(db: Any, filter_path: Path) -> Callable[[], Any]:
    """Call it to (re)build this test's filter from the SpamRule table, as
    `manage.py rebuild_filter` does; returns the process's read-only filter."""
    from urlguard.nodesync import registry, sync

    def build() -> Any:
        sync.rebuild(str(filter_path))
        return registry.get_filter(str(filter_path))

    return build


@pytest.fixture
def sync_filter(db: Any, filter_path: Path) -> Callable[[], Any]:
    """Call it to apply the pending change log to this test's filter (as a worker
    would; tests on the `db` fixture never run on_commit nudges). Returns the
    SyncResult."""
    from urlguard.nodesync import sync

    return lambda: sync.sync(path=str(filter_path))
