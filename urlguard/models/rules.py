"""Spam rules: the spam table itself (the source of truth), its categories, and the guard
that keeps every row write inside urlguard.writepath.changes."""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager

import mmh3
from django.conf import settings
from django.db import models

from urlguard.models.actors import actor_alias


def now_micros() -> int:
    return time.time_ns() // 1000


def expression_key(expression: str) -> int:
    """A signed 64-bit digest of a rule expression (MurmurHash3). RuleSource keeps it
    so that a refresh diffs a million entries as integers, never as a million strings
    loaded from the table (a collision, ~1e-8 at a million entries, would make one new
    entry look already listed by that source)."""
    return int(mmh3.hash64(expression, signed=True)[0])


class Category(models.TextChoices):
    PHISHING = "phishing", "Phishing"
    MALWARE = "malware", "Malware"
    SPAM = "spam", "Spam"
    UNWANTED = "unwanted", "Unwanted software"
    OTHER = "other", "Other"


# Set only inside urlguard.writepath.changes: every rule row must change together with its
# ChangeEvent, or the nodes' filters silently drift from the table.
_rule_writes_allowed: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "urlguard_rule_writes_allowed", default=False
)


class RuleWriteError(RuntimeError):
    """A SpamRule row was added, deleted or re-keyed outside urlguard.writepath.changes."""


@contextmanager
def rule_writes_allowed() -> Iterator[None]:
    """For urlguard.writepath.changes only: lets the guarded SpamRule writes through."""
    token = _rule_writes_allowed.set(True)
    try:
        yield
    finally:
        _rule_writes_allowed.reset(token)


def _refuse(what: str) -> None:
    if not _rule_writes_allowed.get():
        raise RuleWriteError(
            f"{what} on SpamRule bypasses the change log; use urlguard.writepath.changes "
            "(add_rule, remove_rule, add_rules, remove_rules)"
        )


class SpamRuleQuerySet(models.QuerySet):
    """Bulk writes that would skip the ChangeEvent are refused."""

    def update(self, **kwargs):
        _refuse("QuerySet.update()")
        return super().update(**kwargs)

    def delete(self):
        _refuse("QuerySet.delete()")
        return super().delete()

    def bulk_create(self, objs, *args, **kwargs):
        _refuse("QuerySet.bulk_create()")
        return super().bulk_create(objs, *args, **kwargs)

    def bulk_update(self, objs, fields, *args, **kwargs):
        _refuse("QuerySet.bulk_update()")
        return super().bulk_update(objs, fields, *args, **kwargs)


class SpamRule(models.Model):
    """One blocked expression, e.g. `example.com/` (domain and subdomains),
    `sub.example.com/`, `example.com/path/`, `example.com/path/page.html`.
    Write only through urlguard.writepath.changes (add_rule/remove_rule)."""

    # Unique: one row per expression, and the feeds' and imports' lookup. No query
    # reads it by LIKE prefix (the admin's search is a substring match), so migration
    # 0019 drops the `varchar_pattern_ops` index Django adds beside a unique CharField:
    # one index entry less per rule a feed writes.
    expression = models.CharField(max_length=2000, unique=True)
    category = models.CharField(max_length=16, choices=Category.choices, default=Category.SPAM)
    # The filter id (dablooms): routes the addition and later the removal to one stage.
    # From the adding host's clock: one an hour ahead puts ids an hour in the future and
    # later rules (any host) at newest + 1, so ids stay unique and rising; stages fill by
    # count and a removal finds its stage by range, then key: only "added" times run ahead.
    added_at = models.BigIntegerField(unique=True, default=now_micros)
    source = models.CharField(max_length=200, blank=True, default="admin")
    note = models.TextField(blank=True, default="")
    # No index: only a user's deletion looks rules up by it (then it scans the
    # table), and every rule a feed writes would pay an index entry for it.
    added_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    actor = actor_alias("added_by")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    objects = SpamRuleQuerySet.as_manager()

    class Meta:
        ordering = ["-added_at"]
        permissions = [("rebuild_filter", "Can rebuild the filter")]

    def __str__(self) -> str:
        return self.expression

    @classmethod
    def from_db(cls, db, field_names, values):
        obj = super().from_db(db, field_names, values)
        # Remembered so that save() can refuse a change of what the filter holds.
        if "expression" in obj.__dict__ and "added_at" in obj.__dict__:
            obj._loaded_key = (obj.expression, obj.added_at)
        return obj

    def save(self, *args, **kwargs):
        # Category, note and source may be edited in place (the filter holds only
        # expressions); a new row or a changed expression/added_at must go through
        # urlguard.writepath.changes so that a ChangeEvent records it.
        if self._state.adding:
            _refuse("creating a rule with save()")
        elif (self.expression, self.added_at) != getattr(
            self, "_loaded_key", (self.expression, self.added_at)
        ):
            _refuse("changing a rule's expression or added_at")
        return super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        _refuse("SpamRule.delete()")
        return super().delete(*args, **kwargs)
