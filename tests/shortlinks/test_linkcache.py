"""The short-link cache: a hit reads no row, every change to what a redirect reads
(save, update, bulk_update, delete) reaches the cache at the next poll, and with
the database gone cached links keep redirecting while uncached ones get a 503."""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from urlguard.models import Click, ShortLink, ShortLinkGeneration
from urlguard.runtime import stats
from urlguard.shortlinks import clicks, linkcache

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_cache():
    linkcache.set_background(False)
    linkcache.reset()
    linkcache.poll()
    yield
    linkcache.reset()


@pytest.fixture
def link():
    return ShortLink.objects.create(slug="abc", destination="https://example.com/")


@pytest.fixture
def database_down(database_fails):
    """Every query on the default connection fails as if the server were gone."""
    return lambda: database_fails(OperationalError("connection refused"))


def test_a_cached_link_reads_no_row(link):
    assert linkcache.get("abc").destination == "https://example.com/"
    with CaptureQueriesContext(connection) as queries:
        got = linkcache.get("abc")
    assert got == (link.pk, "abc", "https://example.com/", False, "")
    assert queries.captured_queries == []


def test_an_unknown_slug_is_none_and_not_cached(db):
    assert linkcache.get("nope") is None
    ShortLink.objects.create(slug="nope", destination="https://example.org/")
    assert linkcache.get("nope").destination == "https://example.org/"


def change_by_save(link):
    link.destination = "https://changed.example/"
    link.save()


def change_by_update(link):
    ShortLink.objects.filter(pk=link.pk).update(destination="https://changed.example/")


def change_by_bulk_update(link):
    link.destination = "https://changed.example/"
    ShortLink.objects.bulk_update([link], ["destination"])


def disable_by_update(link):
    ShortLink.objects.filter(pk=link.pk).update(disabled=True, disabled_reason="spam")


def delete_row(link):
    link.delete()


def delete_by_queryset(link):
    ShortLink.objects.filter(pk=link.pk).delete()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (change_by_save, "https://changed.example/"),
        (change_by_update, "https://changed.example/"),
        (change_by_bulk_update, "https://changed.example/"),
        (disable_by_update, "disabled"),
        (delete_row, None),
        (delete_by_queryset, None),
    ],
)
def test_every_change_reaches_the_cache_at_the_next_poll(link, change, expected):
    assert linkcache.get("abc").destination == "https://example.com/"
    change(link)
    # Another process's cache: still the old answer until its poller runs ...
    assert linkcache.get("abc").destination == "https://example.com/"
    assert linkcache.poll() is True
    got = linkcache.get("abc")
    if expected is None:
        assert got is None
    elif expected == "disabled":
        assert got.disabled and got.disabled_reason == "spam"
    else:
        assert got.destination == expected


def test_counters_do_not_invalidate(link):
    linkcache.get("abc")
    ShortLink.objects.filter(pk=link.pk).update(click_count=5)
    link.click_count = 6
    link.save(update_fields=["click_count"])
    stats.counter("test.links", ShortLink, fields=("click_count",)).add(link.pk)
    stats.flush()
    Click.objects.create(link=link, visitor="v")
    assert linkcache.poll() is False


def test_a_row_read_before_a_change_is_not_kept_after_it(link, monkeypatch):
    # The change commits between this process's query and its insert into the
    # cache: the entry carries the generation read before the query, so the poll
    # that sees the change makes it stale.
    real_read = linkcache._read

    def read_then_change(slug):
        stale = real_read(slug)
        ShortLink.objects.filter(pk=link.pk).update(destination="https://changed.example/")
        linkcache.poll()
        return stale

    monkeypatch.setattr(linkcache, "_read", read_then_change)
    assert linkcache.get("abc").destination == "https://example.com/"
    monkeypatch.undo()
    assert linkcache.get("abc").destination == "https://changed.example/"


def test_after_an_edit_the_other_cached_links_survive_the_database_going_away(link, database_down):
    other = ShortLink.objects.create(slug="other", destination="https://example.org/")
    linkcache.get("abc")
    linkcache.get("other")
    ShortLink.objects.filter(pk=other.pk).update(destination="https://changed.example/")
    assert linkcache.poll() is True
    database_down()
    assert linkcache.get("abc").destination == "https://example.com/"
    assert linkcache.get("other").destination == "https://changed.example/"


def test_the_ttl_rereads(link, monkeypatch, settings):
    now = [1000.0]
    monkeypatch.setattr(linkcache, "_clock", lambda: now[0])
    linkcache.get("abc")
    raw_update(link, "https://raw.example/")
    now[0] += settings.URLGUARD.get("LINK_CACHE_TTL", 60) - 1
    assert linkcache.get("abc").destination == "https://example.com/"
    now[0] += 2
    assert linkcache.get("abc").destination == "https://raw.example/"


class FakePoller:
    """Stands for the polling thread: the tests call refresh_due themselves."""

    def __init__(self) -> None:
        self.alive = True

    def is_alive(self) -> bool:
        return self.alive

    def join(self, timeout: float | None = None) -> None:
        self.alive = False


@pytest.fixture
def poller(monkeypatch):
    """As if the polling thread ran, on a clock the test moves."""
    monkeypatch.setattr(linkcache.poller, "thread", FakePoller())
    now = [1000.0]
    monkeypatch.setattr(linkcache, "_clock", lambda: now[0])
    return now


def raw_update(link, destination):
    # A write that bypassed the ORM: no generation bump, only the TTL catches it.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE urlguard_shortlink SET destination = %s WHERE id = %s", [destination, link.pk]
        )


def test_the_poller_rereads_served_links_before_they_expire_in_one_query(db, poller, settings):
    ttl = settings.URLGUARD.get("LINK_CACHE_TTL", 60)
    links = [
        ShortLink.objects.create(slug=f"s{i}", destination=f"https://example.com/{i}")
        for i in range(3)
    ]
    for link in links:
        linkcache.get(link.slug)
    raw_update(links[0], "https://raw.example/")
    poller[0] += ttl - 3  # not due yet: nothing read
    with CaptureQueriesContext(connection) as queries:
        assert linkcache.refresh_due() == 0
    assert queries.captured_queries == []
    poller[0] += 2  # due within two polls: read ahead of the expiry, in one query
    with CaptureQueriesContext(connection) as queries:
        assert linkcache.refresh_due() == 3
    assert len(queries.captured_queries) == 1
    poller[0] += 2  # past the old TTL: the requests read nothing
    with CaptureQueriesContext(connection) as queries:
        assert linkcache.get("s0").destination == "https://raw.example/"
        assert linkcache.get("s1").destination == "https://example.com/1"
    assert queries.captured_queries == []


def test_past_its_ttl_a_link_is_served_while_the_poller_rereads_it(link, poller, settings):
    ttl = settings.URLGUARD.get("LINK_CACHE_TTL", 60)
    linkcache.get("abc")
    raw_update(link, "https://raw.example/")
    poller[0] += ttl + 1  # the poller is late (a slow database): no request waits
    with CaptureQueriesContext(connection) as queries:
        assert linkcache.get("abc").destination == "https://example.com/"
    assert queries.captured_queries == []
    poller[0] += ttl  # a whole TTL late: the request reads it itself
    assert linkcache.get("abc").destination == "https://raw.example/"


def test_a_dead_poller_leaves_the_ttl_to_the_requests(link, poller, settings):
    linkcache.get("abc")
    raw_update(link, "https://raw.example/")
    linkcache.poller.thread.alive = False
    poller[0] += settings.URLGUARD.get("LINK_CACHE_TTL", 60) + 1
    assert linkcache.get("abc").destination == "https://raw.example/"


def test_a_refresh_reads_at_most_its_share_per_poll(db, poller, settings, monkeypatch):
    monkeypatch.setattr(linkcache, "_REFRESH_PER_POLL", 2)
    for i in range(5):
        ShortLink.objects.create(slug=f"s{i}", destination=f"https://example.com/{i}")
        linkcache.get(f"s{i}")
    poller[0] += settings.URLGUARD.get("LINK_CACHE_TTL", 60)
    assert [linkcache.refresh_due() for _ in range(4)] == [2, 2, 1, 0]
    assert len(linkcache._entries) == 5


def test_a_change_announced_during_a_refresh_wins(link, poller, settings, monkeypatch):
    linkcache.get("abc")
    poller[0] += settings.URLGUARD.get("LINK_CACHE_TTL", 60)
    real_read_many = linkcache._read_many

    def read_then_change(slugs):
        stale = real_read_many(slugs)
        monkeypatch.setattr(linkcache, "_read_many", real_read_many)
        change_by_update(link)
        assert linkcache.poll() is True  # another poll (a test's) sees the change
        return stale

    monkeypatch.setattr(linkcache, "_read_many", read_then_change)
    assert linkcache.refresh_due() == 0
    assert linkcache.get("abc").destination == "https://changed.example/"


def test_served_slugs_are_remembered_only_while_cached(db, poller, settings):
    settings.URLGUARD = {**settings.URLGUARD, "LINK_CACHE_SIZE": 3}
    for i in range(20):
        ShortLink.objects.create(slug=f"s{i}", destination=f"https://example.com/{i}")
        linkcache.get(f"s{i}")
    assert linkcache._used == set(linkcache._entries) == {"s17", "s18", "s19"}


def test_a_lowered_ttl_keeps_the_due_order(db, poller, settings):
    for slug, ttl in (("long", 60), ("short", 10)):
        settings.URLGUARD = {**settings.URLGUARD, "LINK_CACHE_TTL": ttl}
        ShortLink.objects.create(slug=slug, destination=f"https://example.com/{slug}")
        linkcache.get(slug)
    poller[0] += 10
    assert linkcache.refresh_due() == 1
    assert linkcache._entries["short"][0] == 1000.0 + 10 + 10


def test_a_link_nobody_asked_for_is_dropped_when_due_not_read(db, poller, settings):
    ttl = settings.URLGUARD.get("LINK_CACHE_TTL", 60)
    for slug in ("hot", "cold"):
        ShortLink.objects.create(slug=slug, destination=f"https://example.com/{slug}")
        linkcache.get(slug)
    poller[0] += ttl - 1
    assert linkcache.refresh_due() == 2  # both were served since they were read
    poller[0] += 1
    linkcache.get("hot")
    poller[0] += ttl
    assert linkcache.refresh_due() == 1
    assert list(linkcache._entries) == ["hot"]


def test_a_row_deleted_behind_the_orms_back_leaves_the_cache_when_due(link, poller, settings):
    linkcache.get("abc")
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM urlguard_shortlink WHERE id = %s", [link.pk])
    poller[0] += settings.URLGUARD.get("LINK_CACHE_TTL", 60)
    assert linkcache.refresh_due() == 1
    assert linkcache.get("abc") is None


def test_a_failed_reread_keeps_the_links_due(link, poller, settings):
    linkcache.get("abc")
    raw_update(link, "https://raw.example/")
    poller[0] += settings.URLGUARD.get("LINK_CACHE_TTL", 60)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            linkcache, "_read_many", lambda slugs: (_ for _ in ()).throw(OperationalError("down"))
        )
        with pytest.raises(OperationalError):
            linkcache.refresh_due()
    assert linkcache.get("abc").destination == "https://example.com/"  # served meanwhile
    assert linkcache.refresh_due() == 1  # the next poll retries
    assert linkcache.get("abc").destination == "https://raw.example/"


def test_the_due_records_stay_bounded_when_misses_evict(db, poller, settings):
    settings.URLGUARD = {**settings.URLGUARD, "LINK_CACHE_SIZE": 3}
    ShortLink.objects.bulk_create(
        ShortLink(slug=f"s{i}", destination=f"https://example.com/{i}") for i in range(4)
    )
    for i in range(100):
        linkcache.get(f"s{i % 4}")  # each a miss: the cache holds 3 of the 4
    assert len(linkcache._due) <= 2 * 3
    assert {slug for _, slug in linkcache._due} >= set(linkcache._entries)


def test_with_the_database_down_a_cached_link_is_served_even_past_its_ttl(
    link, monkeypatch, database_down
):
    now = [1000.0]
    monkeypatch.setattr(linkcache, "_clock", lambda: now[0])
    linkcache.get("abc")
    database_down()
    now[0] += 3600
    assert linkcache.get("abc").destination == "https://example.com/"
    with pytest.raises(OperationalError):
        linkcache.poll()  # the poller's failure leaves the cache as it is
    assert linkcache.get("abc").destination == "https://example.com/"
    with pytest.raises(linkcache.LinkUnavailable):
        linkcache.get("other")


def test_the_cache_is_bounded(db, settings):
    settings.URLGUARD = {**settings.URLGUARD, "LINK_CACHE_SIZE": 3}
    for i in range(5):
        ShortLink.objects.create(slug=f"s{i}", destination=f"https://example.com/{i}")
        linkcache.get(f"s{i}")
    assert list(linkcache._entries) == ["s2", "s3", "s4"]


def test_generation_row_recreated_after_a_flush(link):
    ShortLinkGeneration.objects.all().delete()
    link.destination = "https://changed.example/"
    link.save()
    assert ShortLinkGeneration.objects.get(pk=1).value == 1


# -- the redirect view ------------------------------------------------------------------


@pytest.fixture
def served(link, build_filter, client):
    build_filter()
    assert client.get("/abc").status_code == 302  # now cached
    return client


def buffered_clicks() -> int:
    """Clicks waiting for the flush (the buffer merges them per link)."""
    return clicks._COUNTS.count(clicks._COUNTS.pending)


def test_a_cached_redirect_reads_and_writes_nothing(served):
    with CaptureQueriesContext(connection) as queries:
        response = served.get("/abc", REMOTE_ADDR="192.0.2.1")
    assert response.status_code == 302 and response["Location"] == "https://example.com/"
    assert queries.captured_queries == []
    assert buffered_clicks() == 2


def test_with_the_database_down_cached_links_redirect_and_others_get_a_503(served, database_down):
    database_down()
    for _ in range(3):
        response = served.get("/abc")
        assert response.status_code == 302
        assert response["Location"] == "https://example.com/"
    response = served.get("/not-cached")
    assert response.status_code == 503
    assert response["Retry-After"] == "30"
    assert response["Cache-Control"] == "no-store"
    assert "try again" in response.content.decode()
    assert buffered_clicks() == 4  # written once the database is back


def test_a_disabled_link_is_answered_from_the_cache(link, build_filter, client):
    build_filter()
    ShortLink.objects.filter(pk=link.pk).update(disabled=True, disabled_reason="reported")
    assert client.get("/abc").status_code == 410
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/abc")
    assert response.status_code == 410 and "reported" in response.content.decode()
    assert "/abc" in response.content.decode()
    assert queries.captured_queries == []


def test_saving_a_link_never_writes_back_stale_counters(link):
    loaded = ShortLink.objects.get(pk=link.pk)  # e.g. the admin's change form
    stats.counter("test.links", ShortLink, fields=("click_count",)).add(link.pk, 7)
    stats.flush()
    loaded.destination = "https://changed.example/"
    loaded.save()
    link.refresh_from_db()
    assert (link.destination, link.click_count) == ("https://changed.example/", 7)
