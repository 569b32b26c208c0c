"""Change sets and the change log beneath every write: who wrote a set of changes,
when and why (ChangeSet), the lock that makes ChangeEvent.seq commit in seq order,
the log's rows as the writers append them, and the nudge after each commit.

Writers are serialized (a PostgreSQL advisory lock; on SQLite, BEGIN IMMEDIATE), so
ChangeEvent.seq values commit in seq order. A node that has seen seq N therefore
never sees a smaller seq commit later, and a hole in seq can only be a rolled-back
transaction, which is safe to skip. The Celery message is only a nudge: a lost one
is caught up from the log by the periodic catch-up, so a broker that is down never
loses or refuses an edit.

Every write belongs to a change set (one admin action, one import, one feed
refresh, one revert): pass `change_set=`, or open one with `with change_set(...)`
around the calls, or get a one-off set made for that call. The writes themselves
are urlguard.writepath.changes'."""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from typing import Any

from django.db import DatabaseError, connections, router, transaction
from django.db.models import Exists, F, Max, OuterRef
from django.utils import timezone

from urlguard.models import (
    Actor,
    AllowedHost,
    ChangeEvent,
    ChangeSet,
    RuleSource,
    Source,
    SpamRule,
    database,
    now_micros,
    row_user,
)
from urlguard.models.database import in_batches
from urlguard.nodesync.nudge import send as _nudge
from urlguard.runtime import ownership

__all__ = [
    "ALLOWLIST_LABEL",
    "CHUNK_SIZE",
    "change_set",
    "current_change_set",
    "dangling_references",
    "interrupted",
    "record_allowlist",
    "record_refused",
    "source_for",
]

# One transaction per chunk: big enough for bulk inserts to be fast, small enough
# that a writer never holds the change-log lock for long.
CHUNK_SIZE = 5000
# A bulk load refreshes the planner's statistics when it has added this many rules,
# then at each doubling (see _refresh_statistics).
_ANALYZE_EVERY = 20_000
_ADD = str(ChangeEvent.Action.ADD.value)
_REMOVE = str(ChangeEvent.Action.REMOVE.value)
_ALLOW = str(ChangeEvent.Action.ALLOW.value)
_UNALLOW = str(ChangeEvent.Action.UNALLOW.value)
#: The `source` of allowlist rows (the allowlist is no rule source).
ALLOWLIST_LABEL = "allowlist"

# The change set that writes without an explicit `change_set=` join (see change_set()).
_current: contextvars.ContextVar[ChangeSet | None] = contextvars.ContextVar(
    "urlguard_change_set", default=None
)


def _lock_change_log(using: str) -> None:
    ChangeEvent.objects.lock_log(using)


def _check_lister(using: str, source: Source) -> None:
    """Under the change-log lock: `source` still exists, and stays until the commit
    (its deletion takes the lock: models.changes). A listing refers to its source
    without a database constraint, so one of a deleted source must not be written."""
    if not Source.objects.using(using).filter(pk=source.pk).exists():
        raise Source.DoesNotExist(f"source {source.name!r} was deleted; nothing is listed under it")


def dangling_references(using: str | None = None) -> dict[str, int]:
    """How many rows refer to a row that is gone, per reference the database does not
    check (RuleSource.rule and .source, ChangeEvent.change_set): the code keeps them
    all, so anything but zeros is a bug. One anti-join per reference."""
    using = using or router.db_for_read(RuleSource)
    listings = RuleSource.objects.using(using)
    rules = SpamRule.objects.using(using)
    return {
        "listings of a missing rule": listings.filter(
            ~Exists(rules.filter(pk=OuterRef("rule_id")))
        ).count(),
        "listings of a missing source": listings.filter(
            ~Exists(Source.objects.using(using).filter(pk=OuterRef("source_id")))
        ).count(),
        "change-log rows of a missing change set": ChangeEvent.objects.using(using)
        .filter(change_set_id__isnull=False)
        .filter(~Exists(ChangeSet.objects.using(using).filter(pk=OuterRef("change_set_id"))))
        .count(),
    }


def _next_added_at() -> int:
    # Microseconds from the clock, bumped past the newest rule if the clock repeats
    # or stepped back: added_at is the rule's filter id and must be unique.
    newest = SpamRule.objects.aggregate(m=Max("added_at"))["m"] or 0
    return max(now_micros(), newest + 1)


# -- sources and change sets ---------------------------------------------------------

# Where a label given as `source="..."` finds its Source when no Source has that exact
# name: the part before ':' ("import:list.txt" -> "import"), made a manual source.
_MANUAL_KINDS = {"admin": ChangeSet.Kind.ADMIN, "import": ChangeSet.Kind.IMPORT}


def source_for(source: str | Source) -> Source:
    """The Source row for `source`: a Source as is; a name of one; otherwise the
    manual source named by the label's part before ':' (created on first use)."""
    if isinstance(source, Source):
        return source
    name = (source or "admin").strip()[:100] or "admin"
    found = Source.objects.filter(name=name).first()
    if found is not None:
        return found
    base = name.split(":", 1)[0].strip() or "admin"
    found, _ = Source.objects.get_or_create(name=base, defaults={"kind": Source.Kind.MANUAL})
    return found


def _label(source: str | Source) -> str:
    return source.name if isinstance(source, Source) else (source or "admin")[:200]


def current_change_set() -> ChangeSet | None:
    """The change set opened by the innermost `with change_set(...)`, if any."""
    return _current.get()


@contextmanager
def change_set(
    *,
    kind: str = ChangeSet.Kind.OTHER,
    actor: Actor = None,
    note: str = "",
    reason: str = "",
    source: str | Source | None = None,
    reverts: ChangeSet | None = None,
    resume: ChangeSet | None = None,
) -> Iterator[ChangeSet]:
    """Open a change set: every write of this module inside the block that is given
    no `change_set=` belongs to it. The row is written at once (inside the caller's
    transaction, if any); its counts grow as each chunk commits and are read back
    into the yielded object when the block ends. Until the block ends the set is
    unfinished and owned by this process (urlguard.runtime.ownership): a process that dies
    inside it leaves it partial, and `resume=` (that set) lets the work run again
    finish it in the same set."""
    owner = str(ownership.me())
    now = ownership.database_now()
    if resume is not None:
        ChangeSet.objects.filter(pk=resume.pk).update(finished=None, owner=owner, heartbeat=now)
        cs = resume
        cs.finished, cs.owner, cs.heartbeat = None, owner, now
    else:
        cs = ChangeSet.objects.create(
            kind=kind,
            actor=row_user(actor),
            note=note,
            reason=reason,
            source=source_for(source) if source is not None else None,
            reverts=reverts,
            finished=None,
            owner=owner,
            heartbeat=now,
        )
    ownership.beat_while_owned()
    token = _current.set(cs)
    completed = False
    try:
        yield cs
        completed = True
    finally:
        _current.reset(token)
        if completed:
            ChangeSet.objects.filter(pk=cs.pk, owner=owner).update(
                owner="", finished=timezone.now()
            )
            _reload_counts(cs)
        else:
            # An error leaves the set partial but nobody's (running the work again
            # finishes it at once), unless the caller's transaction is broken and
            # takes the set with it: that error is the one to see.
            with suppress(DatabaseError):
                ChangeSet.objects.filter(pk=cs.pk, owner=owner).update(owner="")
                _reload_counts(cs)


def interrupted(**filters: Any) -> ChangeSet | None:
    """The newest change set matching `filters` that was left unfinished by a writer
    now gone (urlguard.runtime.ownership): partial, for the work run again to finish. One
    reverted since is not: what it did was undone, and more would go on top."""
    sets = ChangeSet.objects.filter(finished__isnull=True, reverted_by__isnull=True, **filters)
    for cs in sets.order_by("-pk"):
        if ownership.gone_reason(cs.owner, cs.heartbeat, cs.created):
            return cs
    return None


def _reload_counts(cs: ChangeSet) -> None:
    row = (
        ChangeSet.objects.filter(pk=cs.pk)
        .values("added", "removed", "refused", "finished", "owner")
        .first()
    )
    if row is not None:  # None: the caller's transaction rolled it back
        cs.added, cs.removed, cs.refused = row["added"], row["removed"], row["refused"]
        cs.finished, cs.owner = row["finished"], row["owner"]


def _one_off(
    change_set: ChangeSet | None,
    *,
    kind: str,
    actor: Actor,
    source: Source | None,
    note: str = "",
    reason: str = "",
) -> ChangeSet:
    """`change_set`, else the open one, else a new set for this call alone."""
    if change_set is not None:
        return change_set
    current = _current.get()
    if current is not None:
        return current
    return ChangeSet.objects.create(
        kind=kind, actor=row_user(actor), source=source, note=note, reason=reason
    )


def _kind_for(label: str, default: str) -> str:
    return _MANUAL_KINDS.get(label.split(":", 1)[0], default)


def _count(cs: ChangeSet, **deltas: int) -> None:
    """Add to the set's counts in the caller's transaction (so they count what committed)."""
    deltas = {name: n for name, n in deltas.items() if n}
    if not deltas:
        return
    updated = ChangeSet.objects.filter(pk=cs.pk).update(**{k: F(k) + n for k, n in deltas.items()})
    if not updated:
        # The log's rows refer to their set without a database constraint: rows of a
        # set deleted meanwhile must not commit.
        raise ChangeSet.DoesNotExist(f"change set #{cs.pk} was deleted")
    for name, n in deltas.items():
        setattr(cs, name, getattr(cs, name) + n)


def record_refused(cs: ChangeSet, count: int) -> None:
    """Count `count` entries refused (e.g. by the allowlist) in `cs`."""
    _count(cs, refused=count)


# -- the allowlist -------------------------------------------------------------------


def record_allowlist(
    hosts: Iterable[str] | None = None,
    *,
    change_set: ChangeSet | None = None,
    actor: Actor = None,
) -> int:
    """Log what the allowlist did to `hosts` (None: every host it ever named): an
    `allow` row for a host now in force whose latest allowlist row is not one, an
    `unallow` row for a host no longer in force whose latest row is an `allow`. Call
    it in the transaction that changed the allowlist, after the change: the rows
    commit with it, so an export's position and the allowlist it reads agree.
    Idempotent (a second call writes nothing). Returns the rows written."""
    using = router.db_for_write(ChangeEvent)
    with transaction.atomic(using=using):
        _lock_change_log(using)
        logged = ChangeEvent.objects.using(using).filter(action__in=(_ALLOW, _UNALLOW))
        wanted: list[str] | None = None if hosts is None else sorted(set(hosts))
        batches: Iterable[list[str] | None] = [None] if wanted is None else in_batches(wanted)
        events: list[tuple[str, str]] = []
        for batch in batches:
            rows = AllowedHost.objects.in_force()
            if batch is not None:
                rows = rows.filter(host__in=batch)
            now_in = set(rows.values_list("host", flat=True))
            named = logged if batch is None else logged.filter(expression__in=batch)
            last: dict[str, str] = {}
            for host, action in named.order_by("seq").values_list("expression", "action"):
                last[host] = action
            candidates = set(last) | now_in if batch is None else set(batch)
            for host in sorted(candidates):
                allowed = last.get(host) == _ALLOW
                if (host in now_in) != allowed:
                    events.append((host, _UNALLOW if allowed else _ALLOW))
        if not events:
            return 0
        cs = _one_off(change_set, kind=ChangeSet.Kind.ALLOWLIST, actor=actor, source=None)
        if not ChangeSet.objects.using(using).filter(pk=cs.pk).exists():
            # As _count's check: the rows refer to their set without a constraint.
            raise ChangeSet.DoesNotExist(f"change set #{cs.pk} was deleted")
        actor = row_user(actor)
        now = _db_value(using, ChangeEvent, "created", timezone.now())
        added_at = now_micros()
        _insert_events(
            using,
            [
                (action, host, added_at, "", actor.pk if actor else None, ALLOWLIST_LABEL)
                + (now, cs.pk, "")
                for host, action in events
            ],
        )
        _nudge_after_commit(using)
    return len(events)


def _db_value(using: str, model: Any, name: str, value: Any) -> Any:
    return model._meta.get_field(name).get_db_prep_save(value, connections[using])


def _refresh_statistics(using: str) -> None:
    """ANALYZE the tables a bulk load grows. PostgreSQL plans each chunk's lookups
    (expression IN (...), rule_id IN (...)) from the tables' statistics; a table
    grown far past them is planned as a small one and sequentially scanned by every
    lookup (~35 ms each at 300,000 rules, and growing with the table)."""
    database.analyze(using, (SpamRule, RuleSource, ChangeEvent))


_EVENT_COLUMNS = (
    "action",
    "expression",
    "added_at",
    "category",
    "actor",
    "source",
    "created",
    "change_set",
    "note",
)


def _insert_events(using: str, rows: list[tuple]) -> None:
    """Append change-log rows (values in _EVENT_COLUMNS order) in one statement; seq
    follows the rows' order."""
    database.insert_rows(using, ChangeEvent, _EVENT_COLUMNS, rows)


def _nudge_after_commit(using: str) -> None:
    """Once the caller's transaction commits, tell the nodes the log grew to its
    newest row."""
    last_seq = ChangeEvent.objects.using(using).aggregate(m=Max("seq"))["m"]
    transaction.on_commit(partial(_nudge, last_seq), using=using)
