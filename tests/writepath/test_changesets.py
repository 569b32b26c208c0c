"""Change sets and provenance in urlguard.writepath.changes: every write belongs to a change
set, every rule knows which sources list it, and a source's withdrawal removes a
rule only when no source lists it any more."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.db import connection

from urlguard.models import (
    ChangeEvent,
    ChangeSet,
    RuleSource,
    Source,
    SpamRule,
    expression_key,
)
from urlguard.writepath import changes

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _captured(nudges):
    """Rule writes are nudged into `nudges`, never delivered."""


def listers(expression: str) -> set[str]:
    return set(
        RuleSource.objects.filter(rule__expression=expression).values_list(
            "source__name", flat=True
        )
    )


@pytest.fixture
def feed():
    return Source.objects.create(name="feed-a", kind=Source.Kind.FEED, url="http://x/")


def test_add_rule_makes_a_one_off_admin_set_with_the_note(django_user_model):
    user = django_user_model.objects.create_user("ann")
    rule = changes.add_rule("evil.example/", category="spam", note="seen in mail", actor=user)
    event = ChangeEvent.objects.get()
    cs = event.change_set
    assert (cs.kind, cs.actor, cs.added, cs.removed, cs.note) == (
        "admin",
        user,
        1,
        0,
        "seen in mail",
    )
    assert cs.source.name == "admin" and cs.source.kind == Source.Kind.MANUAL
    assert event.note == "seen in mail"
    assert listers(rule.expression) == {"admin"}
    listing = RuleSource.objects.get()
    assert listing.key == expression_key(rule.expression)


def test_a_refused_add_leaves_no_change_set():
    changes.add_rule("evil.example/", category="spam")
    with pytest.raises(changes.RuleExists):
        changes.add_rule("evil.example/", category="spam")
    assert ChangeSet.objects.count() == 1


def test_writes_inside_change_set_share_it_and_count(django_user_model):
    user = django_user_model.objects.create_user("bob")
    first = changes.add_rule("keep.example/", category="spam")
    with changes.change_set(kind="revert", actor=user, note="n", reason="mistake") as cs:
        changes.add_rule("one.example/", category="spam", actor=user)
        changes.add_rules(["two.example", "three.example", "com"], source="import:x.txt")
        changes.remove_rule(first, actor=user)
    assert (cs.added, cs.removed, cs.refused) == (3, 1, 1)
    assert set(ChangeEvent.objects.filter(change_set=cs).values_list("expression", flat=True)) == {
        "one.example/",
        "two.example/",
        "three.example/",
        "keep.example/",
    }
    assert (cs.kind, cs.reason, changes.current_change_set()) == ("revert", "mistake", None)
    # The label's part before ':' names the manual source.
    assert listers("two.example/") == {"import"}


def test_explicit_change_set_wins_over_the_open_one():
    outer_set = ChangeSet.objects.create(kind="other")
    with changes.change_set(kind="import") as opened:
        changes.add_rule("a.example/", category="spam", change_set=outer_set)
    assert ChangeEvent.objects.get().change_set == outer_set
    assert opened.added == 0


def test_removal_event_keeps_note_and_category():
    rule = changes.add_rule("noted.example/", category="phishing", note="why")
    changes.remove_rule(rule, reason="false positive")
    event = ChangeEvent.objects.get(action="remove")
    assert (event.note, event.category) == ("why", "phishing")
    assert event.change_set.reason == "false positive"
    assert not RuleSource.objects.exists()


def test_bulk_remove_is_one_bulk_delete_set():
    changes.add_rules([f"h{i}.example" for i in range(5)], source="admin")
    removed = changes.remove_rules(SpamRule.objects.all(), chunk_size=2)
    assert removed == 5
    sets = ChangeSet.objects.filter(kind="bulk-delete")
    assert sets.count() == 1 and sets.get().removed == 5


def test_already_listed_rule_gains_the_source_without_an_event(feed):
    changes.add_rule("shared.example/", category="spam")
    result = changes.add_rules(["shared.example", "new.example"], source=feed)
    assert result.skipped == ["shared.example/"] and result.gained == 1
    assert listers("shared.example/") == {"admin", "feed-a"}
    assert ChangeEvent.objects.filter(expression="shared.example/").count() == 1
    # Listing it again changes nothing.
    again = changes.add_rules(["shared.example"], source=feed)
    assert again.gained == 0 and RuleSource.objects.filter(source=feed).count() == 2


def test_withdraw_removes_only_what_no_source_lists_any_more(feed):
    changes.add_rule("hand.example/", category="spam", note="by hand")
    changes.add_rules(["hand.example", "only-feed.example"], source=feed)
    rules = SpamRule.objects.filter(listings__source=feed)
    result = changes.withdraw_rules(feed, rules)
    assert (result.withdrawn, result.removed) == (2, 1)
    assert set(SpamRule.objects.values_list("expression", flat=True)) == {"hand.example/"}
    assert listers("hand.example/") == {"admin"}
    removal = ChangeEvent.objects.get(action="remove")
    assert removal.expression == "only-feed.example/" and removal.change_set.removed == 1


def test_withdraw_leaves_rules_the_source_never_listed(feed):
    rule = changes.add_rule("other.example/", category="spam")
    RuleSource.objects.all().delete()  # a rule nobody lists (cannot happen, but must be safe)
    result = changes.withdraw_rules(feed, [rule.pk])
    assert (result.withdrawn, result.removed) == (0, 0)
    assert SpamRule.objects.filter(pk=rule.pk).exists()


def test_admin_delete_removes_a_rule_feeds_list(feed):
    changes.add_rules(["listed.example"], source=feed)
    changes.remove_rule(SpamRule.objects.get())
    assert not SpamRule.objects.exists() and not RuleSource.objects.exists()


def test_dry_run_makes_no_change_set():
    changes.add_rules(["a.example"], source="import:y", dry_run=True)
    assert not ChangeSet.objects.exists()
    assert set(Source.objects.values_list("name", flat=True)) == {"admin", "import"}


def test_source_for_resolves_names_and_labels(feed):
    assert changes.source_for("feed-a") == feed
    assert changes.source_for(feed) is feed
    made = changes.source_for("demo")
    assert (made.name, made.kind) == ("demo", "manual")
    assert changes.source_for("import:big.txt").name == "import"


def test_data_migration_lists_existing_rules_under_their_manual_source():
    changes.add_rule("old-admin.example/", category="spam")
    changes.add_rules(["old-import.example"], source="import:list.txt")
    changes.add_rules(["old-demo.example"], source="demo")
    RuleSource.objects.all().delete()
    migration = importlib.import_module("urlguard.migrations.0007_manual_sources")
    migration.forwards(apps, SimpleNamespace(connection=connection))
    assert listers("old-admin.example/") == {"admin"}
    assert listers("old-import.example/") == {"import"}
    assert listers("old-demo.example/") == {"demo"}
    assert set(RuleSource.objects.values_list("key", flat=True)) == {
        expression_key(e) for e in SpamRule.objects.values_list("expression", flat=True)
    }
