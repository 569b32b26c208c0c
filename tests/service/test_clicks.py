"""Click accounting: every click counted, at least one raw row per (link, visitor,
hour) with close duplicates dropped, unique visitors per 24 h never overcounted
(also across processes), the visitor never stored raw, database errors contained."""

import threading
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.db import DatabaseError, connection, connections
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from filterengine import OppositeBloomFilter, RotatingBloomFilter
from urlguard import clicks
from urlguard.clicks import record_click, visitor_id
from urlguard.models import Click, ShortLink

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
    link.refresh_from_db()
    return link


def age_rows(hours: float) -> None:
    """Move every click row into the past, as if the clicks happened `hours` ago."""
    for click in Click.objects.all():
        Click.objects.filter(pk=click.pk).update(at=click.at - timedelta(hours=hours))


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


def test_a_repeat_click_is_one_update_and_no_lookup(clock, link):
    visit(link)
    with CaptureQueriesContext(connection) as queries:
        visit(link, ip="203.0.113.7")
    sql = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    # The UPDATE, then the test's own refresh_from_db SELECT of the link.
    assert len(sql) == 2 and sql[0].startswith("UPDATE"), sql
    assert "urlguard_click" not in " ".join(sql)


def test_the_unique_visitor_lookup_runs_under_the_links_row_lock(clock, link):
    # Two workers counting one new visitor at the same moment must not both count
    # it: the UPDATE that locks the link's row has to come before the lookup.
    with CaptureQueriesContext(connection) as queries:
        visit(link)
    sql = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    lock = next(i for i, q in enumerate(sql) if q.startswith("UPDATE"))
    lookup = next(i for i, q in enumerate(sql) if 'FROM "urlguard_click"' in q)
    assert lock < lookup, sql
    assert (link.click_count, link.unique_visitors) == (1, 1)


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
        clock.now += 26 * HOUR
        age_rows(26)
        visit(link)
    assert link.unique_visitors == 4


def test_not_unique_again_within_24_hours_even_when_the_filter_forgot(clock, link):
    visit(link)
    # 23 hours later the filter may or may not still hold the visitor; another
    # worker process (fresh filters) certainly does not. The table decides.
    clock.now += 23 * HOUR
    age_rows(23)
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
    link.refresh_from_db()
    assert link.click_count == 1


def test_a_database_error_is_logged_and_the_row_retried(clock, link, monkeypatch, caplog):
    real_create = Click.objects.create

    def broken(**kwargs):
        raise DatabaseError("disk full")

    monkeypatch.setattr(Click.objects, "create", broken)
    visit(link)  # must not raise: the redirect matters more
    assert "could not record a click" in caplog.text
    assert Click.objects.count() == 0 and link.click_count == 0
    monkeypatch.setattr(Click.objects, "create", real_create)
    visit(link)
    assert Click.objects.count() == 1, "the dropped row is written by the next click"
    assert link.click_count == 1


def test_following_a_short_link_records_the_click(client, clock, link):
    response = client.get("/abc", REMOTE_ADDR="192.0.2.1", HTTP_USER_AGENT="UA")
    assert response.status_code == 302
    link.refresh_from_db()
    assert (link.click_count, link.unique_visitors) == (1, 1)
    assert Click.objects.filter(link=link, at__gte=timezone.now() - timedelta(minutes=5)).exists()


@pytest.mark.services
@pytest.mark.skipif(
    django_settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
    reason="needs PostgreSQL (SQLite serializes every write): run `make test-services`",
)
@pytest.mark.django_db(transaction=True)
def test_one_new_visitor_clicking_on_four_workers_at_once_counts_once(monkeypatch):
    link = ShortLink.objects.create(slug="race", destination="https://example.com/")
    per_thread = threading.local()

    def own_filters():  # each thread is a worker process with its own filters
        if not hasattr(per_thread, "filters"):
            per_thread.filters = (OppositeBloomFilter(1024), RotatingBloomFilter(1000, 0.01, 3600))
        return per_thread.filters

    monkeypatch.setattr(clicks, "_filters", own_filters)
    start = threading.Barrier(4)

    def click():
        start.wait()
        try:
            record_click(RequestFactory().get("/race", REMOTE_ADDR="192.0.2.7"), link)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=click) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    link.refresh_from_db()
    assert (link.click_count, link.unique_visitors) == (4, 1)
