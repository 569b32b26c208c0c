"""Short links, their generation counter and their clicks."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable

from django.db import IntegrityError, models, router, transaction
from django.utils import timezone

REDIRECT_FIELDS = frozenset({"slug", "destination", "disabled", "disabled_reason"})
# Written only by the click flush, as increments.
COUNTER_FIELDS = frozenset({"click_count", "unique_visitors"})


def _touches_redirect(fields: Iterable[str] | None) -> bool:
    return fields is None or not REDIRECT_FIELDS.isdisjoint(fields)


class ShortLinkGeneration(models.Model):
    """One row whose value grows with every committed change to what a redirect
    reads (see REDIRECT_FIELDS): each process polls it and drops its cached links
    when it moved. Bumped in the changing transaction, so it moves at the commit."""

    value = models.BigIntegerField(default=0)

    @classmethod
    def bump(cls, using: str | None = None) -> None:
        manager = cls.objects.db_manager(using)
        if not manager.filter(pk=1).update(value=models.F("value") + 1):
            # The row is made by the migration; a test that flushed the tables lost it.
            with contextlib.suppress(IntegrityError), transaction.atomic(using=manager.db):
                manager.create(pk=1, value=1)


# Set while bulk_update runs its per-batch update()s: it announces once, at the end.
_announced_by_caller: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "urlguard_link_change_announced_by_caller", default=False
)


class ShortLinkQuerySet(models.QuerySet):
    """Bulk writes that change what a redirect reads announce it (ShortLinkGeneration)
    in their own transaction (savepoint=False: no extra statements inside a caller's)."""

    def update(self, **kwargs):
        if _announced_by_caller.get() or not _touches_redirect(kwargs):
            return super().update(**kwargs)
        with transaction.atomic(using=self.db, savepoint=False):
            changed = super().update(**kwargs)
            if changed:
                ShortLinkGeneration.bump(self.db)
        return changed

    def bulk_update(self, objs, fields, *args, **kwargs):
        if not _touches_redirect(fields):
            return super().bulk_update(objs, fields, *args, **kwargs)
        with transaction.atomic(using=self.db, savepoint=False):
            token = _announced_by_caller.set(True)
            try:
                changed = super().bulk_update(objs, fields, *args, **kwargs)
            finally:
                _announced_by_caller.reset(token)
            if changed:
                ShortLinkGeneration.bump(self.db)
        return changed

    def delete(self):
        with transaction.atomic(using=self.db, savepoint=False):
            deleted = super().delete()
            if deleted[0]:
                ShortLinkGeneration.bump(self.db)
        return deleted


class ShortLink(models.Model):
    slug = models.CharField(max_length=64, unique=True)
    destination = models.CharField(max_length=4000)
    created = models.DateTimeField(auto_now_add=True)
    disabled = models.BooleanField(default=False)
    disabled_reason = models.CharField(max_length=200, blank=True, default="")
    click_count = models.PositiveBigIntegerField(default=0)
    unique_visitors = models.PositiveBigIntegerField(default=0)

    objects = ShortLinkQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"/{self.slug} → {self.destination}"

    def save(self, *args, **kwargs):
        if self._state.adding:
            # A new link is in no cache (misses are not cached): nothing to announce.
            return super().save(*args, **kwargs)
        if kwargs.get("update_fields") is None and not args:
            # The counters belong to the click flush (urlguard.shortlinks.clicks): writing back
            # the values this instance loaded would undo the clicks flushed since.
            kwargs["update_fields"] = [
                f.name
                for f in self._meta.concrete_fields
                if not f.primary_key and f.name not in COUNTER_FIELDS
            ]
        if not _touches_redirect(kwargs["update_fields"] if not args else None):
            return super().save(*args, **kwargs)
        using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
        with transaction.atomic(using=using, savepoint=False):
            super().save(*args, **kwargs)
            ShortLinkGeneration.bump(using)

    def delete(self, *args, **kwargs):
        using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
        with transaction.atomic(using=using, savepoint=False):
            deleted = super().delete(*args, **kwargs)
            ShortLinkGeneration.bump(using)
        return deleted


class Click(models.Model):
    """A raw click row; at least one per (link, visitor, hour), close duplicates dropped."""

    link = models.ForeignKey(ShortLink, on_delete=models.CASCADE, related_name="clicks")
    visitor = models.CharField(max_length=64)  # a keyed hash, never the raw address
    # The click's own time: rows are written by a later flush (urlguard.shortlinks.clicks).
    at = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return f"{self.link_id} {self.visitor} {self.at:%Y-%m-%d %H:%M}"
