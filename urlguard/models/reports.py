"""Visitors' mistake reports from the warning page."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from urlguard.models.changes import ChangeSet
from urlguard.models.rules import SpamRule


class MistakeReport(models.Model):
    """A visitor's "this was blocked by mistake" from the warning page: the admin's
    queue of them, each beside the rule that blocked and what became of it."""

    class Status(models.TextChoices):
        OPEN = "open", "Open"
        REMOVED = "removed", "Rule removed"
        NARROWED = "narrowed", "Rule narrowed"
        ALLOWLISTED = "allowlisted", "Host allowlisted"
        DISMISSED = "dismissed", "Dismissed"

    destination = models.CharField(max_length=4000)
    # The rule as it was when the visitor was warned (the row may be gone since).
    expression = models.CharField(max_length=2000, blank=True, default="")
    rule = models.ForeignKey(
        SpamRule, null=True, blank=True, on_delete=models.SET_NULL, related_name="reports"
    )
    email = models.EmailField(blank=True, default="")
    comment = models.TextField(blank=True, default="")
    visitor = models.CharField(max_length=64, blank=True, default="")  # a keyed hash
    created = models.DateTimeField(auto_now_add=True, db_index=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    resolved_at = models.DateTimeField(null=True, blank=True)
    # The change set that acted on it (the rule removed, narrowed, the host allowlisted).
    change_set = models.ForeignKey(
        ChangeSet, null=True, blank=True, on_delete=models.SET_NULL, related_name="reports"
    )

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"report #{self.pk}: {self.destination[:80]}"
