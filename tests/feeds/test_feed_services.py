"""A feed refresh on real services: the refresh task runs on a Celery worker over
Redis, commits its change set in PostgreSQL, and the broadcast nudge brings both
nodes' filter files to it (additions, then a removal)."""

from __future__ import annotations

import numpy as np
import pytest
from django.db import connection

from tests.support.faults import fail_on_call
from tests.support.feedserver import feed_server
from tests.support.services import LIVE, wait_for
from urlguard.feeds import listing
from urlguard.feeds.tasks import refresh_feed
from urlguard.models import RuleSource, Source, SpamRule
from urlguard.nodesync import registry
from urlguard.writepath import bulkload, changes, listings, withdrawals

pytestmark = LIVE


def test_a_refresh_through_a_worker_reaches_two_nodes(start_worker, tmp_path):
    paths = [tmp_path / "node-a" / "filter.bin", tmp_path / "node-b" / "filter.bin"]
    workers = [start_worker(path) for path in paths]
    for path, worker in zip(paths, workers, strict=True):
        wait_for(path.exists, what=f"{path} built at boot", log=worker.log)

    def everywhere(expression: str, present: bool) -> None:
        for path, worker in zip(paths, workers, strict=True):
            wait_for(
                lambda p=path: (expression in (registry.get_filter(str(p)) or ())) == present,
                timeout=30,
                what=f"{expression} {'in' if present else 'out of'} {path}",
                log=worker.log,
            )

    with feed_server() as feeds:
        url = feeds.serve("/l", b"one.feed.example\ntwo.feed.example\nthree.feed.example\n")
        source = Source.objects.create(name="svc-feed", kind="feed", url=url)
        refresh_feed.delay(source.pk)
        everywhere("three.feed.example/", True)
        assert SpamRule.objects.filter(listings__source=source).count() == 3
        feeds.serve("/l", b"one.feed.example\ntwo.feed.example\n")
        refresh_feed.delay(source.pk)
        everywhere("three.feed.example/", False)
        everywhere("one.feed.example/", True)
    source.refresh_from_db()
    assert source.last_status == "ok" and source.last_removed == 1


def test_the_listing_read_as_two_aggregates_is_what_the_orm_reads(services_available, nudges):
    assert connection.vendor == "postgresql"
    source = Source.objects.create(name="copy", kind=Source.Kind.FEED, url="file:///dev/null")
    keys, ids = listing.listed_now(source)
    assert len(keys) == len(ids) == 0
    changes.add_rules([f"h{i}.example" for i in range(2500)], source=source)
    changes.add_rules(["other.example"], source="admin")
    keys, ids = listing.listed_now(source)
    rows = sorted(RuleSource.objects.filter(source=source).values_list("key", "rule_id"))
    assert len(rows) == 2500
    assert sorted(zip(keys.tolist(), ids.tolist(), strict=True)) == rows


@pytest.mark.parametrize("share", [0.01, 0.5])  # keys looked up, or the listing read
def test_the_rule_ids_of_keys_are_what_the_orm_reads(services_available, nudges, share):
    source = Source.objects.create(name="ids", kind=Source.Kind.FEED, url="file:///dev/null")
    changes.add_rules([f"h{i}.example" for i in range(400)], source=source)
    changes.add_rules(["other.example"], source="admin")
    rows = dict(RuleSource.objects.filter(source=source).values_list("key", "rule_id"))
    keys = np.sort(np.array(list(rows), dtype=np.int64))
    wanted = np.concatenate((keys[: int(share * len(keys))], np.array([12345], dtype=np.int64)))
    ids = listing.rule_ids(source, np.sort(wanted), len(keys))
    assert sorted(ids) == sorted(rows[k] for k in wanted.tolist() if k in rows)
    assert listing.rule_ids(source, np.zeros(0, dtype=np.int64), len(keys)) == []


def test_withdrawn_and_deleted_rules_take_their_references_along(services_available, nudges):
    # The PostgreSQL statements of changes._withdraw_part and _delete_rules: listings
    # go, a mistake report keeps its text but loses the rule, hit totals stay.
    from urlguard.models import MistakeReport, RuleHitTotal

    feed = Source.objects.create(name="f", kind=Source.Kind.FEED, url="file:///dev/null")
    changes.add_rules(["a.example", "b.example", "c.example"], source=feed)
    changes.add_rules(["b.example"], source="admin")
    a, b, c = (SpamRule.objects.get(expression=f"{x}.example/") for x in "abc")
    report = MistakeReport.objects.create(destination="http://a.example/", rule=a)
    RuleHitTotal.objects.create(rule=a, hits=3)
    withdrawn = changes.withdraw_rules(feed, [a.pk, b.pk, 999_999])
    assert (withdrawn.withdrawn, withdrawn.removed) == (2, 1)
    assert set(SpamRule.objects.values_list("expression", flat=True)) == {
        "b.example/",
        "c.example/",
    }
    assert not RuleSource.objects.filter(source=feed, rule_id__in=[a.pk, b.pk]).exists()
    report.refresh_from_db()
    assert report.rule_id is None and RuleHitTotal.objects.filter(rule_id=a.pk).exists()
    assert changes.remove_rules([b.pk, c.pk]) == 2
    assert not SpamRule.objects.exists() and not RuleSource.objects.exists()


def test_withdrawn_keys_on_postgresql_are_what_withdraw_rules_does(services_available, monkeypatch):
    # withdrawals.withdraw_keys, a plan's withdrawals set-based: the listings of the
    # keys go, a rule another source lists stays, an orphan is removed and logged,
    # its mistake report loses the rule and its hit total stays.
    from urlguard.models import ChangeEvent, ChangeSet, MistakeReport, RuleHitTotal

    assert connection.vendor == "postgresql"
    nudged: list[int] = []
    monkeypatch.setattr(withdrawals, "_nudge", nudged.append)
    feed = Source.objects.create(name="f", kind=Source.Kind.FEED, url="file:///dev/null")
    changes.add_rules(["a.example", "b.example", "c.example", "d.example"], source=feed)
    changes.add_rules(["b.example"], source="admin")
    a, b, c, d = (SpamRule.objects.get(expression=f"{x}.example/") for x in "abcd")
    report = MistakeReport.objects.create(destination="http://a.example/", rule=a)
    RuleHitTotal.objects.create(rule=a, hits=3)
    key_of = dict(RuleSource.objects.filter(source=feed).values_list("rule_id", "key"))
    keys = np.sort(np.array([key_of[a.pk], key_of[b.pk], key_of[d.pk], 12345], dtype=np.int64))
    head = ChangeEvent.objects.head()
    with changes.change_set(kind=ChangeSet.Kind.REFRESH, source=feed) as cs:
        done = withdrawals.withdraw_keys(feed, keys, change_set=cs)
    assert (done.withdrawn, done.removed) == (3, 2) and cs.removed == 2
    assert set(SpamRule.objects.values_list("expression", flat=True)) == {
        "b.example/",
        "c.example/",
    }
    assert set(RuleSource.objects.filter(source=feed).values_list("rule_id", flat=True)) == {c.pk}
    events = list(ChangeEvent.objects.filter(seq__gt=head).order_by("seq"))
    assert [(e.action, e.expression, e.change_set_id) for e in events] == [
        ("remove", "a.example/", cs.pk),
        ("remove", "d.example/", cs.pk),
    ]
    assert [e.added_at for e in events] == [a.added_at, d.added_at]
    assert nudged == [events[-1].seq]  # once the chunk commits, its last seq
    report.refresh_from_db()
    assert report.rule_id is None and RuleHitTotal.objects.filter(rule_id=a.pk).exists()


def test_add_listed_on_postgresql_writes_rules_listings_and_log_set_based(
    services_available,
    monkeypatch,
):
    from urlguard.models import ChangeEvent, ChangeSet, expression_key

    assert connection.vendor == "postgresql"
    nudged: list[int] = []
    monkeypatch.setattr(bulkload, "_nudge", nudged.append)
    other = Source.objects.create(name="other", kind=Source.Kind.FEED, url="file:///dev/null")
    changes.add_rules(["shared.example/"], source=other)
    nudged.clear()
    feed = Source.objects.create(name="bulk", kind=Source.Kind.FEED, url="file:///dev/null")
    # A backslash in a query is a field COPY's text format would have to escape.
    odd = "odd.example/p?a=\\b"
    wanted = [f"h{i}.example/" for i in range(7)] + ["shared.example/", odd]
    rows = [(expression, "malware", expression_key(expression)) for expression in wanted]
    head = ChangeEvent.objects.head()
    with changes.change_set(kind=ChangeSet.Kind.REFRESH, source=feed) as cs:
        result = changes.add_listed(iter(rows), source=feed, change_set=cs, chunk_size=3)
    assert (result.added_count, result.skipped_count, result.gained) == (8, 1, 1)
    listed = dict(RuleSource.objects.filter(source=feed).values_list("rule__expression", "key"))
    assert listed == {expression: expression_key(expression) for expression in wanted}
    assert SpamRule.objects.get(expression=odd).category == "malware"
    events = list(ChangeEvent.objects.filter(seq__gt=head).order_by("seq"))
    # Only the rules new to the table are logged, in added_at order, in this set.
    assert [e.expression for e in events] == [e for e in wanted if e != "shared.example/"]
    assert [e.added_at for e in events] == sorted(e.added_at for e in events)
    assert {e.change_set_id for e in events} == {cs.pk} and cs.added == 8
    # One nudge per chunk that wrote, with that chunk's last seq.
    assert nudged == [events[2].seq, events[5].seq, events[7].seq]
    assert SpamRule.objects.filter(expression="shared.example/", listings__source=other).exists()


def test_add_listed_reads_rows_in_a_thread_and_stops_it_on_any_error(
    services_available,
    nudges,
    monkeypatch,
):
    # The rows are read and encoded by a thread while PostgreSQL writes the chunk
    # before: an error in them reaches the caller after the chunks before it
    # committed (the set stays partial, for the next run); an error of the write's
    # own stops the thread. Either way no thread is left behind.
    import threading

    from urlguard.models import ChangeEvent, ChangeSet, expression_key

    def readers() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name == "urlguard-add-listed"]

    def rows(n: int, fail_at: int | None = None):
        for i in range(n):
            if i == fail_at:
                raise OSError("the spool went away")
            expression = f"t{i}.example/"
            yield expression, "spam", expression_key(expression)

    feed = Source.objects.create(name="threaded", kind=Source.Kind.FEED, url="file:///dev/null")
    with (
        pytest.raises(OSError, match="spool went away"),
        changes.change_set(kind=ChangeSet.Kind.REFRESH, source=feed) as cs,
    ):
        changes.add_listed(rows(10, fail_at=7), source=feed, change_set=cs, chunk_size=3)
    assert readers() == []
    assert SpamRule.objects.count() == 6 and ChangeEvent.objects.count() == 6
    assert RuleSource.objects.filter(source=feed).count() == 6
    cs.refresh_from_db()
    assert cs.finished is None and cs.added == 6

    fail_on_call(
        monkeypatch, bulkload, "_add_listed_chunk", 2, RuntimeError("the database said no")
    )
    with pytest.raises(RuntimeError, match="said no"):
        changes.add_listed(rows(1000), source=feed, chunk_size=300)
    assert readers() == []
    # The first chunk's 300 rows (6 of them listed already) committed; the second's not.
    assert SpamRule.objects.count() == 300
    assert changes.dangling_references() == {k: 0 for k in changes.dangling_references()}


def test_a_source_deletion_takes_the_change_log_lock_before_its_listings_go(
    services_available,
    nudges,
):
    # A writer of listings holds the lock from its check that the source exists to
    # its commit; the deletion waits for it, so no listing of a deleted source commits.
    feed = Source.objects.create(name="gone", kind=Source.Kind.FEED, url="file:///dev/null")
    changes.add_rules(["a.example", "b.example"], source=feed)
    statements: list[str] = []

    def record(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        feed.delete()
    locked = next(i for i, sql in enumerate(statements) if "pg_advisory_xact_lock" in sql)
    deleted = next(i for i, sql in enumerate(statements) if "DELETE" in sql and "rulesource" in sql)
    assert locked < deleted
    assert not RuleSource.objects.exists() and SpamRule.objects.count() == 2


def test_a_change_set_deletion_waits_for_a_writer_of_its_rows(
    services_available,
    nudges,
):
    # A change-log row refers to its set without a database constraint: a set deleted
    # while a writer adds rows to it must not leave the writer's rows pointing at it
    # (the deletion's SET_NULL ran before they committed, its DELETE after).
    import threading

    from django.db import connections, transaction

    from urlguard.models import ChangeSet

    cs = ChangeSet.objects.create(kind=ChangeSet.Kind.IMPORT)
    errors: list[BaseException] = []

    def delete() -> None:
        try:
            ChangeSet.objects.filter(pk=cs.pk).delete()  # the admin's delete action
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    with transaction.atomic():
        changes.add_rules(["a.example"], source="import", change_set=cs)
        deleter = threading.Thread(target=delete)
        deleter.start()
        deleter.join(timeout=1.0)  # it waits for this transaction
        assert deleter.is_alive()
    deleter.join(timeout=10)
    assert not deleter.is_alive() and not errors
    assert not ChangeSet.objects.filter(pk=cs.pk).exists()
    assert changes.dangling_references() == {k: 0 for k in changes.dangling_references()}


def test_the_rule_ids_of_many_keys_are_one_statement(services_available, nudges, monkeypatch):
    # No index finds a listing by its key (migration 0019): each statement scans the
    # source's listings, so the keys go in one statement, not one per batch.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    monkeypatch.setattr(listings, "_BATCH", 100)
    source = Source.objects.create(name="ids", kind=Source.Kind.FEED, url="file:///dev/null")
    changes.add_rules([f"h{i}.example" for i in range(3000)], source=source)
    rows = dict(RuleSource.objects.filter(source=source).values_list("key", "rule_id"))
    keys = np.sort(np.array(list(rows), dtype=np.int64))[:350]
    with CaptureQueriesContext(connection) as queries:
        ids = listing.rule_ids(source, keys, len(rows))
    assert sorted(ids) == sorted(rows[k] for k in keys.tolist())
    assert len([q for q in queries if "rule_id" in q["sql"]]) == 1
