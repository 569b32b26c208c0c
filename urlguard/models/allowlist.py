"""The allowlist: hosts feeds may not block, and the listings it kept out."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from urlguard.models.actors import actor_alias
from urlguard.models.feeds import Source
from urlguard.models.rules import Category


class AllowedHostQuerySet(models.QuerySet):
    def in_force(self) -> AllowedHostQuerySet:
        """The entries that protect their host now: a person's, and those of enabled
        allowlist feeds."""
        return self.filter(
            models.Q(source__isnull=True)
            | models.Q(source__enabled=True, source__is_allowlist=True)
        )


class AllowedHost(models.Model):
    """A host on the allowlist: feeds may not block it, or a parent domain of it, as a
    whole (rules on a path or page of it are still accepted). Entered by a person
    (`source` empty: the admin's "Allowlist", `manage.py allow_host`) or listed by an
    allowlist feed (`source`, replaced at each of its refreshes)."""

    source = models.ForeignKey(
        Source,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="allowed_hosts",
        help_text="The allowlist feed that lists it; empty for a host entered by a person.",
    )
    host = models.CharField(max_length=255)
    note = models.CharField(max_length=200, blank=True, default="")
    added_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    actor = actor_alias("added_by")
    created = models.DateTimeField(auto_now_add=True)

    objects = AllowedHostQuerySet.as_manager()

    class Meta:
        ordering = ["host"]
        verbose_name = "allowlisted host"
        verbose_name_plural = "allowlist"
        constraints = [
            models.UniqueConstraint(fields=["source", "host"], name="urlguard_allowedhost_unique"),
            models.UniqueConstraint(
                fields=["host"],
                condition=models.Q(source__isnull=True),
                name="urlguard_allowedhost_by_hand_unique",
            ),
        ]

    def __str__(self) -> str:
        return self.host


class AllowlistRefusal(models.Model):
    """A feed's listing the allowlist keeps out: `source` lists `expression` (as of its
    last applied body) but the allowlist refuses it. Kept so that a 304 or an
    unchanged body keeps it out, and so that removing the host from the allowlist
    lists it again at once, without waiting for the feed's body to change."""

    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="allowlist_refusals")
    expression = models.CharField(max_length=2000)
    category = models.CharField(max_length=16, choices=Category.choices, default=Category.SPAM)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["source", "expression"], name="urlguard_allowlistrefusal_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.source_id} lists {self.expression} (kept out by the allowlist)"
