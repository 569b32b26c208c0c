"""Applying a plan (urlguard.writepath.plan): the one function through which a
refresh's diff, an import and a revert reach the spam table. It owns the bulk
strategy (on PostgreSQL the bulk loader's COPY and set-based statements, elsewhere
the chunked writes), the change set the plan's writes belong to (finishing one a
killed run left partial), the allowlist's last word on a refresh (an entry whose
host was allowlisted after the plan was made is refused here, as the allowlist acts
at once), and the progress an admin job shows: written to the job's row after each
chunk, by the apply itself, so nothing but data crosses into it.

What does not come here: a write of a rule or a few (the admin's add, edit and
delete, an allowlisting's withdrawals and releases), which must commit inside the
caller's own transaction with what else it changes, where the apply's transaction
per chunk (and the bulk loader's staging table) cannot be; the bulk delete, a
selection of ids the admin removes in chunks of its own job (changes.remove_rules);
and an import's dry run, which writes nothing."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, router

from urlguard.models import Actor, AdminJob, ChangeSet, SpamRule, database
from urlguard.writepath import allowlist, changes, changesets, listings, withdrawals
from urlguard.writepath.plan import ChangePlan, ListingPlan

logger = logging.getLogger(__name__)

__all__ = ["Applied", "apply_listing"]


@dataclass
class Applied:
    """What apply_listing wrote: its change set, the rules it added and removed, the
    entries it skipped (listed already), and (expression, category, reason) of each
    entry the allowlist refused at the last moment (counted in the change set)."""

    change_set: int | None = None
    rules_added: int = 0
    rules_removed: int = 0
    skipped: int = 0
    refused: list[tuple[str, str, str]] = field(default_factory=list)


def apply_listing(
    plan: ListingPlan | ChangePlan,
    *,
    actor: Actor = None,
    job: int | None = None,
    change_set: ChangeSet | None = None,
    applied: Applied | None = None,
) -> Applied:
    """Write `plan` in one change set: `change_set` if given (an import's or a
    revert's, opened by its caller), else one of the plan's kind (a refresh's set
    of this source that a writer now gone left partial is finished instead: the
    diff was made against what it committed). Each chunk commits with its
    change-log rows under the change-log lock, so a kill at any moment leaves a
    partial set that the run again finishes. `job`: the AdminJob whose row shows
    the step and the entries written (done of total), after each chunk. `applied`,
    if given, is filled in as the apply goes: a caller that sees it fail part way
    still knows the change set it left partial."""
    applied = applied if applied is not None else Applied()
    if change_set is not None:
        _write(plan, change_set, actor, job, applied)
    elif isinstance(plan, ChangePlan):
        with changesets.change_set(kind=plan.kind, actor=actor, reason=plan.reason) as cs:
            _write(plan, cs, actor, job, applied)
    else:
        partial = changesets.interrupted(kind=plan.kind, source=plan.source)
        if partial is not None:
            logger.warning(
                "feed %s: finishing %s, a refresh interrupted after %d added, %d removed",
                plan.source.name,
                partial,
                partial.added,
                partial.removed,
            )
        with changesets.change_set(
            kind=plan.kind, actor=actor, source=plan.source, reason=plan.reason, resume=partial
        ) as cs:
            _write(plan, cs, actor, job, applied)
    return applied


def _write(
    plan: ListingPlan | ChangePlan, cs: ChangeSet, actor: Actor, job: int | None, applied: Applied
) -> None:
    applied.change_set = cs.pk
    if isinstance(plan, ChangePlan):
        _apply_changes(plan, cs, actor, _Progress(job, plan.total), applied)
    else:
        total = plan.additions.count + len(plan.withdrawals)
        _apply_listing(plan, cs, actor, _Progress(job, total), applied)


def _apply_listing(
    plan: ListingPlan, cs: ChangeSet, actor: Actor, progress: _Progress, applied: Applied
) -> None:
    source, additions = plan.source, plan.additions
    if additions.count:
        progress("writing", 0)
        bulk = changes.add_listed(
            _still_allowed(plan, applied),
            source=source,
            actor=actor,
            change_set=cs,
            progress=lambda done: progress("adding", done),
            noted=True,
        )
        applied.rules_added = bulk.added_count
        applied.skipped = bulk.skipped_count
    if len(plan.withdrawals):
        progress("removing", additions.count)
        if _postgresql():
            progress("withdrawing", additions.count)
            withdrawn = withdrawals.withdraw_keys(
                source, plan.withdrawals, actor=actor, change_set=cs
            )
        else:
            gone = listings.rule_ids(source, plan.withdrawals, plan.listed)
            progress("withdrawing", additions.count)
            withdrawn = changes.withdraw_rules(source, gone, actor=actor, change_set=cs)
        applied.rules_removed = withdrawn.removed
    changesets.record_refused(cs, plan.refused + len(applied.refused))


def _apply_changes(
    plan: ChangePlan, cs: ChangeSet, actor: Actor, progress: _Progress, applied: Applied
) -> None:
    """A change plan: its withdrawals first (a revert takes away what its set added,
    then restores what it removed), then each label's entries."""
    sized: dict[str, Any] = {"chunk_size": plan.chunk_size} if plan.chunk_size else {}
    done = 0
    if len(plan.withdrawals):
        progress("removing", 0)
        if _postgresql():
            withdrawn = withdrawals.withdraw_ids(
                plan.withdraw_from,
                plan.withdrawals,
                actor=actor,
                change_set=cs,
                label=plan.withdraw_label,
                progress=lambda n: progress("removing", n),
                **sized,
            )
            removed = withdrawn.removed
        elif plan.withdraw_from is not None:
            ids = plan.withdrawals.tolist()
            removed = changes.withdraw_rules(
                plan.withdraw_from, ids, actor=actor, change_set=cs, **sized
            ).removed
        else:
            ids = plan.withdrawals.tolist()
            removed = changes.remove_rules(
                ids, actor=actor, source=plan.withdraw_label, change_set=cs, **sized
            )
        applied.rules_removed += removed
        done = len(plan.withdrawals)
    for entries in plan.additions:
        if not entries.count:
            continue
        progress("adding", done)
        first = done
        bulk = changes.add_listed(
            entries.rows(),
            source=entries.label,
            actor=actor,
            change_set=cs,
            progress=progress.counting("adding", first),
            noted=True,
            **sized,
        )
        applied.rules_added += bulk.added_count
        applied.skipped += bulk.skipped_count
        done += entries.count
    changesets.record_refused(cs, plan.refused)
    progress("written", done)


def _postgresql() -> bool:
    return database.postgresql(connections[router.db_for_write(SpamRule)])


class _Progress:
    """The step and the entries written, on the AdminJob row `job` (none: nowhere)."""

    def __init__(self, job: int | None, total: int):
        self.job = job
        self.total = total

    def __call__(self, step: str, done: int) -> None:
        _record_progress(self.job, step, done, self.total)

    def counting(self, step: str, first: int) -> Callable[[int], None]:
        """For a writer that counts from 0 what it handled: `first` + its count."""
        return lambda n: self(step, first + n)


def _record_progress(job: int | None, step: str, done: int, total: int) -> None:
    if job is not None:
        AdminJob.objects.filter(pk=job).update(
            done=done, total=total, message=f"{step.capitalize()}…"
        )


def _still_allowed(plan: ListingPlan, applied: Applied) -> Iterator[tuple[str, str, int, str]]:
    """The plan's additions (noted, with no note), less any whose host the allowlist
    refuses now and did not when the plan was made. The allowlist is read here,
    before the rows are: they are consumed during a COPY, when the connection can run
    no other query."""
    protected = allowlist.load()
    rows = plan.additions.rows()
    if protected.digest() == plan.allowlist_digest:
        return ((expression, category, key, "") for expression, category, key in rows)
    return _allowed(rows, protected, applied)


def _allowed(
    rows: Iterator[tuple[str, str, int]], protected: allowlist.Allowlist, applied: Applied
) -> Iterator[tuple[str, str, int, str]]:
    for expression, category, key in rows:
        reason = protected.refusal(expression)
        if reason is None:
            yield expression, category, key, ""
        else:
            applied.refused.append((expression, category, reason))
