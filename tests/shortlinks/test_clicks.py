"""Click accounting: every click counted (buffered, written by a flush: exactly N
from many threads, and from a real gunicorn stopped with SIGTERM), at least one raw
row per (link, visitor, hour) with close duplicates dropped, unique visitors per
24 h never overcounted (also across processes), the visitor never stored raw,
database errors kept and retried."""

import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import OperationalError, connection, connections, transaction
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from filterengine import OppositeBloomFilter, RotatingBloomFilter
from tests.support.listening import wait_until_listening
from urlguard.models import Click, ShortLink
from urlguard.runtime import stats
from urlguard.runtime.visitors import visitor_id
from urlguard.shortlinks import clicks
from urlguard.shortlinks.clicks import record_click

pytestmark = pytest.mark.django_db

HOUR = 3600.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0  # on an hour boundary + 0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(clicks, "_clock", c)
    clicks.reset()
    yield c
    clicks.reset()


@pytest.fixture
def link():
    return ShortLink.objects.create(slug="abc", destination="https://example.com/")


def visit(link, ip="203.0.113.7", agent="Mozilla/5.0 test"):
    request = RequestFactory().get(f"/{link.slug}", REMOTE_ADDR=ip, HTTP_USER_AGENT=agent)
    record_click(request, link)
    assert stats.flush() == {}
    link.refresh_from_db()
    return link


def test_first_click_counts_writes_a_row_and_a_unique_visitor(clock, link):
    visit(link)
    assert (link.click_count, link.unique_visitors) == (1, 1)
    row = Click.objects.get()
    assert row.link_id == link.pk and len(row.visitor) == 32
    assert "203.0.113.7" not in row.visitor


def test_close_duplicates_are_counted_but_not_written(clock, link):
    for _ in range(5):
        clock.now += 60
        visit(link)
    assert (link.click_count, link.unique_visitors) == (5, 1)
    assert Click.objects.count() == 1


def test_a_click_is_only_buffered(clock, link):
    with CaptureQueriesContext(connection) as queries:
        record_click(RequestFactory().get("/abc"), link)
    assert queries.captured_queries == []
    assert stats.pending()["clicks"] == 1
    link.refresh_from_db()
    assert link.click_count == 0


def flush_sql() -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        assert stats.flush() == {}
    return [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]


def test_a_repeat_click_flushes_as_one_update_and_no_lookup(clock, link):
    visit(link)
    record_click(
        RequestFactory().get("/abc", REMOTE_ADDR="203.0.113.7", HTTP_USER_AGENT="Mozilla/5.0 test"),
        link,
    )
    sql = flush_sql()
    # The counters' UPDATE alone: no row lock, no click lookup, no row.
    assert len(sql) == 1, sql
    assert 'UPDATE "urlguard_shortlink" SET' in sql[0] and "FOR UPDATE" not in sql[0]
    assert "urlguard_click" not in sql[0]
    link.refresh_from_db()
    assert link.click_count == 2


def test_a_thousand_repeat_clicks_flush_as_one_row_of_one_update(clock, link):
    # The viral case: the flush's work does not grow with the clicks.
    visit(link)
    request = RequestFactory().get(
        "/abc", REMOTE_ADDR="203.0.113.7", HTTP_USER_AGENT="Mozilla/5.0 test"
    )
    for _ in range(1000):
        record_click(request, link)
    assert stats.pending()["clicks"] == 1 and stats.pending()["clicks.visitors"] == 0
    sql = flush_sql()
    assert len(sql) == 1 and "1000" in sql[0], sql  # one row: the link and its 1,000
    link.refresh_from_db()
    assert link.click_count == 1001


def test_the_unique_visitor_lookup_runs_under_the_links_row_lock(clock, link):
    # Two processes flushing one new visitor at the same moment must not both count
    # it: the links' rows are locked before the lookup, until the commit.
    record_click(RequestFactory().get("/abc"), link)
    sql = flush_sql()
    lock = next(i for i, q in enumerate(sql) if 'FROM "urlguard_shortlink"' in q)
    lookup = next(i for i, q in enumerate(sql) if 'FROM "urlguard_click"' in q)
    update = next(i for i, q in enumerate(sql) if 'UPDATE "urlguard_shortlink" SET' in q)
    assert lock < lookup < update, sql
    if connection.vendor == "postgresql":
        assert "FOR UPDATE" in sql[lock]
    link.refresh_from_db()
    assert (link.click_count, link.unique_visitors) == (1, 1)


@pytest.mark.live
def test_on_the_services_database_the_links_rows_are_locked_for_update(clock, link):
    # The SELECT ... FOR UPDATE the test above checks only where the database has it.
    assert connection.vendor == "postgresql", "run `make test-live`"
    test_the_unique_visitor_lookup_runs_under_the_links_row_lock(clock, link)


def test_many_threads_and_visitors_count_exactly(clock, link):
    other = ShortLink.objects.create(slug="xyz", destination="https://example.org/")

    def click(thread: int) -> None:
        for i in range(500):
            ip = f"198.51.100.{(thread * 500 + i) % 40}"
            record_click(RequestFactory().get("/", REMOTE_ADDR=ip), (link, other)[i % 2])

    threads = [threading.Thread(target=click, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stats.flush() == {}
    link.refresh_from_db()
    other.refresh_from_db()
    assert (link.click_count, other.click_count) == (1500, 1500)
    # 40 addresses: even ones clicked `link`, odd ones `other`, 20 each.
    assert (link.unique_visitors, other.unique_visitors) == (20, 20)


def test_a_row_keeps_the_time_of_its_click(clock, link):
    record_click(RequestFactory().get("/abc"), link)
    clock.now += 2 * HOUR  # e.g. the database was away meanwhile
    assert stats.flush() == {}
    assert Click.objects.get().at == datetime.fromtimestamp(1_800_000_000.0, UTC)


def test_clicks_of_a_deleted_link_are_dropped_quietly(clock, link):
    record_click(RequestFactory().get("/abc"), link)
    ShortLink.objects.filter(pk=link.pk).delete()
    assert stats.flush() == {}
    assert Click.objects.count() == 0 and stats.lost() == {}


def test_at_least_one_row_per_visitor_and_hour(clock, link):
    visit(link)
    clock.now += HOUR
    visit(link)
    visit(link)
    assert Click.objects.count() == 2
    assert link.unique_visitors == 1, "same visitor within 24 h"


def test_distinct_visitors(clock, link):
    visit(link, ip="203.0.113.1")
    visit(link, ip="203.0.113.2")
    visit(link, ip="203.0.113.1", agent="Other browser")
    visit(link, ip="203.0.113.1")
    assert (link.click_count, link.unique_visitors) == (4, 3)
    assert Click.objects.count() == 3
    assert Click.objects.values("visitor").distinct().count() == 3


def test_a_visitor_is_unique_again_after_24_hours(clock, link):
    visit(link)
    for _ in range(3):
        clock.now += 26 * HOUR  # rows carry their click's time: the fake clock's
        visit(link)
    assert link.unique_visitors == 4


def test_not_unique_again_within_24_hours_even_when_the_filter_forgot(clock, link):
    visit(link)
    # 23 hours later the filter may or may not still hold the visitor; another
    # worker process (fresh filters) certainly does not. The table decides.
    clock.now += 23 * HOUR
    clicks.reset()
    visit(link)
    assert link.unique_visitors == 1
    assert link.click_count == 2


def test_other_links_are_counted_apart(clock, link):
    other = ShortLink.objects.create(slug="xyz", destination="https://example.org/")
    visit(link)
    visit(other)
    assert link.unique_visitors == 1
    other.refresh_from_db()
    assert (other.click_count, other.unique_visitors) == (1, 1)


def test_visitor_id_is_keyed_by_the_secret(settings):
    request = RequestFactory().get("/", REMOTE_ADDR="198.51.100.9", HTTP_USER_AGENT="UA")
    first = visitor_id(request)
    assert first == visitor_id(request)
    settings.SECRET_KEY = "another secret for this test only"
    assert visitor_id(request) != first


def test_missing_headers_still_identify_a_visitor(clock, link):
    request = RequestFactory().get("/")
    request.META.pop("REMOTE_ADDR", None)
    record_click(request, link)
    stats.flush()
    link.refresh_from_db()
    assert link.click_count == 1


def test_a_database_error_keeps_the_clicks_for_the_next_flush(clock, link, monkeypatch, caplog):
    real_create = Click.objects.bulk_create

    def broken(*args, **kwargs):
        raise OperationalError("database is locked")

    monkeypatch.setattr(Click.objects, "bulk_create", broken)
    record_click(
        RequestFactory().get("/abc", REMOTE_ADDR="203.0.113.7", HTTP_USER_AGENT="Mozilla/5.0 test"),
        link,
    )
    assert stats.flush() == {"clicks.visitors": 1}
    assert "writing statistics (kept in memory and retried) failed: OperationalError" in caplog.text
    link.refresh_from_db()
    # The visitors' flush rolled back as a whole; the count is its own flush.
    assert Click.objects.count() == 0 and link.unique_visitors == 0
    assert link.click_count == 1
    monkeypatch.setattr(Click.objects, "bulk_create", real_create)
    link = visit(link)  # the next flush writes the kept click's row and visitor
    assert Click.objects.count() == 1
    assert (link.click_count, link.unique_visitors) == (2, 1)


def test_following_a_short_link_records_the_click(client, clock, link):
    response = client.get("/abc", REMOTE_ADDR="192.0.2.1", HTTP_USER_AGENT="UA")
    assert response.status_code == 302
    assert stats.flush() == {}
    link.refresh_from_db()
    assert (link.click_count, link.unique_visitors) == (1, 1)
    assert Click.objects.filter(link=link, at__gte=timezone.now() - timedelta(minutes=5)).exists()


@pytest.mark.live
@pytest.mark.skipif(
    django_settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
    reason="needs PostgreSQL (SQLite serializes every write): run `make test-live`",
)
@pytest.mark.django_db(transaction=True)
def test_one_new_visitor_flushed_by_four_workers_at_once_counts_once():
    link = ShortLink.objects.create(slug="race", destination="https://example.com/")
    start = threading.Barrier(4)

    def worker():
        # A worker process of its own: own filters (each sees a new visitor), own
        # buffer, own flush transaction, all four at the same moment.
        recent, unique = OppositeBloomFilter(1024), RotatingBloomFilter(1000, 0.01, 3600)
        visitor = visitor_id(RequestFactory().get("/race", REMOTE_ADDR="192.0.2.7"))
        now = time.time()
        click = clicks.PendingClick(
            link.pk,
            visitor,
            now,
            not recent.contains_and_add(f"{link.pk}:{visitor}:{int(now // 3600)}"),
            unique.add(f"{link.pk}:{visitor}"),
        )
        start.wait()
        try:
            with transaction.atomic():
                clicks.write_clicks([click])
            with transaction.atomic():  # the count is a flush of its own
                clicks._COUNTS.write(OrderedDict([(link.pk, [1, 1])]))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    link.refresh_from_db()
    assert (link.click_count, link.unique_visitors) == (4, 1)


# -- a real gunicorn, stopped gracefully under load ---------------------------------

ROOT = Path(__file__).resolve().parents[2]
GUNICORN = Path(sys.executable).with_name("gunicorn")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _location(url: str) -> str:
    try:
        urllib.request.build_opener(_NoRedirect).open(url, timeout=30)
    except urllib.error.HTTPError as exc:
        assert exc.code == 302, exc.code
        return exc.headers["Location"]
    raise AssertionError("not a redirect")


def _status(url: str) -> int:
    try:
        with urllib.request.build_opener(_NoRedirect).open(url, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_gunicorn_sigterm_writes_every_buffered_click(tmp_path, migrated_database):
    """Two real workers: an edit reaches both caches, SIGTERM writes every click, and
    the visitor both workers saw as new is counted once."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(
        URLGUARD_VAR_DIR=str(tmp_path),
        URLGUARD_FILTER_PATH=str(tmp_path / "filter.bin"),
        DJANGO_SETTINGS_MODULE="urlguard_service.settings",
        DJANGO_ALLOWED_HOSTS="127.0.0.1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    shutil.copy(migrated_database, tmp_path / "urlguard.sqlite3")
    subprocess.run(
        [sys.executable, "manage.py", "rebuild_filter"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    db = sqlite3.connect(tmp_path / "urlguard.sqlite3")
    db.execute(
        "INSERT INTO urlguard_shortlink (slug, destination, created, disabled, "
        "disabled_reason, click_count, unique_visitors) "
        "VALUES ('g', 'https://example.com/', '2026-01-01', 0, '', 0, 0)"
    )
    db.commit()
    # A flush interval longer than the test: only the graceful stop writes.
    (tmp_path / "slow_flush.py").write_text(
        "from urlguard_service.settings import *  # noqa: F403\n"
        "URLGUARD = {**URLGUARD, 'STATS_FLUSH_INTERVAL': 3600}  # noqa: F405\n"
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = (tmp_path / "gunicorn.log").open("w")
    proc = subprocess.Popen(
        [
            str(GUNICORN),
            "-c",
            "python:urlguard_service.gunicornconf",
            "urlguard_service.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
        ],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "slow_flush", "PYTHONPATH": f"{tmp_path}:{ROOT}"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until_listening(
            port, proc, within=60, what="gunicorn", log=(tmp_path / "gunicorn.log").read_text
        )
        sent = 0
        with ThreadPoolExecutor(4) as pool:
            for status in pool.map(_status, [f"http://127.0.0.1:{port}/g"] * 200):
                assert status == 302
                sent += 1
        stored = db.execute("SELECT click_count FROM urlguard_shortlink").fetchone()[0]
        assert stored == 0, "written before the stop: the test would prove nothing"
        # An edit committed elsewhere (what the ORM writes: the row and the generation,
        # in one transaction) reaches both workers' cached copies.
        db.execute("UPDATE urlguard_shortlink SET destination = 'https://example.org/new'")
        db.execute("UPDATE urlguard_shortlinkgeneration SET value = value + 1")
        db.commit()
        deadline = time.monotonic() + 30
        fresh = 0
        while fresh < 20:
            assert time.monotonic() < deadline, "the edit never reached the workers"
            location = _location(f"http://127.0.0.1:{port}/g")
            sent += 1
            fresh = fresh + 1 if location == "https://example.org/new" else 0
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    stored = db.execute("SELECT click_count, unique_visitors FROM urlguard_shortlink").fetchone()
    text = (tmp_path / "gunicorn.log").read_text()
    assert stored == (sent, 1), text
    # Each worker's written by the config's worker_exit hook, before it ended.
    flushed = re.findall(r"urlguard: worker (\d+) exiting: its buffered statistics flushed", text)
    assert len(set(flushed)) == 2, text
