"""An import and a revert on PostgreSQL go through the apply's bulk path: the bulk
loader's COPY for the rules listed (notes and categories kept) and the set-based
withdrawals for the rules taken away, never the chunked writes; one change set,
one change-log row per rule changed, each way."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection

from tests.support.faults import fail_on_call
from tests.support.services import LIVE
from urlguard.models import ChangeEvent, ChangeSet, RuleSource, SpamRule
from urlguard.writepath import bulkload, changes, revert, withdrawals

pytestmark = LIVE

RULES = 1200


def _bulk_only(monkeypatch) -> dict[str, int]:
    """Counts the bulk paths' calls; any chunked write fails the test."""
    calls = {"copy_listed": 0, "withdraw_ids": 0}
    for module, name in ((bulkload, "copy_listed"), (withdrawals, "withdraw_ids")):
        real = getattr(module, name)

        def counted(*args, real=real, name=name, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    for name in ("_add_chunk", "withdraw_rules", "remove_rules"):
        fail_on_call(monkeypatch, changes, name, 1, AssertionError(f"chunked: {name}"))
    return calls


def _import(tmp_path) -> ChangeSet:
    body = tmp_path / "list.csv"
    notes = ['"a note, with a comma"', "back\\slash", ""]
    body.write_text(
        "url,category,note\n"
        + "".join(f"imp{i}.example.org,malware,{notes[i % 3]}\n" for i in range(RULES))
        + "imp0.example.org,malware,repeated\n"
    )
    out = io.StringIO()
    call_command("import_rules", str(body), stdout=out)
    assert f"{RULES} added, 1 skipped (already listed), 0 refused" in out.getvalue()
    return ChangeSet.objects.get(kind=ChangeSet.Kind.IMPORT)


def test_an_import_on_postgresql_is_loaded_by_the_bulk_loader(
    services_available,
    monkeypatch,
    tmp_path,
):
    assert connection.vendor == "postgresql"
    calls = _bulk_only(monkeypatch)
    head = ChangeEvent.objects.head()
    imported = _import(tmp_path)
    assert calls["copy_listed"] == 1
    assert (imported.added, imported.source.name) == (RULES, "import")
    rules = dict(SpamRule.objects.values_list("expression", "note"))
    assert len(rules) == RULES
    assert rules["imp0.example.org/"] == "a note, with a comma"
    assert rules["imp1.example.org/"] == "back\\slash" and rules["imp2.example.org/"] == ""
    assert set(SpamRule.objects.values_list("source", "category")) == {
        ("import:list.csv", "malware")
    }
    assert RuleSource.objects.filter(source=imported.source).count() == RULES
    events = ChangeEvent.objects.filter(seq__gt=head)
    assert events.count() == RULES and {e.change_set_id for e in events} == {imported.pk}
    assert events.get(expression="imp0.example.org/").note == "a note, with a comma"


def test_a_revert_on_postgresql_and_its_revert_are_set_based(
    services_available,
    monkeypatch,
    tmp_path,
):
    imported = _import(tmp_path)
    calls = _bulk_only(monkeypatch)
    head = ChangeEvent.objects.head()
    undone = revert.revert_change_set(imported, reason="bad list")
    assert calls == {"copy_listed": 0, "withdraw_ids": 1}
    assert (undone.removed, undone.reverts_id) == (RULES, imported.pk)
    assert not SpamRule.objects.exists() and not RuleSource.objects.exists()
    removals = ChangeEvent.objects.filter(seq__gt=head, change_set=undone, action="remove")
    assert removals.count() == RULES
    added_at = list(removals.order_by("seq").values_list("added_at", flat=True))
    assert added_at == sorted(added_at)
    restored = revert.revert_change_set(undone)
    assert calls == {"copy_listed": 1, "withdraw_ids": 1}
    assert restored.added == RULES
    assert dict(SpamRule.objects.values_list("expression", "note"))["imp0.example.org/"] == (
        "a note, with a comma"
    )
    assert SpamRule.objects.filter(category="malware").count() == RULES


@pytest.mark.parametrize("lister", ["feed", None])
def test_a_revert_on_postgresql_takes_away_only_what_is_still_the_sets(
    services_available,
    monkeypatch,
    lister,
):
    """A rule removed and added again since is not the set's to take away; with a
    source, a rule another source lists too stays."""
    from urlguard.models import Source

    source = Source.objects.create(name="feed", kind=Source.Kind.FEED, url="file:///x")
    with changes.change_set(kind=ChangeSet.Kind.REFRESH, source=source if lister else None) as cs:
        changes.add_rules(
            ["a.example.org", "b.example.org", "c.example.org"],
            source=source if lister else "admin",
            change_set=cs,
        )
    changes.add_rules(["b.example.org"], source="admin")
    again = SpamRule.objects.get(expression="c.example.org/")
    changes.remove_rule(again)
    changes.add_rule("c.example.org", category="spam")
    _bulk_only(monkeypatch)
    undone = revert.revert_change_set(cs)
    left = set(SpamRule.objects.values_list("expression", flat=True))
    if lister:
        assert left == {"b.example.org/", "c.example.org/"} and undone.removed == 1
    else:
        assert left == {"c.example.org/"} and undone.removed == 2
