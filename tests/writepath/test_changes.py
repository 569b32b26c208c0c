"""urlguard.writepath.changes: the one write path (rule row + ChangeEvent in one transaction,
the nudge after commit) and the model guard that keeps everything else out."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from django.db import transaction

from urlguard.models import ChangeEvent, RuleWriteError, SpamRule
from urlguard.writepath import changes, changesets
from urlguard.writepath.rules import RuleError, normalize_rule

pytestmark = pytest.mark.django_db


def test_add_rule_writes_rule_and_event_and_nudges_after_commit(
    nudges, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        rule = changes.add_rule(
            "http://Evil.Example.com/phish/login.html?x=1",
            category="phishing",
            note="reported",
            source="test",
        )
        assert nudges == []  # not before the commit
    assert rule.expression == normalize_rule("http://Evil.Example.com/phish/login.html?x=1")
    event = ChangeEvent.objects.get()
    assert (event.action, event.expression, event.added_at, event.category, event.source) == (
        "add",
        rule.expression,
        rule.added_at,
        "phishing",
        "test",
    )
    assert len(callbacks) == 1
    callbacks[0]()
    assert nudges == [event.seq]


def test_add_rule_refuses_what_normalize_rule_refuses(nudges):
    with pytest.raises(RuleError):
        changes.add_rule("com", category="spam")
    with pytest.raises(RuleError):
        changes.add_rule("", category="spam")
    assert not SpamRule.objects.exists() and not ChangeEvent.objects.exists()


def test_add_rule_refuses_unknown_category(nudges):
    with pytest.raises(RuleError, match="unknown category 'bogus'"):
        changes.add_rule("example.org/", category="bogus")
    assert not ChangeEvent.objects.exists()


def test_duplicate_rule_is_refused_with_the_existing_row(nudges):
    first = changes.add_rule("example.org/", category="spam")
    with pytest.raises(changes.RuleExists) as info:
        changes.add_rule("https://example.org/", category="malware")
    assert info.value.rule == first
    assert isinstance(info.value, RuleError)
    assert ChangeEvent.objects.count() == 1


def test_added_at_is_unique_and_increasing_when_the_clock_repeats(nudges, monkeypatch):
    monkeypatch.setattr(changesets, "now_micros", lambda: 1_700_000_000_000_000)
    ids = [changes.add_rule(f"host{i}.example.org/", category="spam").added_at for i in range(3)]
    assert ids == [1_700_000_000_000_000, 1_700_000_000_000_001, 1_700_000_000_000_002]
    # A clock that steps back still never reuses or goes below an existing id.
    monkeypatch.setattr(changesets, "now_micros", lambda: 5)
    assert changes.add_rule("late.example.org/", category="spam").added_at == ids[-1] + 1


def test_rule_and_event_commit_together(nudges, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(ChangeEvent.objects, "create", broken)
    with pytest.raises(RuntimeError):
        changes.add_rule("example.org/", category="spam")
    assert not SpamRule.objects.exists()


def test_remove_rule_records_the_rules_added_at(nudges, django_capture_on_commit_callbacks):
    old = changes.add_rule("old.example.org/", category="spam")
    changes.add_rule("new.example.org/", category="spam")
    with django_capture_on_commit_callbacks(execute=True):
        changes.remove_rule(old, source="test")
    event = ChangeEvent.objects.order_by("-seq").first()
    assert (event.action, event.expression, event.added_at) == (
        "remove",
        old.expression,
        old.added_at,
    )
    assert not SpamRule.objects.filter(pk=old.pk).exists()
    assert nudges == [event.seq]


def test_removing_a_rule_twice_is_a_no_op(nudges):
    rule = changes.add_rule("example.org/", category="spam")
    changes.remove_rule(rule)
    changes.remove_rule(rule)
    assert list(ChangeEvent.objects.order_by("seq").values_list("action", flat=True)) == [
        "add",
        "remove",
    ]


def test_remove_rule_uses_the_row_not_the_callers_stale_copy(nudges):
    rule = changes.add_rule("example.org/", category="spam")
    stale = SpamRule.objects.get(pk=rule.pk)
    stale.added_at = 12345  # never saved
    changes.remove_rule(stale)
    assert ChangeEvent.objects.get(action="remove").added_at == rule.added_at


@pytest.mark.parametrize(
    "write",
    [
        lambda: SpamRule.objects.create(expression="x.example.org/", added_at=1),
        lambda: SpamRule(expression="x.example.org/", added_at=1).save(),
        lambda: SpamRule.objects.bulk_create([SpamRule(expression="x.example.org/", added_at=1)]),
        lambda: SpamRule.objects.all().delete(),
        lambda: SpamRule.objects.update(category="malware"),
        lambda: SpamRule.objects.get().delete(),
        lambda: SpamRule.objects.get_or_create(expression="y.example.org/", added_at=2),
    ],
    ids=["create", "save-new", "bulk_create", "qs-delete", "qs-update", "delete", "get_or_create"],
)
def test_writes_behind_the_services_back_are_refused(nudges, write):
    changes.add_rule("example.org/", category="spam")
    with pytest.raises(RuleWriteError, match="urlguard.writepath.changes"):
        write()
    assert list(SpamRule.objects.values_list("expression", "category")) == [
        ("example.org/", "spam")
    ]


def test_changing_a_rules_expression_is_refused_but_category_and_note_may_change(nudges):
    rule = changes.add_rule("example.org/", category="spam")
    rule = SpamRule.objects.get(pk=rule.pk)
    rule.category, rule.note = "malware", "confirmed"
    rule.save()
    assert SpamRule.objects.get().category == "malware"
    rule.expression = "other.example.org/"
    with pytest.raises(RuleWriteError):
        rule.save()
    rule = SpamRule.objects.get(pk=rule.pk)
    rule.added_at += 1
    with pytest.raises(RuleWriteError):
        rule.save()


def test_add_rules_sorts_input_into_added_skipped_refused(nudges):
    changes.add_rule("present.example.org/", category="spam")
    parsed_bad = SimpleNamespace(
        lineno=7, raw="###", expression=None, category="spam", error="not a URL or host"
    )
    parsed_ok = SimpleNamespace(
        lineno=8,
        raw="https://parsed.example.org/",
        category="malware",
        expression=normalize_rule("https://parsed.example.org/"),
        error=None,
    )
    result = changes.add_rules(
        [
            "a.example.org",
            "present.example.org",
            ("b.example.org/x/", "phishing"),
            "com",
            "a.example.org/",
            parsed_bad,
            parsed_ok,
        ],
        source="import:test",
    )
    assert result.added == [
        normalize_rule("a.example.org"),
        normalize_rule("b.example.org/x/"),
        parsed_ok.expression,
    ]
    assert sorted(result.skipped) == sorted(
        [normalize_rule("present.example.org"), normalize_rule("a.example.org/")]
    )
    assert [(r.text, r.lineno) for r in result.refused] == [("com", None), ("###", 7)]
    assert "not a URL or host" in str(result.refused[1]) and "line 7" in str(result.refused[1])
    assert result.summary() == "3 added, 2 skipped (already listed), 2 refused"
    assert SpamRule.objects.get(expression=parsed_ok.expression).category == "malware"
    assert SpamRule.objects.get(expression=normalize_rule("b.example.org/x/")).category == (
        "phishing"
    )


def test_add_rules_one_transaction_and_one_nudge_per_chunk(
    nudges, django_capture_on_commit_callbacks
):
    seen = []
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        result = changes.add_rules(
            [f"h{i}.example.org" for i in range(10)],
            source="bulk",
            chunk_size=4,
            progress=seen.append,
        )
    assert len(result.added) == 10
    assert len(callbacks) == 3  # 4 + 4 + 2
    events = list(ChangeEvent.objects.order_by("seq").values_list("seq", "added_at", "expression"))
    assert [e[2] for e in events] == result.added
    assert nudges == [events[3][0], events[7][0], events[9][0]]
    # Filter ids follow the log order, and every rule has its own.
    assert [e[1] for e in events] == sorted({e[1] for e in events})
    assert seen[-1] == 10


def test_add_rules_dry_run_writes_nothing(nudges):
    changes.add_rule("present.example.org/", category="spam")
    result = changes.add_rules(
        ["present.example.org", "new.example.org", "co.uk"], source="x", dry_run=True
    )
    assert result.added == [normalize_rule("new.example.org")]
    assert len(result.skipped) == 1 and len(result.refused) == 1
    assert "would be added" in result.summary()
    assert SpamRule.objects.count() == 1 and ChangeEvent.objects.count() == 1


def test_remove_rules_from_a_queryset_in_chunks(nudges, django_capture_on_commit_callbacks):
    changes.add_rules([f"h{i}.example.org" for i in range(7)], source="bulk")
    keep = SpamRule.objects.get(expression=normalize_rule("h6.example.org"))
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        removed = changes.remove_rules(SpamRule.objects.exclude(pk=keep.pk), chunk_size=4)
    assert removed == 6 and len(callbacks) == 2
    assert list(SpamRule.objects.all()) == [keep]
    removals = ChangeEvent.objects.filter(action="remove")
    assert removals.count() == 6
    assert changes.remove_rules([keep.pk, 999_999]) == 1  # a missing pk is not counted


def test_broker_down_keeps_the_edit_and_logs(settings, caplog, django_capture_on_commit_callbacks):
    """The real nudge against a broker on a closed port: the rule and its event are
    committed, the admin gets no exception, and the log says what will happen."""
    from urlguard_service.celery import app

    saved = {
        k: app.conf[k] for k in ("task_always_eager", "broker_url", "broker_connection_timeout")
    }
    app.conf.update(
        task_always_eager=False, broker_url="redis://127.0.0.1:1/0", broker_connection_timeout=0.5
    )
    app._pool = None
    app.amqp._producer_pool = None
    try:
        with (
            caplog.at_level(logging.WARNING, logger="urlguard"),
            django_capture_on_commit_callbacks(execute=True),
        ):
            rule = changes.add_rule("example.org/", category="spam")
    finally:
        app.conf.update(saved)
        app._pool = None
        app.amqp._producer_pool = None
    assert SpamRule.objects.filter(pk=rule.pk).exists()
    assert ChangeEvent.objects.filter(expression=rule.expression).exists()
    assert "nudge failed" in caplog.text
    # The catch-up is a beat broadcast through the same broker: it waits for it too.
    assert "apply it when the broker answers again" in caplog.text
    assert "`manage.py sync_filter` on each node applies it now" in caplog.text


def test_write_inside_an_outer_transaction_nudges_only_after_it_commits(
    nudges, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        changes.add_rule("example.org/", category="spam")
        assert nudges == []
    assert len(nudges) == 1


def test_every_relation_to_a_rule_is_one_the_bulk_delete_handles():
    # changes._delete_rules removes rules on PostgreSQL with one statement per table,
    # as each relation's on_delete says; a relation it does not know must fail here.
    from django.db import models

    for relation in SpamRule._meta.related_objects:
        assert relation.on_delete in (models.CASCADE, models.SET_NULL, models.DO_NOTHING), relation
        if relation.on_delete is models.CASCADE:
            # One DELETE of those rows: nothing may depend on them in turn.
            assert not relation.related_model._meta.related_objects, relation


def test_only_a_logged_in_user_becomes_a_rows_actor(django_user_model):
    from django.contrib.auth.models import AnonymousUser

    from urlguard.models import row_user

    user = django_user_model(username="someone")
    assert row_user(user) is user
    assert row_user(AnonymousUser()) is None
    assert row_user(None) is None


# -- references the database does not check (RuleSource.rule/.source, ChangeEvent.change_set)

_NO_DANGLING = {
    "listings of a missing rule": 0,
    "listings of a missing source": 0,
    "change-log rows of a missing change set": 0,
}


def test_dangling_references_are_counted(nudges):
    from django.db import connection

    from urlguard.models import RuleSource, Source

    feed = Source.objects.create(name="feed", kind=Source.Kind.FEED, url="file:///dev/null")
    changes.add_rules(["a.example"], source=feed)
    assert changes.dangling_references() == _NO_DANGLING
    rule = SpamRule.objects.get()
    table = RuleSource._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (rule_id, source_id, key, created) "
            "VALUES (%s, %s, 1, CURRENT_TIMESTAMP), (%s, %s, 2, CURRENT_TIMESTAMP)",
            [rule.pk + 1000, feed.pk, rule.pk, feed.pk + 1000],
        )
        cursor.execute(
            f"UPDATE {ChangeEvent._meta.db_table} SET change_set_id = change_set_id + 1000"
        )
    assert changes.dangling_references() == {
        "listings of a missing rule": 1,
        "listings of a missing source": 1,
        "change-log rows of a missing change set": 1,
    }


def test_deleting_a_rule_a_source_a_change_set_or_a_user_leaves_nothing_dangling(
    nudges, django_user_model
):
    from urlguard.models import ChangeSet, RuleSource, Source

    user = django_user_model.objects.create_user("editor")
    feed = Source.objects.create(name="feed", kind=Source.Kind.FEED, url="file:///dev/null")
    other = Source.objects.create(name="other", kind=Source.Kind.FEED, url="file:///dev/null")
    changes.add_rules(["a.example", "b.example", "c.example"], source=feed, actor=user)
    changes.add_rules(["b.example", "d.example"], source=other, actor=user)
    a, b = (SpamRule.objects.get(expression=f"{x}.example/") for x in "ab")
    changes.remove_rule(a, actor=user)
    changes.withdraw_rules(other, [b.pk], actor=user)
    assert not RuleSource.objects.filter(rule_id=a.pk).exists()
    assert changes.dangling_references() == _NO_DANGLING

    feed.delete()  # the admin's delete: the ORM's cascade takes the listings
    assert not RuleSource.objects.filter(source_id=feed.pk).exists()
    assert RuleSource.objects.filter(source=other).count() == 1
    assert changes.dangling_references() == _NO_DANGLING

    logged = ChangeSet.objects.filter(events__isnull=False).distinct()
    first = logged.order_by("pk").first()
    assert first is not None
    first.delete()
    assert ChangeEvent.objects.filter(change_set__isnull=True).exists()
    assert changes.dangling_references() == _NO_DANGLING

    user.delete()
    assert not ChangeEvent.objects.filter(actor__isnull=False).exists()
    assert not SpamRule.objects.filter(added_by__isnull=False).exists()
    assert changes.dangling_references() == _NO_DANGLING


def test_no_listing_is_written_for_a_source_deleted_while_it_refreshes(nudges):
    from urlguard.models import ChangeSet, RuleSource, Source

    feed = Source.objects.create(name="feed", kind=Source.Kind.FEED, url="file:///dev/null")
    cs = ChangeSet.objects.create(kind=ChangeSet.Kind.REFRESH, source=feed)
    stale = Source.objects.get(pk=feed.pk)
    feed.delete()  # by an admin, after the refresh began
    with pytest.raises(Source.DoesNotExist, match="'feed' was deleted"):
        changes.add_rules(["a.example"], source=stale, change_set=cs)
    with pytest.raises(Source.DoesNotExist):
        changes.add_rule("b.example", category="spam", source=stale, change_set=cs)
    with pytest.raises(Source.DoesNotExist):
        changes.add_listed([("c.example/", "spam", 3)], source=stale, change_set=cs)
    assert not SpamRule.objects.exists() and not RuleSource.objects.exists()
    assert not ChangeEvent.objects.exists()


def test_no_change_log_row_is_written_into_a_deleted_change_set(nudges):
    from urlguard.models import AllowedHost, ChangeSet

    cs = ChangeSet.objects.create(kind=ChangeSet.Kind.IMPORT)
    ChangeSet.objects.filter(pk=cs.pk).delete()
    with pytest.raises(ChangeSet.DoesNotExist, match=f"#{cs.pk} was deleted"):
        changes.add_rules(["a.example"], source="import", change_set=cs)
    AllowedHost.objects.create(host="allowed.example")
    with pytest.raises(ChangeSet.DoesNotExist, match=f"#{cs.pk} was deleted"):
        changes.record_allowlist(["allowed.example"], change_set=cs)
    assert not SpamRule.objects.exists() and not ChangeEvent.objects.exists()
    assert changes.record_allowlist(["allowed.example"]) == 1
