"""The one write path for the spam table: every addition or removal of a SpamRule
commits together with its ChangeEvent, and the nodes are nudged after the commit.

Writers are serialized (a PostgreSQL advisory lock; on SQLite, BEGIN IMMEDIATE), so
ChangeEvent.seq values commit in seq order. A node that has seen seq N therefore
never sees a smaller seq commit later, and a hole in seq can only be a rolled-back
transaction, which is safe to skip. The Celery message is only a nudge: a lost one
is caught up from the log by the periodic catch-up, so a broker that is down never
loses or refuses an edit.

Every write belongs to a change set (ChangeSet: one admin action, one import, one
feed refresh, one revert): pass `change_set=`, or open one with `with change_set(...)`
around the calls, or get a one-off set made for that call. Every rule is listed by
one or more sources (RuleSource): an addition of a rule already listed only adds the
source; `withdraw_rules` takes a source's listing away and removes the rule only
when no source lists it any more; `remove_rule(s)` (the admin's delete) removes the
rule outright, whoever lists it.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from itertools import islice
from typing import Any

from django.db import DatabaseError, connections, router, transaction
from django.db.models import Exists, F, Max, OuterRef
from django.utils import timezone

from urlguard.models import (
    Actor,
    AllowedHost,
    Category,
    ChangeEvent,
    ChangeSet,
    RuleSource,
    Source,
    SpamRule,
    expression_key,
    now_micros,
    row_user,
    rule_writes_allowed,
)
from urlguard.nodesync.nudge import send as _nudge
from urlguard.runtime import database, ownership
from urlguard.runtime.database import in_batches
from urlguard.writepath.rulelists import ParsedLine
from urlguard.writepath.rules import RuleError, normalize_rule

logger = logging.getLogger(__name__)

__all__ = [
    "BulkResult",
    "Refusal",
    "RuleExists",
    "WithdrawResult",
    "add_rule",
    "add_rules",
    "add_listed",
    "change_set",
    "current_change_set",
    "dangling_references",
    "interrupted",
    "record_allowlist",
    "record_refused",
    "remove_rule",
    "remove_rules",
    "source_for",
    "withdraw_rules",
    "CHUNK_SIZE",
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


class RuleExists(RuleError):
    """The expression is already listed; `.rule` is the existing row."""

    def __init__(self, expression: str, rule: SpamRule):
        super().__init__(f"{expression} is already listed (rule #{rule.pk}, {rule.category})")
        self.expression = expression
        self.rule = rule


@dataclass(frozen=True)
class Refusal:
    text: str
    reason: str
    lineno: int | None = None

    def __str__(self) -> str:
        where = f"line {self.lineno}: " if self.lineno is not None else ""
        return f"{where}{self.text!r}: {self.reason}"


@dataclass
class BulkResult:
    """What a bulk import did (or, with dry_run, would do)."""

    added: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # already listed, or repeated in the input
    refused: list[Refusal] = field(default_factory=list)
    dry_run: bool = False
    # Of `skipped`: rules already listed by another source that this source now lists too.
    gained: int = 0
    change_set: ChangeSet | None = None
    # Of chunks written: len(added) and len(skipped), also when add_rules was told
    # not to keep the names.
    added_count: int = 0
    skipped_count: int = 0

    def summary(self) -> str:
        verb = "would be added" if self.dry_run else "added"
        return (
            f"{len(self.added)} {verb}, {len(self.skipped)} skipped (already listed), "
            f"{len(self.refused)} refused"
        )


@dataclass
class WithdrawResult:
    """What withdraw_rules did: listings taken away, and rules removed because no
    source listed them any more."""

    withdrawn: int = 0
    removed: int = 0
    change_set: ChangeSet | None = None


@dataclass(frozen=True)
class _Candidate:
    expression: str
    category: str
    note: str
    lineno: int | None


_CATEGORIES = frozenset(Category.values)


def _check_category(category: str) -> str:
    if category not in _CATEGORIES:
        raise RuleError(
            f"unknown category {category!r}; choose one of {', '.join(Category.values)}"
        )
    return str(category)  # a Category member becomes its plain value


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
    now = timezone.now()
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
    user: Actor,
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
        kind=kind, actor=row_user(user), source=source, note=note, reason=reason
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
    user: Actor = None,
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
        cs = _one_off(change_set, kind=ChangeSet.Kind.ALLOWLIST, user=user, source=None)
        if not ChangeSet.objects.using(using).filter(pk=cs.pk).exists():
            # As _count's check: the rows refer to their set without a constraint.
            raise ChangeSet.DoesNotExist(f"change set #{cs.pk} was deleted")
        actor = row_user(user)
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


# -- single writes --------------------------------------------------------------------


def add_rule(
    text: str,
    *,
    category: str,
    source: str | Source = "admin",
    note: str = "",
    user: Actor = None,
    change_set: ChangeSet | None = None,
) -> SpamRule:
    """Normalize `text` (URL, host or expression) and list it under `source`. Raises
    RuleError (with the reason) if it cannot be a rule, RuleExists if it is already
    listed (then nothing is written, the source is not added either)."""
    expression = normalize_rule(text)
    category = _check_category(category)
    label = _label(source)
    using = router.db_for_write(SpamRule)
    with transaction.atomic(using=using), rule_writes_allowed():
        _lock_change_log(using)
        existing = SpamRule.objects.filter(expression=expression).first()
        if existing is not None:
            raise RuleExists(expression, existing)
        lister = source_for(source)
        _check_lister(using, lister)
        # Made inside this transaction: a refused add leaves no empty set behind.
        cs = _one_off(
            change_set,
            kind=_kind_for(label, ChangeSet.Kind.OTHER),
            user=user,
            source=lister,
            note=note,
        )
        rule = SpamRule(
            expression=expression,
            category=category,
            added_at=_next_added_at(),
            source=label,
            note=note,
            added_by=row_user(user),
        )
        rule.save(force_insert=True, using=using)
        RuleSource.objects.create(rule=rule, source=lister, key=expression_key(expression))
        event = ChangeEvent.objects.create(
            action=ChangeEvent.Action.ADD,
            expression=expression,
            added_at=rule.added_at,
            category=category,
            actor=row_user(user),
            source=label,
            change_set=cs,
            note=note,
        )
        _count(cs, added=1)
        transaction.on_commit(partial(_nudge, event.seq), using=using)
    return rule


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


def _coerce(
    item: Any, default_category: str
) -> tuple[str | None, str, str, int | None, str | None]:
    """-> (text, category, note, lineno, error) from a str, a (text, category[, note])
    tuple, or a rulelists.ParsedLine-like object; text None = nothing to import (a
    comment or blank line)."""
    if isinstance(item, str):
        return item, default_category, "", None, None
    if isinstance(item, tuple):
        text, category, *rest = item
        return text, category or default_category, (rest[0] if rest else ""), None, None
    error = getattr(item, "error", None)
    text = getattr(item, "expression", None)
    if error:
        text = getattr(item, "raw", "") or ""
    return (
        text,
        getattr(item, "category", None) or default_category,
        getattr(item, "note", "") or "",
        getattr(item, "lineno", None),
        error,
    )


def existing_expressions(expressions: list[str]) -> set[str]:
    """Which of `expressions` the spam table already lists (one query per batch)."""
    found: set[str] = set()
    for batch in in_batches(expressions):
        found.update(
            SpamRule.objects.filter(expression__in=batch).values_list("expression", flat=True)
        )
    return found


def _db_value(using: str, model: Any, name: str, value: Any) -> Any:
    return model._meta.get_field(name).get_db_prep_save(value, connections[using])


def _list_under(using: str, source: Source, pairs: list[tuple[int, str]], now: Any) -> int:
    """Record that `source` lists these (pk, expression) rules; pairs it already
    lists are left as they are. Returns how many listings were new."""
    if not pairs:
        return 0
    connection = connections[using]
    table = connection.ops.quote_name(RuleSource._meta.db_table)
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {table} (rule_id, source_id, {connection.ops.quote_name('key')}, "
            "created) VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
            [(pk, source.pk, expression_key(expr), now) for pk, expr in pairs],
        )
        # executemany's rowcount is the sum over the statements on both backends.
        return max(cursor.rowcount, 0)


def _add_chunk(
    chunk: list[_Candidate],
    result: BulkResult,
    *,
    source: Source,
    label: str,
    user: Actor,
    dry_run: bool,
    cs: ChangeSet | None,
    keep_names: bool = True,
) -> None:
    using = router.db_for_write(SpamRule)
    if dry_run:
        present = existing_expressions([c.expression for c in chunk])
        for c in chunk:
            (result.skipped if c.expression in present else result.added).append(c.expression)
        result.added_count = len(result.added)
        result.skipped_count = len(result.skipped)
        return
    assert cs is not None
    with transaction.atomic(using=using), rule_writes_allowed():
        _lock_change_log(using)
        _check_lister(using, source)
        listed = database.map_in(SpamRule, "expression", [c.expression for c in chunk], "pk")
        new = [c for c in chunk if c.expression not in listed]
        now = _db_value(using, SpamRule, "created", timezone.now())
        if listed:
            result.skipped_count += len(listed)
            if keep_names:
                result.skipped.extend(c.expression for c in chunk if c.expression in listed)
            result.gained += _list_under(
                using, source, [(pk, expr) for expr, pk in listed.items()], now
            )
        if not new:
            return
        first_id = _next_added_at()
        actor = row_user(user)
        actor_id = actor.pk if actor is not None else None
        ids = [first_id + i for i in range(len(new))]
        database.insert_rows(
            using,
            SpamRule,
            (
                "expression",
                "category",
                "note",
                "added_at",
                "source",
                "added_by",
                "created",
                "updated",
            ),
            [
                (c.expression, c.category, c.note, added_at, label, actor_id, now, now)
                for c, added_at in zip(new, ids, strict=True)
            ],
        )
        # The ids are this chunk's alone (all above the newest rule, under the lock).
        by_id = dict(
            SpamRule.objects.using(using)
            .filter(added_at__gte=ids[0], added_at__lte=ids[-1])
            .values_list("added_at", "pk")
        )
        # New rules: no listing of them can exist yet, so a plain insert (COPY) will do.
        database.insert_rows(
            using,
            RuleSource,
            ("rule", "source", "key", "created"),
            [
                (by_id[i], source.pk, expression_key(c.expression), now)
                for c, i in zip(new, ids, strict=True)
            ],
        )
        # One statement per chunk, rows in added_at order: seq follows added_at.
        _insert_events(
            using,
            [
                (_ADD, c.expression, added_at, c.category, actor_id, label, now, cs.pk, c.note)
                for c, added_at in zip(new, ids, strict=True)
            ],
        )
        _count(cs, added=len(new))
        # Under the change-log lock, the newest seq is this chunk's last event.
        _nudge_after_commit(using)
        result.added_count += len(new)
        if keep_names:
            result.added.extend(c.expression for c in new)


def add_rules(
    items: Iterable[Any],
    *,
    source: str | Source,
    user: Actor = None,
    category: str = Category.SPAM,
    dry_run: bool = False,
    chunk_size: int = CHUNK_SIZE,
    progress: Callable[[int], None] | None = None,
    change_set: ChangeSet | None = None,
    normalized: bool = False,
    keep_names: bool = True,
) -> BulkResult:
    """List many rules under `source`, one transaction (and one nudge) per chunk.

    `items`: strings (listed under `category`), (text, category[, note]) tuples, or
    rulelists.ParsedLine objects (their `error` makes a refusal). Repeated
    expressions are skipped; already listed ones are skipped and gain `source`; bad
    ones are refused with the reason (and counted in the change set). With `dry_run`
    nothing is written. `normalized`: the texts are distinct rule expressions
    already (a feed refresh normalized and deduplicated them), so they are neither
    normalized again nor remembered to spot repeats (a million would cost ~100 MB).
    `progress(n)` is called with the number of input items handled so far after
    each chunk. `keep_names=False`: `added` and `skipped` stay empty (a million names
    cost ~100 MB); `added_count` and `skipped_count` count."""
    _check_category(category)
    result = BulkResult(dry_run=dry_run)
    seen: set[str] = set()
    chunk: list[_Candidate] = []
    handled = 0
    label = _label(source)
    lister = cs = None
    analyze_at = _ANALYZE_EVERY
    if not dry_run:
        lister = source_for(source)
        cs = _one_off(
            change_set, kind=_kind_for(label, ChangeSet.Kind.OTHER), user=user, source=lister
        )
        result.change_set = cs

    def flush() -> None:
        nonlocal analyze_at
        if chunk:
            _add_chunk(
                chunk,
                result,
                source=lister,  # type: ignore[arg-type]  # None only with dry_run
                label=label,
                user=user,
                dry_run=dry_run,
                cs=cs,
                keep_names=keep_names,
            )
            chunk.clear()
            # Rules already listed grow the listings table as new ones grow both.
            if not dry_run and result.added_count + result.skipped_count >= analyze_at:
                _refresh_statistics(router.db_for_write(SpamRule))
                analyze_at *= 2
        if progress is not None:
            progress(handled)

    for item in items:
        handled += 1
        text, cat, note, lineno, error = _coerce(item, category)
        if text is None:
            continue
        if error:
            result.refused.append(Refusal(text, str(error), lineno))
            continue
        try:
            # parse_rules already ran normalize_rule on its lines; anything else
            # (duck-typed objects included) is normalized here.
            if normalized or isinstance(item, ParsedLine):
                expression = text
            else:
                expression = normalize_rule(text)
            cat = _check_category(cat)
        except RuleError as exc:
            result.refused.append(Refusal(text, str(exc), lineno))
            continue
        if not normalized:
            if expression in seen:
                result.skipped.append(expression)
                continue
            seen.add(expression)
        chunk.append(_Candidate(expression, cat, note, lineno))
        if len(chunk) >= chunk_size:
            flush()
    flush()
    if cs is not None and result.refused:
        _count(cs, refused=len(result.refused))
    return result


# add_listed's rows per transaction on PostgreSQL: each is a few set-based statements,
# so larger than CHUNK_SIZE; still a second or so under the change-log lock.
LISTED_CHUNK_SIZE = 50_000
_STAGE_TABLE = "urlguard_listed_stage"


def add_listed(
    rows: Iterable[tuple[str, str, int]],
    *,
    source: Source,
    user: Actor = None,
    change_set: ChangeSet | None = None,
    chunk_size: int = LISTED_CHUNK_SIZE,
    progress: Callable[[int], None] | None = None,
) -> BulkResult:
    """`source` lists these (expression, category, expression_key) rows: distinct
    rule expressions already normalized, none of which it lists yet (a feed
    refresh's new entries). Like add_rules(normalized=True, keep_names=False): a new
    rule is written with its listing and its change-log row, one already listed by
    another source gains the listing, one transaction (and one nudge) per chunk.

    On PostgreSQL each chunk's rows are COPied into a temporary table, then written
    by one statement of set-based INSERTs (rules, listings, change log) joined
    against the rules table, so no row becomes a Python object on the way; elsewhere
    this is add_rules. `rows` is read in a thread of its own, the next chunk's while
    PostgreSQL writes this one (two cores at work, not one after the other): it
    must not query the database."""
    using = router.db_for_write(SpamRule)
    connection = connections[using]
    if not database.postgresql(connection):
        return add_rules(
            ((expression, category) for expression, category, _ in rows),
            source=source,
            user=user,
            change_set=change_set,
            chunk_size=chunk_size,
            progress=progress,
            normalized=True,
            keep_names=False,
        )
    result = BulkResult()
    cs = _one_off(change_set, kind=ChangeSet.Kind.OTHER, user=user, source=source)
    result.change_set = cs
    actor = row_user(user)
    stage = connection.ops.quote_name(_STAGE_TABLE)
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {stage}")
        cursor.execute(
            f"CREATE TEMPORARY TABLE {stage} (n bigint NOT NULL, expression text NOT NULL, "
            "category text NOT NULL, key bigint NOT NULL)"
        )
        handled = 0
        analyze_at = _ANALYZE_EVERY
        chunks = _Reader(rows, chunk_size)
        try:
            for chunk in chunks:
                with transaction.atomic(using=using), rule_writes_allowed():
                    # The COPY before the lock: a writer waits only for the INSERTs.
                    cursor.execute(f"TRUNCATE {stage}")
                    _copy_chunk(cursor, stage, chunk)
                    chunks.copied()
                    _lock_change_log(using)
                    _check_lister(using, source)
                    gained, added, last_seq = _add_listed_chunk(cursor, stage, source, actor, cs)
                    _count(cs, added=added)
                    if last_seq is not None:
                        transaction.on_commit(partial(_nudge, last_seq), using=using)
                handled += chunk.count
                result.added_count += added
                result.skipped_count += chunk.count - added
                result.gained += gained
                if result.added_count >= analyze_at:
                    # What each chunk's lookups read; the rest once, at the end.
                    database.analyze(using, (SpamRule,))
                    analyze_at *= 2
                if progress is not None:
                    progress(handled)
            if result.added_count >= _ANALYZE_EVERY:
                _refresh_statistics(using)
        finally:
            chunks.close()
            cursor.execute(f"DROP TABLE IF EXISTS {stage}")
    return result


# Rows per COPY text block: a chunk is read and encoded a block at a time.
_COPY_BLOCK = 10_000


@dataclass
class _Chunk:
    """One chunk of add_listed's rows, numbered from `first`, in blocks."""

    first: int
    count: int
    blocks: list[list[tuple[str, str, int]]]


def _encode(block: list[tuple[str, str, int]], first: int) -> str | list[tuple]:
    """The rows as COPY text built by one join; rows whose text would need COPY's
    escapes (a backslash, or a tab or line end inside a field: canonical expressions
    have none) stay rows, numbered, for psycopg, which escapes."""
    text = "".join(
        f"{n}\t{expression}\t{category}\t{key}\n"
        for n, (expression, category, key) in enumerate(block, start=first)
    )
    if (
        "\\" in text
        or "\r" in text
        or text.count("\t") != 3 * len(block)
        or text.count("\n") != len(block)
    ):
        return [(n, *row) for n, row in enumerate(block, start=first)]
    return text


def _copy_chunk(cursor: Any, stage: str, chunk: _Chunk) -> None:
    # Encoded here, not by the reading thread: a text block is big enough for the C
    # allocator, which keeps what a thread freed in that thread's own arena (the
    # process's RSS grew by ~10 MB that way). Reading the rows is most of the work.
    first = chunk.first
    with cursor.cursor.copy(f"COPY {stage} (n, expression, category, key) FROM STDIN") as copy:
        for block in chunk.blocks:
            encoded = _encode(block, first)
            if isinstance(encoded, str):
                copy.write(encoded)
            else:
                for row in encoded:
                    copy.write_row(row)
            first += len(block)


class _Reader:
    """`rows` in chunks of `chunk_size`, read by a thread of their own while the
    consumer has PostgreSQL write the chunk before. The thread reads one chunk per
    `copied()` call (the first one at once), so it never competes with the
    consumer's COPY for the interpreter: it works while the consumer waits on the
    database. An error in `rows` is raised to the consumer; `close()` (a consumer
    done, or stopping on an error of its own) stops the thread and waits for it."""

    def __init__(self, rows: Iterable[tuple[str, str, int]], chunk_size: int):
        self._rows = iter(rows)
        self._chunk_size = chunk_size
        self._handoff: queue.Queue[_Chunk | BaseException | None] = queue.Queue()
        self._go = threading.Semaphore(1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="urlguard-add-listed")
        self._thread.daemon = True
        self._thread.start()

    def _produce(self) -> None:
        try:
            first = 0
            while self._wait_for_turn():
                chunk = _Chunk(first, 0, [])
                while chunk.count < self._chunk_size:
                    size = min(_COPY_BLOCK, self._chunk_size - chunk.count)
                    block = list(islice(self._rows, size))
                    if not block:
                        break
                    chunk.blocks.append(block)
                    chunk.count += len(block)
                if not chunk.count:
                    break
                self._handoff.put(chunk)
                first += chunk.count
            self._handoff.put(None)
        except BaseException as exc:  # handed to the consumer, raised there
            self._handoff.put(exc)

    def _wait_for_turn(self) -> bool:
        while not self._stop.is_set():
            if self._go.acquire(timeout=0.1):
                return not self._stop.is_set()
        return False

    def __iter__(self) -> Iterator[_Chunk]:
        while True:
            item = self._handoff.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def copied(self) -> None:
        """The chunk last handed out is in PostgreSQL: read the next one."""
        self._go.release()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _add_listed_chunk(
    cursor: Any, stage: str, source: Source, actor: Any, cs: ChangeSet
) -> tuple[int, int, int | None]:
    """The rows of `stage`, inside the caller's locked transaction: (listings gained
    by rules already listed, rules added, the last change-log seq written)."""
    qn = cursor.db.ops.quote_name
    rules, listings = qn(SpamRule._meta.db_table), qn(RuleSource._meta.db_table)
    events = qn(ChangeEvent._meta.db_table)
    now = timezone.now()
    # The new rules' ids, above every rule's (we hold the lock), in the rows' order;
    # the log takes them in that order, so seq follows added_at. Each row looks its
    # rule up by the unique index (a subquery per row): as a join, PostgreSQL chose
    # to hash the whole rules table for every chunk.
    base = _next_added_at() - 1
    cursor.execute(
        f"""
        WITH chunk AS (
            SELECT s.n, s.expression, s.category, s.key,
                   (SELECT r.id FROM {rules} r WHERE r.expression = s.expression) AS rule_id
            FROM {stage} s
        ), gained AS (
            INSERT INTO {listings} (rule_id, source_id, {qn("key")}, created)
            SELECT rule_id, %(source)s, key, %(now)s FROM chunk WHERE rule_id IS NOT NULL
            ON CONFLICT DO NOTHING RETURNING 1
        ), fresh AS (
            INSERT INTO {rules} (expression, category, note, added_at, source, added_by_id,
                                 created, updated)
            SELECT expression, category, '', %(base)s + row_number() OVER (ORDER BY n),
                   %(label)s, %(actor)s, %(now)s, %(now)s
            FROM chunk WHERE rule_id IS NULL ORDER BY n
            RETURNING id, expression, added_at, category
        ), listed AS (
            INSERT INTO {listings} (rule_id, source_id, {qn("key")}, created)
            SELECT f.id, %(source)s, c.key, %(now)s
            FROM fresh f JOIN chunk c ON c.expression = f.expression
            RETURNING 1
        ), logged AS (
            INSERT INTO {events} (action, expression, added_at, category, actor_id, source,
                                  created, change_set_id, note)
            SELECT %(add)s, expression, added_at, category, %(actor)s, %(label)s, %(now)s,
                   %(cs)s, ''
            FROM fresh ORDER BY added_at
            RETURNING seq
        )
        SELECT (SELECT count(*) FROM gained), (SELECT count(*) FROM listed),
               (SELECT max(seq) FROM logged)
        """,
        {
            "source": source.pk,
            "now": now,
            "base": base,
            "label": source.name,
            "actor": actor.pk if actor is not None else None,
            "add": _ADD,
            "cs": cs.pk,
        },
    )
    gained, added, last_seq = cursor.fetchone()
    return int(gained), int(added), last_seq


def _refresh_statistics(using: str) -> None:
    """ANALYZE the tables a bulk load grows. PostgreSQL plans each chunk's lookups
    (expression IN (...), rule_id IN (...)) from the tables' statistics; a table
    grown far past them is planned as a small one and sequentially scanned by every
    lookup (~35 ms each at 300,000 rules, and growing with the table)."""
    database.analyze(using, (SpamRule, RuleSource, ChangeEvent))


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
