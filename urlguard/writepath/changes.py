"""The one write path for the spam table: every addition or removal of a SpamRule
commits together with its ChangeEvent, in a change set, and the nodes are nudged
after the commit (urlguard.writepath.changesets: the sets, the log's lock and rows).

Every rule is listed by one or more sources (RuleSource): an addition of a rule
already listed only adds the source; `withdraw_rules` takes a source's listing away
and removes the rule only when no source lists it any more; `remove_rule(s)` (the
admin's delete) removes the rule outright, whoever lists it. Many new listings of
one source at once (a refresh's, an import's, a revert's restorations, each
through urlguard.writepath.apply) go through `add_listed`, which on PostgreSQL is
the bulk loader (urlguard.writepath.bulkload).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.db import connections, router, transaction
from django.utils import timezone

from urlguard.models import (
    Actor,
    Category,
    ChangeEvent,
    ChangeSet,
    RuleSource,
    Source,
    SpamRule,
    database,
    expression_key,
    row_user,
    rule_writes_allowed,
)
from urlguard.models.database import in_batches
from urlguard.writepath import bulkload
from urlguard.writepath.changesets import (
    _ADD,
    _ANALYZE_EVERY,
    ALLOWLIST_LABEL,
    CHUNK_SIZE,
    _check_lister,
    _count,
    _db_value,
    _insert_events,
    _kind_for,
    _label,
    _lock_change_log,
    _next_added_at,
    _nudge,
    _nudge_after_commit,
    _one_off,
    _refresh_statistics,
    change_set,
    current_change_set,
    dangling_references,
    interrupted,
    record_allowlist,
    record_refused,
    source_for,
)
from urlguard.writepath.rulelists import ParsedLine
from urlguard.writepath.rules import RuleError, normalize_rule
from urlguard.writepath.withdrawals import WithdrawResult, remove_rule, remove_rules, withdraw_rules

logger = logging.getLogger(__name__)

__all__ = [
    "ALLOWLIST_LABEL",
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


def add_rule(
    text: str,
    *,
    category: str,
    source: str | Source = "admin",
    note: str = "",
    actor: Actor = None,
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
            actor=actor,
            source=lister,
            note=note,
        )
        rule = SpamRule(
            expression=expression,
            category=category,
            added_at=_next_added_at(),
            source=label,
            note=note,
            added_by=row_user(actor),
        )
        rule.save(force_insert=True, using=using)
        RuleSource.objects.create(rule=rule, source=lister, key=expression_key(expression))
        event = ChangeEvent.objects.create(
            action=ChangeEvent.Action.ADD,
            expression=expression,
            added_at=rule.added_at,
            category=category,
            actor=row_user(actor),
            source=label,
            change_set=cs,
            note=note,
        )
        _count(cs, added=1)
        transaction.on_commit(partial(_nudge, event.seq), using=using)
    return rule


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
    actor: Actor,
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
        actor = row_user(actor)
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
    actor: Actor = None,
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
            change_set, kind=_kind_for(label, ChangeSet.Kind.OTHER), actor=actor, source=lister
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
                actor=actor,
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


def add_listed(
    rows: Iterable[tuple[str, str, int]] | Iterable[tuple[str, str, int, str]],
    *,
    source: str | Source,
    actor: Actor = None,
    change_set: ChangeSet | None = None,
    chunk_size: int = bulkload.LISTED_CHUNK_SIZE,
    progress: Callable[[int], None] | None = None,
    noted: bool = False,
) -> BulkResult:
    """`source` lists these (expression, category, expression_key) rows, with
    `noted` (expression, category, expression_key, note): distinct rule expressions
    already normalized (a refresh's new entries, an import's, a revert's restored
    rules). Like add_rules(normalized=True, keep_names=False): a new rule is written
    with its listing and its change-log row, one already listed gains the listing
    (one the source lists already is skipped), one transaction (and one nudge) per
    chunk. A label `source` ("import:list.txt") names the rules and log rows; the
    Source it finds (source_for) lists them.

    On PostgreSQL this is the bulk loader (bulkload.copy_listed: COPY and set-based
    INSERTs, `rows` read in a thread of its own, so it must not query the
    database); elsewhere add_rules."""
    lister = source_for(source)
    if not noted:
        rows = ((e, c, k, "") for e, c, k in rows)  # type: ignore[misc]
    if not database.postgresql(connections[router.db_for_write(SpamRule)]):
        return add_rules(
            ((expression, category, note) for expression, category, _, note in rows),  # type: ignore[misc]
            source=source,
            actor=actor,
            change_set=change_set,
            chunk_size=chunk_size,
            progress=progress,
            normalized=True,
            keep_names=False,
        )
    cs = _one_off(change_set, kind=ChangeSet.Kind.OTHER, actor=actor, source=lister)
    loaded = bulkload.copy_listed(
        rows,  # type: ignore[arg-type]
        source=lister,
        actor=row_user(actor),
        change_set=cs,
        label=_label(source),
        chunk_size=chunk_size,
        progress=progress,
    )
    return BulkResult(
        change_set=cs,
        added_count=loaded.added,
        skipped_count=loaded.handled - loaded.added,
        gained=loaded.gained,
    )
