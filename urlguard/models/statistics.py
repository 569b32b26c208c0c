"""Statistics written in batches: rule hits per day and in total, blocked hosts per day,
raw hit events, and what a node dropped because a buffer was full."""

from __future__ import annotations

from django.db import models

from urlguard.models.rules import Category, SpamRule


class StatsLoss(models.Model):
    """Statistics a node dropped because its buffer was full (urlguard.runtime.stats), per
    kind: the loss the admin and the metrics show."""

    kind = models.CharField(max_length=100)
    node = models.CharField(max_length=200)
    lost = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "node"], name="statsloss_kind_node")]
        verbose_name_plural = "statistics losses"

    def __str__(self) -> str:
        return f"{self.kind} on {self.node}: {self.lost} lost"


class RuleHitDay(models.Model):
    """Warnings a rule caused and "continue anyway" clicks past them, per day
    (urlguard.hotpath.hitlog; written in batches, kept HIT_LOG_DAYS days)."""

    rule_id = models.BigIntegerField()
    day = models.DateField(db_index=True)
    hits = models.BigIntegerField(default=0)
    continued = models.BigIntegerField(default=0)
    last_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["rule_id", "day"], name="rulehitday_key")]

    def __str__(self) -> str:
        return f"rule {self.rule_id} on {self.day}: {self.hits}"


class RuleHitTotal(models.Model):
    """A rule's hits since it was listed: the rules list's sortable columns."""

    # No database constraint: a removed rule's totals may outlive it (and the batched
    # writer must never fail on a rule deleted since the warning).
    rule = models.OneToOneField(
        SpamRule,
        primary_key=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="hit_total",
    )
    hits = models.BigIntegerField(default=0, db_index=True)
    continued = models.BigIntegerField(default=0)
    last_at = models.DateTimeField(null=True, blank=True, db_index=True)

    def __str__(self) -> str:
        return f"rule {self.rule_id}: {self.hits}"


class HostHitDay(models.Model):
    """Warnings shown per blocked host and day (the dashboard's top blocked hosts)."""

    host = models.CharField(max_length=255)
    day = models.DateField(db_index=True)
    hits = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["host", "day"], name="hosthitday_key")]

    def __str__(self) -> str:
        return f"{self.host} on {self.day}: {self.hits}"


class HitEvent(models.Model):
    """One warning shown, or one "continue anyway" past it: the hit log's events
    (urlguard.hotpath.hitlog; written in batches, the newest HIT_EVENTS_KEPT kept). The rule's
    expression is copied, so an event outlives its rule readable."""

    class Action(models.TextChoices):
        WARNED = "warned", "Warned"
        CONTINUED = "continued", "Continued anyway"
        API = "api", "Blocked (API answer)"
        TEXT = "text", "Blocked (posted text)"
        FULL_HASH = "fullhash", "Full hash (Safe Browsing)"

    at = models.DateTimeField(db_index=True)
    action = models.CharField(max_length=10, choices=Action.choices, default=Action.WARNED)
    # Where the redirect came from: a short link's path ("/bloom"), another page's, or
    # "API" / "API key NAME" for a check API answer, the form or comment for a link
    # in posted text.
    where = models.CharField(max_length=200, blank=True, default="", db_index=True)
    destination = models.CharField(max_length=2000, blank=True, default="")
    host = models.CharField(max_length=255, blank=True, default="", db_index=True)
    rule_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    expression = models.CharField(max_length=2000, blank=True, default="")
    category = models.CharField(max_length=16, choices=Category.choices, blank=True, default="")

    class Meta:
        ordering = ["-pk"]
        verbose_name = "hit"
        verbose_name_plural = "hit log"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.action} {self.host} ({self.expression})"
