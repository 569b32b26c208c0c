"""Withdrawals and removals: a source that no longer lists rules (withdraw_rules:
the rule goes only when no source lists it any more), and the admin's delete,
which removes rules outright whoever lists them (remove_rule, remove_rules). Each
chunk is one transaction under the change-log lock with its change-log rows."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db import router, transaction
from django.utils import timezone

from urlguard.models import (
    Actor,
    ChangeEvent,
    ChangeSet,
    RuleSource,
    Source,
    SpamRule,
    row_user,
    rule_writes_allowed,
)
from urlguard.runtime import database
from urlguard.runtime.database import in_batches
from urlguard.writepath.changesets import (
    _REMOVE,
    CHUNK_SIZE,
    _count,
    _db_value,
    _insert_events,
    _kind_for,
    _label,
    _lock_change_log,
    _nudge_after_commit,
    _one_off,
    source_for,
)

logger = logging.getLogger(__name__)

__all__ = ["WithdrawResult", "remove_rule", "remove_rules", "withdraw_rules"]


@dataclass
class WithdrawResult:
    """What withdraw_rules did: listings taken away, and rules removed because no
    source listed them any more."""

    withdrawn: int = 0
    removed: int = 0
    change_set: ChangeSet | None = None


def remove_rule(
    rule: SpamRule,
    *,
    user: Actor = None,
    source: str | Source = "admin",
    change_set: ChangeSet | None = None,
    reason: str = "",
) -> None:
    """Unlist `rule` outright, whichever sources list it (the admin's delete; a feed
    uses withdraw_rules). Removing a rule that is already gone is a no-op (two people
    clicking "delete" at once must not fail). `reason` goes on a one-off change set."""
    label = _label(source)
    using = router.db_for_write(SpamRule)
    with transaction.atomic(using=using), rule_writes_allowed():
        _lock_change_log(using)
        # Read the row again under the lock: the caller's copy may be stale.
        rows = list(
            SpamRule.objects.filter(pk=rule.pk).values_list(
                "pk", "expression", "added_at", "category", "note"
            )
        )
        if not rows:
            logger.info("rule #%s (%s) was already removed", rule.pk, rule.expression)
            return
        cs = _one_off(
            change_set,
            kind=_kind_for(label, ChangeSet.Kind.OTHER),
            user=user,
            source=source_for(source),
            reason=reason,
        )
        _remove_rows(using, rows, cs=cs, user=user, label=label)


def _pks(rules: Iterable[Any]) -> Iterator[int]:
    if hasattr(rules, "values_list"):  # a QuerySet: read only the keys, once
        yield from rules.values_list("pk", flat=True).iterator(chunk_size=CHUNK_SIZE)
        return
    for rule in rules:
        yield rule if isinstance(rule, int) else rule.pk


def _remove_rows(using: str, rows: list[tuple], *, cs: ChangeSet, user: Actor, label: str) -> int:
    """Delete these (pk, expression, added_at, category, note) rules and log their
    removals in `cs`, inside the caller's locked transaction. Their listings go with
    them (RuleSource rows cascade)."""
    if not rows:
        return 0
    rows = sorted(rows, key=lambda r: r[2])
    database.delete_by_pk(using, SpamRule, [r[0] for r in rows])
    actor = row_user(user)
    now = _db_value(using, ChangeEvent, "created", timezone.now())
    # The removal carries the rule's own added_at: it routes to the stage that took
    # the addition, however long ago that was; the note lets a revert bring it back.
    _insert_events(
        using,
        [
            (_REMOVE, expr, added_at, cat, actor.pk if actor else None, label, now, cs.pk, note)
            for _, expr, added_at, cat, note in rows
        ],
    )
    _count(cs, removed=len(rows))
    _nudge_after_commit(using)
    return len(rows)


# A change-log row's columns as the bulk writers insert them.
_ROW = ("pk", "expression", "added_at", "category", "note")


def _withdraw_part(using: str, lister: Source, pks: list[int]) -> tuple[int, list[tuple]]:
    """Inside the caller's locked transaction: take `lister`'s listings of these rules
    away; returns how many it had and the rows (_ROW) of those no source lists now."""
    ids = database.delete_in(using, RuleSource, "rule_id", pks, source_id=lister.pk)
    if not ids:
        return 0, []
    return len(ids), database.unreferenced(using, SpamRule, ids, _ROW, RuleSource, "rule")


def remove_rules(
    rules: Iterable[Any],
    *,
    user: Actor = None,
    source: str | Source = "admin",
    chunk_size: int = CHUNK_SIZE,
    change_set: ChangeSet | None = None,
    reason: str = "",
) -> int:
    """Unlist many rules outright (a QuerySet, SpamRule objects or primary keys),
    whichever sources list them, one transaction per chunk. Returns how many were
    removed (already gone: not counted). `reason` goes on a one-off change set."""
    pks = list(_pks(rules))
    label = _label(source)
    using = router.db_for_write(SpamRule)
    cs = _one_off(
        change_set,
        kind=ChangeSet.Kind.BULK_DELETE,
        user=user,
        source=source_for(source),
        reason=reason,
    )
    removed = 0
    for part in in_batches(pks, chunk_size):
        with transaction.atomic(using=using), rule_writes_allowed():
            _lock_change_log(using)
            rows: list[tuple] = []
            for batch in in_batches(part):
                rows.extend(SpamRule.objects.filter(pk__in=batch).values_list(*_ROW))
            removed += _remove_rows(using, rows, cs=cs, user=user, label=label)
    return removed


def withdraw_rules(
    source: str | Source,
    rules: Iterable[Any],
    *,
    user: Actor = None,
    chunk_size: int = CHUNK_SIZE,
    change_set: ChangeSet | None = None,
    reason: str = "",
) -> WithdrawResult:
    """`source` no longer lists these rules (a QuerySet, SpamRule objects or primary
    keys): its listings go, and each rule that no other source lists any more is
    removed (one transaction per chunk, under the change-log lock, so an addition
    that makes another source list the rule at the same moment is never lost).
    Rules the source did not list are left alone."""
    lister = source_for(source)
    label = _label(source)
    pks = list(_pks(rules))
    using = router.db_for_write(SpamRule)
    cs = _one_off(change_set, kind=ChangeSet.Kind.OTHER, user=user, source=lister, reason=reason)
    result = WithdrawResult(change_set=cs)
    for part in in_batches(pks, chunk_size):
        with transaction.atomic(using=using), rule_writes_allowed():
            _lock_change_log(using)
            withdrawn, orphans = _withdraw_part(using, lister, part)
            result.withdrawn += withdrawn
            result.removed += _remove_rows(using, orphans, cs=cs, user=user, label=label)
    return result
