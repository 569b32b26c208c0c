"""The batched statistics buffer: exact counts from many threads and processes, one
statement per table, a failed flush kept and retried, a bounded buffer whose drops
are counted, and a graceful stop (a real process sent SIGTERM) that writes all."""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from urlguard.models import Click, ShortLink, StatsLoss
from urlguard.runtime import stats
from urlguard_service import gunicornconf

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def links():
    return [
        ShortLink.objects.create(slug=f"s{i}", destination=f"https://example.com/{i}")
        for i in range(3)
    ]


@pytest.fixture
def clicks_counter():
    return stats.counter("test.clicks", ShortLink, fields=("click_count", "unique_visitors"))


def counts():
    return list(ShortLink.objects.order_by("slug").values_list("click_count", flat=True))


def test_increments_from_many_threads_are_counted_exactly(links, clicks_counter):
    def click(n: int) -> None:
        for i in range(n):
            clicks_counter.add(links[i % 3].pk)

    threads = [threading.Thread(target=click, args=(3000,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stats.pending()["test.clicks"] == 3
    assert stats.flush() == {}
    assert counts() == [8000, 8000, 8000]
    assert stats.pending()["test.clicks"] == 0


def test_one_statement_per_table_per_flush(links, clicks_counter):
    rows = stats.rows("test.rows", Click)
    for i in range(300):
        clicks_counter.add(links[i % 3].pk, 1, i % 2)
        rows.append(Click(link_id=links[i % 3].pk, visitor=f"v{i}"))
    with CaptureQueriesContext(connection) as queries:
        stats.flush()
    writes = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(writes) == 2, writes
    # A VALUES list (SQLite) or one array per column (PostgreSQL).
    assert "UPDATE" in writes[0] and ("WITH v" in writes[0] or "unnest(" in writes[0])
    assert writes[1].startswith("INSERT INTO")
    assert counts() == [100, 100, 100]
    assert sum(ShortLink.objects.values_list("unique_visitors", flat=True)) == 150
    assert Click.objects.count() == 300


def test_increments_by_field_name_and_a_missing_row(links, clicks_counter):
    clicks_counter.add(links[0].pk, unique_visitors=2)
    clicks_counter.add(links[0].pk)
    clicks_counter.add(10**9)  # a row deleted meanwhile: nothing to update, no error
    stats.flush()
    links[0].refresh_from_db()
    assert (links[0].click_count, links[0].unique_visitors) == (1, 2)


def test_upsert_counter_inserts_then_adds():
    losses = stats.counter(
        "test.upsert", StatsLoss, keys=("kind", "node"), fields=("lost",), upsert=True
    )
    losses.add(("a", "n1"), 2)
    losses.add(("b", "n1"))
    stats.flush()
    losses.add(("a", "n1"), 5)
    stats.flush()
    assert dict(StatsLoss.objects.values_list("kind", "lost")) == {"a": 7, "b": 1}


def test_a_database_error_keeps_the_batch_and_the_next_flush_writes_it(
    links, clicks_counter, monkeypatch, caplog
):
    real_write = stats.Counter.write
    failures = iter([OperationalError("database is locked")])

    def flaky(self, taken):
        for exc in failures:
            raise exc
        real_write(self, taken)

    monkeypatch.setattr(stats.Counter, "write", flaky)
    for _ in range(5):
        clicks_counter.add(links[0].pk)
    assert stats.flush() == {"test.clicks": 1}
    assert "writing statistics (kept in memory and retried) failed: OperationalError" in caplog.text
    clicks_counter.add(links[0].pk)  # arrives while the failed batch waits
    assert counts()[0] == 0
    assert stats.flush() == {}
    assert counts()[0] == 6
    assert stats.lost() == {}


def test_an_outage_is_logged_once_not_every_flush_then_its_end(links, monkeypatch, caplog):
    """Ten flushes of two kinds against a database that is away: one ERROR line (a
    count a minute would follow), then one line when a flush writes again."""
    clicks = stats.counter("test.clicks", ShortLink, fields=("click_count",))
    hits = stats.counter("test.hits", ShortLink, fields=("unique_visitors",))
    real_write = stats.Counter.write
    down = [True]

    def write(self, taken):
        if down[0]:
            raise OperationalError("connection refused")
        real_write(self, taken)

    monkeypatch.setattr(stats.Counter, "write", write)
    with caplog.at_level(logging.INFO, "urlguard.runtime.stats"):
        for _ in range(10):
            clicks.add(links[0].pk)
            hits.add(links[1].pk)
            stats.flush()
        down[0] = False
        stats.flush()
        stats.flush()
    lines = [r for r in caplog.records if r.name == "urlguard.runtime.stats"]
    assert [r.levelno for r in lines] == [logging.ERROR, logging.WARNING]
    assert "connection refused" in lines[0].getMessage()
    assert "works again" in lines[1].getMessage() and "20 failure(s)" in lines[1].getMessage()
    assert counts()[:2] == [10, 0]


def test_a_batch_that_can_never_be_written_is_dropped_and_counted(links, caplog):
    rows = stats.rows("test.bad-rows", Click)
    rows.append(Click(link_id=links[0].pk, visitor="ok"))
    rows.append(Click(link_id=links[0].pk, visitor=None))  # NOT NULL: IntegrityError
    assert stats.flush() == {}
    assert "cannot be written" in caplog.text
    assert stats.lost() == {"test.bad-rows": 2}
    assert Click.objects.count() == 0


def test_a_full_buffer_drops_the_oldest_and_counts_the_loss(links, settings, caplog):
    settings.URLGUARD = {**settings.URLGUARD, "STATS_BUFFER_MAX": 3, "NODE_NAME": "node-a"}
    counter = stats.counter("test.bounded", ShortLink, fields=("click_count",))
    rows = stats.rows("test.bounded-rows", Click)
    extra = ShortLink.objects.create(slug="s9", destination="https://example.com/9")
    for link in [*links, extra]:  # four keys: the first (two clicks) is dropped
        counter.add(link.pk)
    counter.add(links[1].pk)
    for i in range(5):
        rows.append(Click(link_id=links[0].pk, visitor=f"v{i}"))
    assert stats.lost() == {"test.bounded": 1, "test.bounded-rows": 2}
    stats.flush()
    assert "dropped the oldest 2" in caplog.text
    assert counts() == [0, 2, 1, 1]
    assert sorted(Click.objects.values_list("visitor", flat=True)) == ["v2", "v3", "v4"]
    # Visible to the admin and metrics of every process, per node and kind.
    assert dict(StatsLoss.objects.filter(node="node-a").values_list("kind", "lost")) == {
        "test.bounded": 1,
        "test.bounded-rows": 2,
    }


def test_a_failed_flush_stays_within_the_bound(links, settings, monkeypatch):
    settings.URLGUARD = {**settings.URLGUARD, "STATS_BUFFER_MAX": 4}
    rows = stats.rows("test.bounded-retry", Click)

    def down(self, taken):
        raise OperationalError("connection refused")

    monkeypatch.setattr(stats.Rows, "write", down)
    for i in range(3):
        rows.append(Click(link_id=links[0].pk, visitor=f"old{i}"))
    stats.flush()
    for i in range(3):
        rows.append(Click(link_id=links[0].pk, visitor=f"new{i}"))
    assert stats.pending()["test.bounded-retry"] == 4
    assert stats.lost() == {"test.bounded-retry": 2}
    monkeypatch.undo()
    stats.flush()
    assert sorted(Click.objects.values_list("visitor", flat=True)) == [
        "new0",
        "new1",
        "new2",
        "old2",
    ]


# -- real processes on a file database ------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys, threading, time
    import django
    django.setup()
    from django.conf import settings
    # Longer than the test: only the exit flush writes.
    settings.URLGUARD = {**settings.URLGUARD, "STATS_FLUSH_INTERVAL": 3600}
    from urlguard.runtime import stats
    from urlguard.models import ShortLink
    counter = stats.counter("clicks", ShortLink, fields=("click_count",))
    link = ShortLink.objects.get(slug="s").pk
    threads = [
        threading.Thread(target=lambda: [counter.add(link) for _ in range(int(sys.argv[1]))])
        for _ in range(4)
    ]
    for t in threads: t.start()
    for t in threads: t.join()
    print("ready", flush=True)
    if sys.argv[2] == "wait":
        time.sleep(600)
    """
)


@pytest.fixture(scope="module")
def file_db(tmp_path_factory, migrated_database):
    var = tmp_path_factory.mktemp("stats-var")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(
        URLGUARD_VAR_DIR=str(var),
        URLGUARD_FILTER_PATH=str(var / "filter.bin"),
        DJANGO_SETTINGS_MODULE="urlguard_service.settings",
        PYTHONDONTWRITEBYTECODE="1",
    )
    shutil.copy(migrated_database, var / "urlguard.sqlite3")
    db = sqlite3.connect(var / "urlguard.sqlite3")
    db.execute(
        "INSERT INTO urlguard_shortlink (slug, destination, created, disabled, "
        "disabled_reason, click_count, unique_visitors) "
        "VALUES ('s', 'https://example.com/', '2026-01-01', 0, '', 0, 0)"
    )
    db.commit()
    return var, env, db


def stored(db) -> int:
    return db.execute("SELECT click_count FROM urlguard_shortlink WHERE slug='s'").fetchone()[0]


def child(env, per_thread: int, mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(per_thread), mode],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(120)
def test_two_processes_count_exactly(file_db):
    var, env, db = file_db
    before = stored(db)
    procs = [child(env, 2500, "exit") for _ in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=100)
        assert proc.returncode == 0, err
    assert stored(db) - before == 2 * 4 * 2500


@pytest.mark.timeout(120)
def test_sigterm_flushes_everything(file_db):
    var, env, db = file_db
    before = stored(db)
    proc = child(env, 1000, "wait")
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert stored(db) - before == 4 * 1000


class GunicornLog:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str, *args: object) -> None:
        self.lines.append(message % args)


class Gunicorn:
    """What gunicorn passes its hooks: the arbiter (`server`, with its log) and a worker."""

    def __init__(self, pid: int) -> None:
        self.log = GunicornLog()
        self.pid = pid


# Transactional: the flush at exit closes the process's connections, as it does in a worker.
@pytest.mark.django_db(transaction=True)
def test_gunicorns_worker_exit_hook_writes_what_is_buffered(links, clicks_counter):
    for link in (links[0], links[0], links[2]):
        clicks_counter.add(link.pk)
    arbiter = Gunicorn(os.getppid())
    # The master calls it too, for a worker found already gone: not its statistics.
    gunicornconf.worker_exit(arbiter, Gunicorn(os.getpid() + 1))
    assert stats.pending()["test.clicks"] == 2 and counts() == [0, 0, 0]
    gunicornconf.worker_exit(arbiter, Gunicorn(os.getpid()))
    assert counts() == [2, 0, 1] and stats.pending()["test.clicks"] == 0
    assert arbiter.log.lines == [
        f"urlguard: worker {os.getpid()} exiting: its buffered statistics flushed (test.clicks 2)"
    ]


@pytest.mark.live
def test_counters_rows_and_upserts_on_the_services_database(links, clicks_counter):
    # PostgreSQL's own statements: one array per column, unnested in key order.
    test_one_statement_per_table_per_flush(links, clicks_counter)
    test_upsert_counter_inserts_then_adds()
    test_a_counter_writes_its_rows_in_key_order(links, clicks_counter)


def test_the_bound_follows_the_setting_before_the_next_flush(links, settings):
    rows = stats.rows("test.bound-follows", Click)
    settings.URLGUARD = {**settings.URLGUARD, "STATS_BUFFER_MAX": 2}
    for i in range(3):
        rows.append(Click(link_id=links[0].pk, visitor=f"a{i}"))
    assert stats.lost() == {"test.bound-follows": 1}
    settings.URLGUARD = {**settings.URLGUARD, "STATS_BUFFER_MAX": 100}
    for i in range(3):
        rows.append(Click(link_id=links[0].pk, visitor=f"b{i}"))
    assert stats.lost() == {"test.bound-follows": 1}
    assert stats.pending()["test.bound-follows"] == 5


def test_a_counter_writes_its_rows_in_key_order(links, clicks_counter):
    # Two processes flushing the same rows lock them in the same order: they wait
    # for each other instead of deadlocking.
    for link in (links[2], links[0], links[1]):
        clicks_counter.add(link.pk)
    with CaptureQueriesContext(connection) as queries:
        assert stats.flush() == {}
    update = next(q["sql"] for q in queries.captured_queries if "UPDATE" in q["sql"])
    ids = [link.pk for link in links]
    if connection.vendor == "postgresql":  # unnest('{3,1,2}'::...)
        keys = [int(k) for k in re.search(r"unnest\('\{([\d,]+)\}'", update).group(1).split(",")]
    else:  # VALUES (3, 1, 0), ...
        keys = [int(k) for k in re.findall(r"\((\d+), 1, 0\)", update)]
    assert keys == sorted(ids), update


@pytest.mark.live
def test_short_links_keep_room_on_each_page_for_their_counter_updates(db):
    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL storage parameter: run `make test-live`")
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'urlguard_shortlink'")
        assert cursor.fetchone()[0] == ["fillfactor=70"]
