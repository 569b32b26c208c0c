"""Withdrawals and removals: a source that no longer lists rules (withdraw_rules:
the rule goes only when no source lists it any more), and the admin's delete,
which removes rules outright whoever lists them (remove_rule, remove_rules). Each
chunk is one transaction under the change-log lock with its change-log rows."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from django.db import connections, router, transaction
from django.utils import timezone

from urlguard.models import (
    Actor,
    ChangeEvent,
    ChangeSet,
    RuleSource,
    Source,
    SpamRule,
    database,
    row_user,
    rule_writes_allowed,
)
from urlguard.models.database import in_batches
from urlguard.writepath.changesets import (
    _REMOVE,
    CHUNK_SIZE,
    _count,
    _db_value,
    _insert_events,
    _kind_for,
    _label,
    _lock_change_log,
    _nudge,
    _nudge_after_commit,
    _one_off,
    source_for,
)

logger = logging.getLogger(__name__)

__all__ = [
    "WithdrawResult",
    "remove_rule",
    "remove_rules",
    "withdraw_ids",
    "withdraw_keys",
    "withdraw_rules",
]

# Keys per transaction of withdraw_keys: each is one statement reading the listings once.
KEYS_CHUNK_SIZE = 50_000


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
    actor: Actor = None,
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
            actor=actor,
            source=source_for(source),
            reason=reason,
        )
        _remove_rows(using, rows, cs=cs, actor=actor, label=label)


def _pks(rules: Iterable[Any]) -> Iterator[int]:
    if hasattr(rules, "values_list"):  # a QuerySet: read only the keys, once
        yield from rules.values_list("pk", flat=True).iterator(chunk_size=CHUNK_SIZE)
        return
    for rule in rules:
        yield rule if isinstance(rule, int) else rule.pk


def _remove_rows(using: str, rows: list[tuple], *, cs: ChangeSet, actor: Actor, label: str) -> int:
    """Delete these (pk, expression, added_at, category, note) rules and log their
    removals in `cs`, inside the caller's locked transaction. Their listings go with
    them (RuleSource rows cascade)."""
    if not rows:
        return 0
    rows = sorted(rows, key=lambda r: r[2])
    database.delete_by_pk(using, SpamRule, [r[0] for r in rows])
    actor = row_user(actor)
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
    actor: Actor = None,
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
        actor=actor,
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
            removed += _remove_rows(using, rows, cs=cs, actor=actor, label=label)
    return removed


def withdraw_rules(
    source: str | Source,
    rules: Iterable[Any],
    *,
    actor: Actor = None,
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
    cs = _one_off(change_set, kind=ChangeSet.Kind.OTHER, actor=actor, source=lister, reason=reason)
    result = WithdrawResult(change_set=cs)
    for part in in_batches(pks, chunk_size):
        with transaction.atomic(using=using), rule_writes_allowed():
            _lock_change_log(using)
            withdrawn, orphans = _withdraw_part(using, lister, part)
            result.withdrawn += withdrawn
            result.removed += _remove_rows(using, orphans, cs=cs, actor=actor, label=label)
    return result


def withdraw_keys(
    source: Source,
    keys: np.ndarray,
    *,
    actor: Actor = None,
    change_set: ChangeSet,
    chunk_size: int = KEYS_CHUNK_SIZE,
    progress: Callable[[int], None] | None = None,
) -> WithdrawResult:
    """PostgreSQL: withdraw_rules of the rules `source` lists under `keys` (a key it
    no longer lists has none), set-based: one statement a chunk takes the listings
    away, finds the rules no other source lists and logs their removals (sorted by
    added_at, as _remove_rows does), where the rule ids were read, then the
    listings deleted and the orphans read back by three. `progress(n)`: the keys
    handled, after each chunk."""
    return _set_based(source, "key", keys, actor, change_set, chunk_size, progress)


def withdraw_ids(
    source: Source | None,
    ids: np.ndarray,
    *,
    actor: Actor = None,
    change_set: ChangeSet,
    label: str = "admin",
    chunk_size: int = KEYS_CHUNK_SIZE,
    progress: Callable[[int], None] | None = None,
) -> WithdrawResult:
    """PostgreSQL: withdraw_rules(source, ids) set-based, as withdraw_keys; with no
    `source`, remove_rules(ids) (the rules go whoever lists them, their removals
    logged under `label`). A rule already gone is not counted."""
    if source is not None:
        return _set_based(source, "rule_id", ids, actor, change_set, chunk_size, progress)
    return _set_based(None, "id", ids, actor, change_set, chunk_size, progress, label=label)


def _set_based(
    source: Source | None,
    column: str,
    values: np.ndarray,
    actor: Actor,
    change_set: ChangeSet,
    chunk_size: int,
    progress: Callable[[int], None] | None,
    *,
    label: str = "",
) -> WithdrawResult:
    """The rules whose `source` listing's `column` ("key", "rule_id") is one of
    `values` lose that listing, and go when no other source lists them; with no
    `source`, the rules whose id is one of `values` go. A chunk a transaction."""
    using = router.db_for_write(SpamRule)
    connection = connections[using]
    qn = connection.ops.quote_name
    rules, listings = qn(SpamRule._meta.db_table), qn(RuleSource._meta.db_table)
    events = qn(ChangeEvent._meta.db_table)
    if source is not None:
        # The listing of a rule by this source is still seen by the NOT EXISTS (one
        # snapshot per statement): only other sources' count.
        gone = f"""gone AS (
            DELETE FROM {listings}
            WHERE source_id = %(source)s AND {qn(column)} = ANY(%(values)s::bigint[])
            RETURNING rule_id
        ), orphan AS (
            SELECT r.id, r.expression, r.added_at, r.category, r.note
            FROM {rules} r JOIN gone g ON r.id = g.rule_id
            WHERE NOT EXISTS (SELECT 1 FROM {listings} o
                              WHERE o.rule_id = r.id AND o.source_id <> %(source)s)
        )"""
        label = _label(source)
    else:
        gone = f"""gone AS (
            SELECT id AS rule_id FROM {rules} WHERE id = ANY(%(values)s::bigint[])
        ), orphan AS (
            SELECT r.id, r.expression, r.added_at, r.category, r.note
            FROM {rules} r JOIN gone g ON r.id = g.rule_id
        )"""
    actor = row_user(actor)
    result = WithdrawResult(change_set=change_set)
    for start in range(0, len(values), chunk_size):
        part = values[start : start + chunk_size].tolist()
        with transaction.atomic(using=using), rule_writes_allowed():
            _lock_change_log(using)
            now = _db_value(using, ChangeEvent, "created", timezone.now())
            with connection.cursor() as cursor:
                cursor.execute(
                    f"""
                    WITH {gone}, logged AS (
                        INSERT INTO {events} (action, expression, added_at, category, actor_id,
                                              source, created, change_set_id, note)
                        SELECT %(remove)s, expression, added_at, category, %(actor)s, %(label)s,
                               %(now)s, %(cs)s, note
                        FROM orphan ORDER BY added_at
                        RETURNING seq
                    )
                    SELECT (SELECT count(*) FROM gone), (SELECT array_agg(id) FROM orphan),
                           (SELECT max(seq) FROM logged)
                    """,
                    {
                        "source": source.pk if source is not None else None,
                        "values": part,
                        "remove": _REMOVE,
                        "actor": actor.pk if actor else None,
                        "label": label,
                        "now": now,
                        "cs": change_set.pk,
                    },
                )
                withdrawn, orphans, last_seq = cursor.fetchone()
            if orphans:
                # The rules' other relations (a mistake report's reference) as a delete says.
                database.delete_by_pk(using, SpamRule, orphans)
                _count(change_set, removed=len(orphans))
                transaction.on_commit(partial(_nudge, last_seq), using=using)
        result.withdrawn += int(withdrawn)
        result.removed += len(orphans or ())
        if progress is not None:
            progress(start + len(part))
    return result
