"""The change log: one row per rule addition or removal, in seq order, grouped in change
sets (one action's worth, revertible)."""

from __future__ import annotations

from django.conf import settings
from django.db import connections, models
from django.db.models import Max
from django.db.models.signals import pre_delete
from django.dispatch import receiver
from django.utils import timezone

from urlguard.models import database
from urlguard.models.feeds import Source
from urlguard.models.rules import Category


class ChangeSet(models.Model):
    """One action's worth of change-log rows: an admin edit, an import, a feed
    refresh, a revert, a bulk delete. Counts are of what committed."""

    class Kind(models.TextChoices):
        ADMIN = "admin", "Admin edit"
        IMPORT = "import", "Import"
        REFRESH = "refresh", "Feed refresh"
        REVERT = "revert", "Revert"
        BULK_DELETE = "bulk-delete", "Bulk delete"
        ALLOWLIST = "allowlist", "Allowlist"
        OTHER = "other", "Other"

    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.OTHER)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created = models.DateTimeField(auto_now_add=True)
    note = models.TextField(blank=True, default="")
    reason = models.TextField(blank=True, default="")
    source = models.ForeignKey(
        Source, null=True, blank=True, on_delete=models.SET_NULL, related_name="change_sets"
    )
    added = models.BigIntegerField(default=0)
    removed = models.BigIntegerField(default=0)
    refused = models.BigIntegerField(default=0)
    reverts = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="reverted_by"
    )
    # None while the set's writes go on (urlguard.writepath.changes.change_set): a set left
    # unfinished by a process that died is partial, and running the work again
    # finishes it. `owner` and `heartbeat` say who writes it now (urlguard.runtime.ownership).
    finished = models.DateTimeField(null=True, blank=True, default=timezone.now)
    owner = models.CharField(max_length=300, blank=True, default="", db_index=True)
    heartbeat = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-pk"]

    def __str__(self) -> str:
        return f"Change set #{self.pk} ({self.get_kind_display().lower()})"


# The lock's key: "urlg" — one lock for every writer of the change log.
CHANGE_LOG_LOCK = 0x75726C67


class ChangeEventManager(models.Manager):
    def lock_log(self, using: str | None = None) -> None:
        """Serialize writers of the change log until the current transaction ends, so
        that seq values commit in seq order (a node that has seen seq N never sees a
        smaller one commit later)."""
        database.lock_transaction(connections[using or self.db], CHANGE_LOG_LOCK)

    def head(self) -> int:
        """The newest seq in the log (0 if empty): a primary-key lookup."""
        return int(self.get_queryset().aggregate(m=Max("seq"))["m"] or 0)


@receiver(pre_delete, sender=Source)
@receiver(pre_delete, sender=ChangeSet)
def _serialize_deletion(
    sender: type[models.Model], instance: models.Model, using: str, **_: object
):
    """A source's or a change set's deletion takes the change-log lock before the rows
    that refer to it are deleted or cleared (the ORM sends this inside its
    transaction, before any row goes): a writer holds the lock from its check that
    the source or set exists to its commit, so none of its listings or change-log
    rows commits after the deletion read them (RuleSource.source and
    ChangeEvent.change_set have no database constraint)."""
    ChangeEvent.objects.lock_log(using)


class ChangeEvent(models.Model):
    """The change log: one row per addition or removal, written in the same
    transaction as the SpamRule change. Nodes apply rows in seq order, once.

    A host entering or leaving the allowlist (`allow`, `unallow`: `expression` is the
    host) is a row too, so that the exports' positions (RPZ serial and IXFR, ABP diff
    patches) carry it; the filter holds no allowlist, and nodes pass over these rows."""

    class Action(models.TextChoices):
        ADD = "add", "Add"
        REMOVE = "remove", "Remove"
        ALLOW = "allow", "Allowlist"
        UNALLOW = "unallow", "Off the allowlist"

    seq = models.BigAutoField(primary_key=True)
    action = models.CharField(max_length=8, choices=Action.choices)
    expression = models.CharField(max_length=2000)
    added_at = models.BigIntegerField()
    category = models.CharField(max_length=16, choices=Category.choices, blank=True, default="")
    # No index: only a user's deletion looks rows up by it (then it scans the log),
    # and every row of a feed's load would pay an index entry for it.
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    source = models.CharField(max_length=200, blank=True, default="")
    created = models.DateTimeField(auto_now_add=True)
    # No foreign-key constraint: PostgreSQL would check it once per row (with the
    # listings' two, a third of a feed's load in the database). The code keeps it:
    # every row is written under the change-log lock into a set that exists (_count
    # updates the set's row in the same transaction and fails if it is gone;
    # record_allowlist checks), and a set is deleted only through the ORM, under that
    # lock (_serialize_deletion), whose SET_NULL clears its rows' references
    # (writepath.changes.dangling_references counts any that dangle).
    change_set = models.ForeignKey(
        ChangeSet,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="events",
        db_constraint=False,
    )
    # The rule's note, so that a removed rule can come back with it.
    note = models.TextField(blank=True, default="")

    objects = ChangeEventManager()

    class Meta:
        ordering = ["-seq"]
        indexes = [
            # A host's latest allowlist row, among millions of rule rows.
            models.Index(
                fields=["expression", "seq"],
                condition=models.Q(action__in=["allow", "unallow"]),
                name="urlguard_changeevent_allowlist",
            )
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.action} {self.expression}"
