"""The one write path for the spam table: every addition or removal of a SpamRule
commits together with its ChangeEvent, and the nodes are nudged after the commit.

Writers are serialized (a PostgreSQL advisory lock; on SQLite, BEGIN IMMEDIATE), so
ChangeEvent.seq values commit in seq order. A node that has seen seq N therefore
never sees a smaller seq commit later, and a hole in seq can only be a rolled-back
transaction, which is safe to skip. The Celery message is only a nudge: a lost one
is caught up from the log by the periodic catch-up, so a broker that is down never
loses or refuses an edit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.db import connections, router, transaction
from django.db.models import Max
from django.utils import timezone

from urlguard.importing import ParsedLine
from urlguard.models import Category, ChangeEvent, SpamRule, now_micros, rule_writes_allowed
from urlguard.nudge import send as _nudge
from urlguard.rules import RuleError, normalize_rule

logger = logging.getLogger(__name__)

__all__ = [
    "BulkResult",
    "Refusal",
    "RuleExists",
    "add_rule",
    "add_rules",
    "remove_rule",
    "remove_rules",
    "CHUNK_SIZE",
]

# One transaction per chunk: big enough for bulk inserts to be fast, small enough
# that a writer never holds the change-log lock for long.
CHUNK_SIZE = 5000
# SQLite's historical limit on bound parameters is 999; stay under it for IN (...).
_IN_BATCH = 900
_ADD = str(ChangeEvent.Action.ADD.value)


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

    def summary(self) -> str:
        verb = "would be added" if self.dry_run else "added"
        return (
            f"{len(self.added)} {verb}, {len(self.skipped)} skipped (already listed), "
            f"{len(self.refused)} refused"
        )


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


def _actor(user: Any) -> Any:
    # The admin may pass AnonymousUser (e.g. a public report form); it is no row.
    return user if user is not None and getattr(user, "is_authenticated", False) else None


def _lock_change_log(using: str) -> None:
    ChangeEvent.objects.lock_log(using)


def _next_added_at() -> int:
    # Microseconds from the clock, bumped past the newest rule if the clock repeats
    # or stepped back: added_at is the rule's filter id and must be unique.
    newest = SpamRule.objects.aggregate(m=Max("added_at"))["m"] or 0
    return max(now_micros(), newest + 1)


def add_rule(
    text: str, *, category: str, source: str = "admin", note: str = "", user: Any = None
) -> SpamRule:
    """Normalize `text` (URL, host or expression) and list it. Raises RuleError (with
    the reason) if it cannot be a rule, RuleExists if it is already listed."""
    expression = normalize_rule(text)
    category = _check_category(category)
    using = router.db_for_write(SpamRule)
    with transaction.atomic(using=using), rule_writes_allowed():
        _lock_change_log(using)
        existing = SpamRule.objects.filter(expression=expression).first()
        if existing is not None:
            raise RuleExists(expression, existing)
        rule = SpamRule(
            expression=expression,
            category=category,
            added_at=_next_added_at(),
            source=source,
            note=note,
            added_by=_actor(user),
        )
        rule.save(force_insert=True, using=using)
        event = ChangeEvent.objects.create(
            action=ChangeEvent.Action.ADD,
            expression=expression,
            added_at=rule.added_at,
            category=category,
            actor=_actor(user),
            source=source,
        )
        transaction.on_commit(partial(_nudge, event.seq), using=using)
    return rule


def remove_rule(rule: SpamRule, *, user: Any = None, source: str = "admin") -> None:
    """Unlist `rule`. Removing a rule that is already gone is a no-op (two people
    clicking "delete" at once must not fail)."""
    using = router.db_for_write(SpamRule)
    with transaction.atomic(using=using), rule_writes_allowed():
        _lock_change_log(using)
        # Read the row again under the lock: the caller's copy may be stale.
        row = (
            SpamRule.objects.filter(pk=rule.pk).values("expression", "added_at", "category").first()
        )
        if row is None:
            logger.info("rule #%s (%s) was already removed", rule.pk, rule.expression)
            return
        SpamRule.objects.filter(pk=rule.pk).delete()
        # The removal carries the rule's own added_at: it routes to the stage that
        # took the addition, however long ago that was.
        event = ChangeEvent.objects.create(
            action=ChangeEvent.Action.REMOVE,
            expression=row["expression"],
            added_at=row["added_at"],
            category=row["category"],
            actor=_actor(user),
            source=source,
        )
        transaction.on_commit(partial(_nudge, event.seq), using=using)


def _coerce(
    item: Any, default_category: str
) -> tuple[str | None, str, str, int | None, str | None]:
    """-> (text, category, note, lineno, error) from a str, a (text, category[, note])
    tuple, or an importing.ParsedLine-like object; text None = nothing to import (a
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


def in_batches(values: list, size: int = _IN_BATCH) -> Iterator[list]:
    """`values` in slices of `size`; by default short enough for one IN (...) on
    every backend."""
    for i in range(0, len(values), size):
        yield values[i : i + size]


def existing_expressions(expressions: list[str]) -> set[str]:
    """Which of `expressions` the spam table already lists (one query per batch)."""
    found: set[str] = set()
    for batch in in_batches(expressions):
        found.update(
            SpamRule.objects.filter(expression__in=batch).values_list("expression", flat=True)
        )
    return found


def _insert(using: str, model: Any, names: tuple[str, ...], rows: list[tuple]) -> None:
    """INSERT many rows in one executemany: bulk imports spend their time here, and
    Model.bulk_create's per-object, per-value work was most of it (100,000 rules:
    27 s -> 8 s on SQLite). Rows hold database-ready values (str, int, None, and
    datetimes prepared once per chunk by _db_value)."""
    connection = connections[using]
    fields = [model._meta.get_field(name) for name in names]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    marks = ", ".join(["%s"] * len(fields))
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})", rows)


def _db_value(using: str, model: Any, name: str, value: Any) -> Any:
    return model._meta.get_field(name).get_db_prep_save(value, connections[using])


def _add_chunk(
    chunk: list[_Candidate], result: BulkResult, *, source: str, user: Any, dry_run: bool
) -> None:
    using = router.db_for_write(SpamRule)
    if dry_run:
        present = existing_expressions([c.expression for c in chunk])
        for c in chunk:
            (result.skipped if c.expression in present else result.added).append(c.expression)
        return
    with transaction.atomic(using=using), rule_writes_allowed():
        _lock_change_log(using)
        present = existing_expressions([c.expression for c in chunk])
        new = [c for c in chunk if c.expression not in present]
        result.skipped.extend(c.expression for c in chunk if c.expression in present)
        if not new:
            return
        first_id = _next_added_at()
        actor = _actor(user)
        actor_id = actor.pk if actor is not None else None
        now = _db_value(using, SpamRule, "created", timezone.now())
        ids = [first_id + i for i in range(len(new))]
        _insert(
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
                (c.expression, c.category, c.note, added_at, source, actor_id, now, now)
                for c, added_at in zip(new, ids, strict=True)
            ],
        )
        # One statement per chunk, rows in added_at order: seq follows added_at.
        _insert(
            using,
            ChangeEvent,
            ("action", "expression", "added_at", "category", "actor", "source", "created"),
            [
                (_ADD, c.expression, added_at, c.category, actor_id, source, now)
                for c, added_at in zip(new, ids, strict=True)
            ],
        )
        # Under the change-log lock, the newest seq is this chunk's last event.
        last_seq = ChangeEvent.objects.using(using).aggregate(m=Max("seq"))["m"]
        transaction.on_commit(partial(_nudge, last_seq), using=using)
        result.added.extend(c.expression for c in new)


def add_rules(
    items: Iterable[Any],
    *,
    source: str,
    user: Any = None,
    category: str = Category.SPAM,
    dry_run: bool = False,
    chunk_size: int = CHUNK_SIZE,
    progress: Callable[[int], None] | None = None,
) -> BulkResult:
    """List many rules, one transaction (and one nudge) per chunk.

    `items`: strings (listed under `category`), (text, category[, note]) tuples, or
    importing.ParsedLine objects (their `error` makes a refusal). Already listed or
    repeated expressions are skipped; bad ones are refused with the reason. With
    `dry_run` nothing is written. `progress(n)` is called with the number of input
    items handled so far after each chunk."""
    _check_category(category)
    result = BulkResult(dry_run=dry_run)
    seen: set[str] = set()
    chunk: list[_Candidate] = []
    handled = 0

    def flush() -> None:
        if chunk:
            _add_chunk(chunk, result, source=source, user=user, dry_run=dry_run)
            chunk.clear()
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
            expression = text if isinstance(item, ParsedLine) else normalize_rule(text)
            cat = _check_category(cat)
        except RuleError as exc:
            result.refused.append(Refusal(text, str(exc), lineno))
            continue
        if expression in seen:
            result.skipped.append(expression)
            continue
        seen.add(expression)
        chunk.append(_Candidate(expression, cat, note, lineno))
        if len(chunk) >= chunk_size:
            flush()
    flush()
    return result


def _pks(rules: Iterable[Any]) -> Iterator[int]:
    if hasattr(rules, "values_list"):  # a QuerySet: read only the keys, once
        yield from rules.values_list("pk", flat=True).iterator(chunk_size=CHUNK_SIZE)
        return
    for rule in rules:
        yield rule if isinstance(rule, int) else rule.pk


def remove_rules(
    rules: Iterable[Any], *, user: Any = None, source: str = "admin", chunk_size: int = CHUNK_SIZE
) -> int:
    """Unlist many rules (a QuerySet, SpamRule objects or primary keys), one
    transaction per chunk. Returns how many were removed (already gone: not counted)."""
    pks = list(_pks(rules))
    using = router.db_for_write(SpamRule)
    actor = _actor(user)
    removed = 0
    for part in in_batches(pks, chunk_size):
        with transaction.atomic(using=using), rule_writes_allowed():
            _lock_change_log(using)
            rows = []
            for batch in in_batches(part):
                rows.extend(
                    SpamRule.objects.filter(pk__in=batch)
                    .order_by("added_at")
                    .values_list("pk", "expression", "added_at", "category")
                )
            if not rows:
                continue
            for batch in in_batches(rows):
                SpamRule.objects.filter(pk__in=[r[0] for r in batch]).delete()
            events = ChangeEvent.objects.using(using).bulk_create(
                [
                    ChangeEvent(
                        action=ChangeEvent.Action.REMOVE,
                        expression=expr,
                        added_at=added_at,
                        category=cat,
                        actor=actor,
                        source=source,
                    )
                    for _, expr, added_at, cat in rows
                ]
            )
            last_seq = max((e.seq for e in events if e.seq is not None), default=None)
            if last_seq is None:
                last_seq = ChangeEvent.objects.aggregate(m=Max("seq"))["m"]
            transaction.on_commit(partial(_nudge, last_seq), using=using)
            removed += len(rows)
    return removed
