"""Undo: reverting a change set applies its inverse through the same write path
(a ChangePlan handed to urlguard.writepath.apply, which takes the bulk loader's and
the set-based withdrawals' path on PostgreSQL), as a new change set of kind
"revert" that names the one it reverts. Rules the set added are withdrawn again
(removed unless another source lists them too, and only if they are still the
same rule: not removed and re-added since); rules it removed come back with their
category and note. A change set is reverted at most once.

An expression the set removed twice is restored once (the restorations are
deduplicated by expression key: two distinct expressions of one 64-bit key, ~1e-8
at a million, would restore one)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field

import numpy as np
from django.db import connections, router, transaction
from django.db.models import Exists, OuterRef

from urlguard.models import Actor, ChangeEvent, ChangeSet, SpamRule, database
from urlguard.runtime import ownership
from urlguard.writepath import changes
from urlguard.writepath.apply import apply_listing
from urlguard.writepath.impact import Impact, impact_of_adding, impact_of_removing
from urlguard.writepath.plan import ChangePlan, Entries

__all__ = ["RevertError", "RevertPlan", "change_plan", "plan_revert", "revert_change_set"]

logger = logging.getLogger(__name__)

BATCH = changes.CHUNK_SIZE
SAMPLES = 20


class RevertError(ValueError):
    """This change set cannot be reverted; the message says why."""


@dataclass
class RevertPlan:
    """What reverting a change set would do."""

    change_set: ChangeSet
    to_remove: int = 0  # rules the set added that are still there
    to_restore: int = 0  # rules the set removed that are not listed again
    unchanged: int = 0  # events whose rule changed since (nothing to undo)
    remove_samples: list[str] = field(default_factory=list)
    restore_samples: list[str] = field(default_factory=list)
    # The interrupted revert this one finishes (what it undid is counted in
    # `unchanged`: there is nothing left to undo for those).
    resumes: ChangeSet | None = None


def check_revertible(change_set: ChangeSet) -> ChangeSet | None:
    """Raise RevertError if `change_set` was reverted, or a revert of it is running;
    return the revert of it that was interrupted (its writer gone), which reverting
    again resumes, or None. A set still being written is not reverted yet."""
    if change_set.finished is None and not ownership.gone_reason(
        change_set.owner, change_set.heartbeat, change_set.created
    ):
        raise RevertError(
            f"{change_set} is still being written ({ownership.describe(change_set.owner)}); "
            "revert it when it is done"
        )
    for done in ChangeSet.objects.filter(reverts=change_set).order_by("pk"):
        if done.finished is not None:
            raise RevertError(
                f"{change_set} was already reverted by {done} ({done.created:%Y-%m-%d %H:%M})"
            )
        if not ownership.gone_reason(done.owner, done.heartbeat, done.created):
            raise RevertError(
                f"{change_set} is being reverted by {done} "
                f"({ownership.describe(done.owner)}, since {done.created:%Y-%m-%d %H:%M})"
            )
        return done
    return None


def _events(
    change_set: ChangeSet, action: str, *, label: str | None = None
) -> Iterator[list[ChangeEvent]]:
    """The set's events of `action` (and of source `label`, if given) in seq order, a
    batch at a time, each batch read
    whole: a cursor kept open across the revert's writes would hold an SQLite read
    snapshot, and the first write after another connection's (a heartbeat, a node's
    status) would fail at once with "database is locked"."""
    last = 0
    events = ChangeEvent.objects.filter(change_set=change_set, action=action)
    if label is not None:
        events = events.filter(source=label)
    while True:
        batch = list(
            events.filter(seq__gt=last)
            .order_by("seq")
            .only("seq", "expression", "added_at", "category", "note", "source")[:BATCH]
        )
        if not batch:
            return
        yield batch
        last = batch[-1].seq


def _still_added(batch: list[ChangeEvent]) -> dict[int, str]:
    """pk -> expression of the rules these add events created that are still there."""
    found: dict[int, str] = {}
    for part in database.in_batches(batch):
        wanted = {(e.expression, e.added_at) for e in part}
        for pk, expression, added_at in SpamRule.objects.filter(
            expression__in=[e.expression for e in part]
        ).values_list("pk", "expression", "added_at"):
            if (expression, added_at) in wanted:
                found[pk] = expression
    return found


def _not_listed(batch: list[ChangeEvent]) -> list[ChangeEvent]:
    listed = changes.existing_expressions([e.expression for e in batch])
    seen: set[str] = set()
    out = []
    for event in batch:
        if event.expression not in listed and event.expression not in seen:
            seen.add(event.expression)
            out.append(event)
    return out


def plan_revert(change_set: ChangeSet) -> RevertPlan:
    plan = RevertPlan(change_set, resumes=check_revertible(change_set))
    for batch in _events(change_set, ChangeEvent.Action.ADD):
        still = _still_added(batch)
        plan.to_remove += len(still)
        plan.unchanged += len(batch) - len(still)
        plan.remove_samples.extend(list(still.values())[: SAMPLES - len(plan.remove_samples)])
    for batch in _events(change_set, ChangeEvent.Action.REMOVE):
        back = _not_listed(batch)
        plan.to_restore += len(back)
        plan.unchanged += len(batch) - len(back)
        plan.restore_samples.extend(
            e.expression for e in back[: SAMPLES - len(plan.restore_samples)]
        )
    return plan


def expressions_of(change_set: ChangeSet, action: str) -> Iterator[str]:
    for batch in _events(change_set, action):
        yield from (e.expression for e in batch)


def impact_of_reverting(change_set: ChangeSet) -> tuple[Impact, Impact]:
    """What reverting `change_set` does to the short links: what removing its additions
    unblocks, and what bringing back its removals blocks."""
    return (
        impact_of_removing(expressions_of(change_set, ChangeEvent.Action.ADD)),
        impact_of_adding(expressions_of(change_set, ChangeEvent.Action.REMOVE)),
    )


def change_plan(change_set: ChangeSet) -> ChangePlan:
    """Reverting `change_set` as data for the apply: the ids of the rules it added
    that are still the same rules (withdrawn from its source, or removed if it had
    none), and per label the rules it removed that nothing lists now (restored with
    their category and note). What an interrupted revert undid already is no longer
    either. Each is one query, read to an array or to entry files on disk, and
    finished before the apply writes (see _events)."""
    plan = ChangePlan(
        kind=ChangeSet.Kind.REVERT,
        withdrawals=_still_added_ids(change_set),
        withdraw_from=change_set.source,
    )
    try:
        removed = ChangeEvent.objects.filter(
            change_set=change_set, action=ChangeEvent.Action.REMOVE
        )
        unlisted = removed.exclude(
            Exists(SpamRule.objects.filter(expression=OuterRef("expression")))
        )
        for label in sorted(set(removed.values_list("source", flat=True).distinct())):
            rows = (
                unlisted.filter(source=label)
                .order_by("seq")
                .values_list("expression", "category", "note")
                .iterator(chunk_size=BATCH)
            )
            plan.additions.append(
                Entries.of(label or "admin", ((e, c or "spam", n) for e, c, n in rows))
            )
    except BaseException:
        plan.close()
        raise
    return plan


def _still_added_ids(change_set: ChangeSet) -> np.ndarray:
    """The ids of the rules `change_set` added that are still there (the same
    expression and added_at), in the order it added them."""
    connection = connections[router.db_for_read(ChangeEvent)]
    qn = connection.ops.quote_name
    events, rules = qn(ChangeEvent._meta.db_table), qn(SpamRule._meta.db_table)
    parts = []
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT r.id FROM {events} e JOIN {rules} r ON r.expression = e.expression "
            "AND r.added_at = e.added_at WHERE e.change_set_id = %s AND e.action = %s "
            "ORDER BY e.seq",
            [change_set.pk, str(ChangeEvent.Action.ADD)],
        )
        while rows := cursor.fetchmany(BATCH):
            parts.append(np.array([row[0] for row in rows], dtype=np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def revert_change_set(
    change_set: ChangeSet,
    *,
    actor: Actor = None,
    reason: str = "",
    job: int | None = None,
) -> ChangeSet:
    """Apply the inverse of `change_set` (change_plan, through the apply); returns
    the new change set (kind "revert"). A revert of it that was interrupted is
    finished instead, in its own change set: what it undid already is skipped (a
    rule it removed is no longer the set's rule to remove, a rule it restored is
    listed). `job`: the AdminJob whose row shows the progress."""
    using = router.db_for_write(ChangeSet)
    with ExitStack() as stack:
        # Checked and claimed under the change-log lock: two reverts started at once
        # cannot both pass the check.
        with transaction.atomic(using=using):
            ChangeEvent.objects.lock_log(using)
            partial = check_revertible(change_set)
            revert = stack.enter_context(
                changes.change_set(
                    kind=ChangeSet.Kind.REVERT,
                    actor=actor,
                    reverts=change_set,
                    reason=reason,
                    note=f"revert of {change_set}",
                    source=change_set.source,
                    resume=partial,
                )
            )
        if partial is not None:
            logger.warning(
                "finishing %s, interrupted after %d removed and %d restored",
                partial,
                partial.removed,
                partial.added,
            )
        plan = change_plan(change_set)
        stack.callback(plan.close)
        apply_listing(plan, actor=actor, job=job, change_set=revert)
    return revert
