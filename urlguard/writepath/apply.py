"""Applying a listing plan (urlguard.writepath.plan): the one function through which
a refresh's diff reaches the spam table. It owns the bulk strategy (on PostgreSQL
the bulk loader's COPY and set-based statements, elsewhere the chunked writes), the
change set the plan's writes belong to (finishing one a killed run left partial),
and the allowlist's last word: an entry whose host was allowlisted after the plan
was made is refused here, as the allowlist acts at once."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from django.db import connections, router

from urlguard.models import Actor, SpamRule, database
from urlguard.writepath import allowlist, changes, changesets, listings, withdrawals
from urlguard.writepath.plan import ListingPlan

logger = logging.getLogger(__name__)

__all__ = ["Applied", "apply_listing"]


@dataclass
class Applied:
    """What apply_listing wrote: its change set, the rules it added and removed,
    and (expression, category, reason) of each entry the allowlist refused at the
    last moment (counted in the change set)."""

    change_set: int | None = None
    rules_added: int = 0
    rules_removed: int = 0
    refused: list[tuple[str, str, str]] = field(default_factory=list)


def apply_listing(
    plan: ListingPlan,
    *,
    actor: Actor = None,
    progress: Callable[[str, int, int], None] | None = None,
    applied: Applied | None = None,
) -> Applied:
    """Write `plan` in one change set of its kind (a set of this source that a writer
    now gone left partial is finished instead: the diff was made against what it
    committed). Each chunk commits with its change-log rows under the change-log
    lock, so a kill at any moment leaves a partial set that the next run finishes.
    `progress(step, done, total)` is told the step and the entries written, between
    transactions. `applied`, if given, is filled in as the apply goes: a caller that
    sees it fail part way still knows the change set it left partial."""
    report = progress or (lambda step, done, total: None)
    source, additions = plan.source, plan.additions
    applied = applied if applied is not None else Applied()
    total = additions.count + len(plan.withdrawals)
    partial = changesets.interrupted(kind=plan.kind, source=source)
    if partial is not None:
        logger.warning(
            "feed %s: finishing %s, a refresh interrupted after %d added, %d removed",
            source.name,
            partial,
            partial.added,
            partial.removed,
        )
    with changesets.change_set(
        kind=plan.kind, actor=actor, source=source, reason=plan.reason, resume=partial
    ) as cs:
        applied.change_set = cs.pk
        if additions.count:
            report("writing", 0, total)
            bulk = changes.add_listed(
                _still_allowed(plan, applied),
                source=source,
                actor=actor,
                change_set=cs,
                progress=lambda done: report("adding", done, total),
            )
            applied.rules_added = bulk.added_count
        if len(plan.withdrawals):
            report("removing", additions.count, total)
            if database.postgresql(connections[router.db_for_write(SpamRule)]):
                report("withdrawing", additions.count, total)
                withdrawn = withdrawals.withdraw_keys(
                    source, plan.withdrawals, actor=actor, change_set=cs
                )
            else:
                gone = listings.rule_ids(source, plan.withdrawals, plan.listed)
                report("withdrawing", additions.count, total)
                withdrawn = changes.withdraw_rules(source, gone, actor=actor, change_set=cs)
            applied.rules_removed = withdrawn.removed
        changesets.record_refused(cs, plan.refused + len(applied.refused))
    return applied


def _still_allowed(plan: ListingPlan, applied: Applied) -> Iterator[tuple[str, str, int]]:
    """The plan's additions, less any whose host the allowlist refuses now and did
    not when the plan was made. The allowlist is read here, before the rows are: they
    are consumed during a COPY, when the connection can run no other query."""
    protected = allowlist.load()
    rows = plan.additions.rows()
    if protected.digest() == plan.allowlist_digest:
        return rows
    return _allowed(rows, protected, applied)


def _allowed(
    rows: Iterator[tuple[str, str, int]], protected: allowlist.Allowlist, applied: Applied
) -> Iterator[tuple[str, str, int]]:
    for expression, category, key in rows:
        reason = protected.refusal(expression)
        if reason is None:
            yield expression, category, key
        else:
            applied.refused.append((expression, category, reason))
