"""Sources of rules (subscribed feeds and manual sources), each feed's refresh history and
held entries, and provenance: which source lists which rule."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from urlguard.models.rules import Category, SpamRule


class Source(models.Model):
    """Who lists rules: a subscribed feed (refreshed from `url`) or a manual source
    ("admin", "import", ...) whose rules a person added. A rule stays listed while any
    source lists it (RuleSource)."""

    class Kind(models.TextChoices):
        MANUAL = "manual", "Manual"
        FEED = "feed", "Feed"

    class Format(models.TextChoices):
        AUTO = "auto", "Detect"
        URLS = "urls", "Plain list (URLs, hosts, expressions)"
        HOSTS = "hosts", "Hosts file"
        ADBLOCK = "adblock", "AdBlock domain list"
        URLHAUS_CSV = "urlhaus-csv", "URLhaus CSV"
        PHISHTANK_CSV = "phishtank-csv", "PhishTank CSV"
        PHISHTANK_JSON = "phishtank-json", "PhishTank JSON"

    class Status(models.TextChoices):
        NEVER = "never", "Never refreshed"
        OK = "ok", "OK"
        NOT_MODIFIED = "not-modified", "Not modified"
        FAILED = "failed", "Failed"
        HELD = "held", "Shrink held"

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.FEED)
    url = models.CharField(max_length=2000, blank=True, default="")
    format = models.CharField(max_length=16, choices=Format.choices, default=Format.AUTO)
    category = models.CharField(max_length=16, choices=Category.choices, default=Category.SPAM)
    interval = models.PositiveIntegerField(default=3600, help_text="Refresh interval, seconds.")
    enabled = models.BooleanField(default=True)
    is_allowlist = models.BooleanField(
        default=False, help_text="Names hosts that feeds may never block as a whole."
    )
    created = models.DateTimeField(auto_now_add=True)

    # The last refresh, whatever its outcome.
    last_refresh_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_status = models.CharField(max_length=16, choices=Status.choices, default=Status.NEVER)
    last_http_status = models.IntegerField(null=True, blank=True)
    last_bytes = models.BigIntegerField(null=True, blank=True)
    last_entries = models.BigIntegerField(null=True, blank=True)
    last_added = models.BigIntegerField(null=True, blank=True)
    last_removed = models.BigIntegerField(null=True, blank=True)
    last_unchanged = models.BigIntegerField(null=True, blank=True)
    last_refused = models.BigIntegerField(null=True, blank=True)
    last_duration = models.FloatField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    failures = models.PositiveIntegerField(
        default=0, help_text="Failed refreshes in a row (0 after a success)."
    )
    # Validators of the last body applied, sent back for a conditional GET.
    etag = models.CharField(max_length=500, blank=True, default="")
    last_modified = models.CharField(max_length=100, blank=True, default="")
    # A refresh that would have removed too much: nothing was applied; these are its
    # numbers until an admin accepts it (or a later refresh no longer shrinks).
    held_at = models.DateTimeField(null=True, blank=True)
    held_entries = models.BigIntegerField(null=True, blank=True)
    held_added = models.BigIntegerField(null=True, blank=True)
    held_removed = models.BigIntegerField(null=True, blank=True)
    # Why it is held: a shrink, or more short links blocked than CONFIRM_IMPACT_LINKS.
    held_reason = models.CharField(max_length=500, blank=True, default="")
    # Set while a refresh runs (claimed by an UPDATE), so that two at once do not
    # both fetch and diff. The claim names its owner (urlguard.runtime.ownership) and its
    # owner's heartbeat: a claim whose owner is gone is taken over at once, one older
    # than FEED_CLAIM_TIMEOUT whatever its heartbeat.
    refreshing_since = models.DateTimeField(null=True, blank=True)
    refresh_owner = models.CharField(max_length=300, blank=True, default="")
    refresh_heartbeat = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_feed(self) -> bool:
        return self.kind == self.Kind.FEED


class FeedRefresh(models.Model):
    """One refresh of a feed, whatever came of it: the source's history page."""

    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="refreshes")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    status = models.CharField(max_length=16, choices=Source.Status.choices)
    http_status = models.IntegerField(null=True, blank=True)
    bytes = models.BigIntegerField(default=0)
    format = models.CharField(max_length=16, blank=True, default="")
    entries = models.BigIntegerField(default=0)
    added = models.BigIntegerField(default=0)
    removed = models.BigIntegerField(default=0)
    unchanged = models.BigIntegerField(default=0)
    refused = models.BigIntegerField(default=0)
    # Rows written: rules new to the table, rules no source lists any more.
    rules_added = models.BigIntegerField(default=0)
    rules_removed = models.BigIntegerField(default=0)
    duration = models.FloatField(default=0)
    error = models.TextField(blank=True, default="")
    change_set = models.ForeignKey(
        "ChangeSet", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # A sample of the refused entries: [line, text, reason].
    refusals = models.JSONField(default=list, blank=True)
    # Entries held for an operator's yes (FeedHold), not applied.
    held = models.BigIntegerField(default=0)
    # What its new entries blocked of the short links (urlguard.writepath.impact.Impact.as_dict).
    impact = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-pk"]

    def __str__(self) -> str:
        return f"{self.source_id} {self.at:%Y-%m-%d %H:%M} {self.status}"


class FeedHold(models.Model):
    """An entry a feed lists that the safety policy holds, as the admin's add form asks
    "yes, block it anyway" for it (urlguard.writepath.safety: a popular host, a link shortener,
    this service's own host, too many short links): not applied until an operator
    accepts it; the rest of the refresh goes on without it."""

    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="holds")
    expression = models.CharField(max_length=2000)
    key = models.BigIntegerField()  # expression_key(expression)
    category = models.CharField(max_length=16, choices=Category.choices, default=Category.SPAM)
    codes = models.CharField(max_length=200, blank=True, default="")  # comma-separated
    reasons = models.TextField(blank=True, default="")
    held_at = models.DateTimeField(auto_now_add=True)
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["source", "expression"]
        constraints = [
            models.UniqueConstraint(fields=["source", "key"], name="feedhold_source_key"),
        ]

    def __str__(self) -> str:
        return f"{self.expression} (held from source #{self.source_id})"


class RuleSource(models.Model):
    """Provenance: `source` lists `rule`. `key` is expression_key(rule.expression).

    A feed's first load writes a row per entry, so the table carries only what its
    queries need: the unique (source, rule) pair, which also reads a source's
    listings, and the index on rule, which finds a rule's (no query looks a listing
    up by its key: a refresh reads all of its source's). Neither foreign key is a
    database constraint (PostgreSQL checked each once per row written, a third of the
    load's time in the database); the code keeps both, and
    writepath.changes.dangling_references counts any row that dangles: a listing is
    written only under the change-log lock, for a rule read or written in that
    transaction and a source seen to exist under the lock (writepath.changes); a rule
    is deleted only under that lock, with its listings (models.database.delete_by_pk,
    and the ORM's cascade); a source is deleted through the ORM, whose cascade deletes
    its listings, and its deletion takes the lock first (models.changes), so no
    listing of it commits after."""

    rule = models.ForeignKey(
        SpamRule,
        on_delete=models.CASCADE,
        related_name="listings",
        db_constraint=False,
    )
    source = models.ForeignKey(
        Source,
        on_delete=models.CASCADE,
        related_name="listings",
        db_index=False,
        db_constraint=False,
    )
    key = models.BigIntegerField()
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["source", "rule"], name="urlguard_rulesource_unique")
        ]

    def __str__(self) -> str:
        return f"{self.source_id} lists {self.rule_id}"
