"""urlguard.models.database: the one module that knows which backend it talks to.
Its many-value statements stay under the smallest bound-parameter limit the app
supports (SQLite before 3.32: 999), here enforced on the test database itself."""

from __future__ import annotations

import datetime as dt
import re
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest
from django.db import connection
from django.utils import timezone

from tests.support.services import live
from urlguard.models import (
    Click,
    HostHitDay,
    RuleSource,
    ShortLink,
    Source,
    SpamRule,
    database,
    rule_writes_allowed,
)

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def old_sqlite_limit():
    """The test database allows only MAX_PARAMETERS bound parameters a statement, as
    SQLite before 3.32 did (PostgreSQL's 65,535 is never reached by these tests)."""
    if connection.vendor != "sqlite":
        yield
        return
    connection.ensure_connection()
    raw = connection.connection
    before = raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, database.MAX_PARAMETERS)
    try:
        yield
    finally:
        raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, before)


def test_the_limit_is_enforced_by_the_fixture(old_sqlite_limit):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's limit")
    marks = ", ".join(["%s"] * (database.MAX_PARAMETERS + 1))
    with pytest.raises(Exception, match="too many SQL variables"), connection.cursor() as c:
        c.execute(f"SELECT 1 WHERE 1 IN ({marks})", list(range(database.MAX_PARAMETERS + 1)))


def test_batches_and_rows_stay_under_the_limit():
    assert database.IN_BATCH < database.MAX_PARAMETERS
    assert [len(b) for b in database.in_batches(list(range(2000)))] == [900, 900, 200]
    assert database.rows_per_statement(1) == database.STATEMENT_ROWS
    for width in (2, 3, 5, 13):
        assert database.rows_per_statement(width) * width <= database.MAX_PARAMETERS
    assert database.rows_per_statement(database.MAX_PARAMETERS + 1) == 1


def test_integer_columns_go_as_one_array_literal():
    assert database.array_parameter((3, -1, 2**62)) == "{3,-1,4611686018427387904}"
    # Anything else (a bool is an int subclass) is left to psycopg's own dumper.
    assert database.array_parameter((1, True)) == [1, True]
    assert database.array_parameter(("a", "b")) == ["a", "b"]


def _links(n: int) -> list[int]:
    ShortLink.objects.bulk_create(
        ShortLink(slug=f"d{i}", destination=f"https://example.com/{i}") for i in range(n)
    )
    return list(ShortLink.objects.order_by("pk").values_list("pk", flat=True))


def test_counts_added_to_many_rows(old_sqlite_limit):
    # 700 rows of 3 values: 2,100 parameters, more than one statement may carry.
    pks = _links(700)
    fields = [ShortLink._meta.get_field(n) for n in ("id", "click_count", "unique_visitors")]
    rows = [(pk, 2, 1) for pk in pks] + [(10**9, 5, 5)]  # a missing row is left out
    database.add_counts("default", ShortLink, fields[:1], fields[1:], rows, upsert=False)
    assert set(ShortLink.objects.values_list("click_count", "unique_visitors")) == {(2, 1)}


def test_upsert_adding_many_rows(old_sqlite_limit):
    day = dt.date(2026, 1, 2)
    rows = [(f"h{i}.example", day, 1) for i in range(600)]
    database.upsert_adding(HostHitDay, ("host", "day"), ("hits",), None, rows)
    database.upsert_adding(HostHitDay, ("host", "day"), ("hits",), None, rows[:10])
    hits = dict(HostHitDay.objects.values_list("host", "hits"))
    assert len(hits) == 600 and hits["h0.example"] == 2 and hits["h599.example"] == 1


def test_clicks_of_many_links_and_visitors_are_written(old_sqlite_limit):
    # The new-visitor lookup has two IN lists (links, visitors) in one statement.
    from urlguard.shortlinks import clicks

    pks = _links(600)
    now = time.time()
    clicks.write_clicks(
        [clicks.PendingClick(pk, f"v{pk}", now, True, True) for pk in pks]
        + [clicks.PendingClick(pks[0], "v-again", now, True, True)]
    )
    assert Click.objects.count() == 601
    uniques = dict(ShortLink.objects.values_list("pk", "unique_visitors"))
    assert uniques[pks[0]] == 2 and set(uniques.values()) == {1, 2}


def _rules(n: int, source: Source) -> list[int]:
    now = timezone.now()
    with rule_writes_allowed():  # rows for the statements to work on, no change log
        SpamRule.objects.bulk_create(
            SpamRule(expression=f"r{i}.example/", added_at=i + 1, created=now, updated=now)
            for i in range(n)
        )
    pks = list(SpamRule.objects.order_by("pk").values_list("pk", flat=True))
    RuleSource.objects.bulk_create(
        RuleSource(rule_id=pk, source=source, key=pk, created=now) for pk in pks
    )
    return pks


def test_lookups_and_deletions_by_many_values(old_sqlite_limit):
    feed = Source.objects.create(name="f", kind=Source.Kind.FEED, url="file:///dev/null")
    other = Source.objects.create(name="g", kind=Source.Kind.FEED, url="file:///dev/null")
    pks = _rules(2000, feed)
    RuleSource.objects.create(rule_id=pks[0], source=other, key=-1, created=timezone.now())
    expressions = [f"r{i}.example/" for i in range(2000)] + ["absent.example/"]
    assert database.map_in(SpamRule, "expression", expressions, "pk") == {
        f"r{i}.example/": pk for i, pk in enumerate(pks)
    }
    keys, ids = database.int64_columns(RuleSource, ("key", "rule_id"), source_id=feed.pk)
    assert sorted(zip(keys.tolist(), ids.tolist(), strict=True)) == [(pk, pk) for pk in pks]

    gone = database.delete_in("default", RuleSource, "rule_id", [*pks, 10**9], source_id=feed.pk)
    assert sorted(gone) == pks
    orphans = database.unreferenced(
        "default", SpamRule, pks, ("pk", "expression"), RuleSource, "rule"
    )
    assert sorted(orphans) == [(pk, f"r{i}.example/") for i, pk in enumerate(pks) if i]

    with rule_writes_allowed():
        database.delete_by_pk("default", SpamRule, pks)
    assert not SpamRule.objects.exists() and not RuleSource.objects.exists()


def test_only_the_database_module_asks_which_backend_it_has():
    """A backend branch elsewhere is SQL with no portable twin beside it, and a
    second statement of the parameter limit."""
    asking = re.compile(r"\.vendor\b|max_query_params|SQLITE_LIMIT")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for package in ("urlguard", "urlguard_service")
        for path in sorted((ROOT / package).rglob("*.py"))
        # Migrations are history: they may not call code that changes after them.
        if path != ROOT / "urlguard" / "models" / "database.py" and "migrations" not in path.parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if asking.search(line)
    ]
    assert found == []


def _sorted_column_reads_each_part_in_order():
    """Keys over the whole int64 range (every top-bits part, both ends), another
    source's keys beside them, and a source listing nothing."""
    feed = Source.objects.create(name="f", kind=Source.Kind.FEED, url="file:///dev/null")
    other = Source.objects.create(name="g", kind=Source.Kind.FEED, url="file:///dev/null")
    empty = Source.objects.create(name="e", kind=Source.Kind.FEED, url="file:///dev/null")
    pks = _rules(600, feed)
    rng = np.random.default_rng(7)
    keys = rng.integers(-(2**63), 2**63 - 1, size=len(pks), dtype=np.int64, endpoint=True)
    keys[:2] = (-(2**63), 2**63 - 1)
    for pk, key in zip(pks, keys.tolist(), strict=True):
        RuleSource.objects.filter(rule_id=pk, source=feed).update(key=key)
    RuleSource.objects.create(rule_id=pks[0], source=other, key=0, created=timezone.now())
    read = database.sorted_int64_column(RuleSource, "key", source_id=feed.pk)
    assert read.dtype == np.int64 and read.tolist() == sorted(keys.tolist())
    assert database.sorted_int64_column(RuleSource, "key", source_id=empty.pk).tolist() == []


def test_a_sorted_column_is_read_whole_and_in_order():
    _sorted_column_reads_each_part_in_order()


@live
def test_a_sorted_column_is_read_a_part_at_a_time_on_postgresql():
    assert connection.vendor == "postgresql"
    _sorted_column_reads_each_part_in_order()
