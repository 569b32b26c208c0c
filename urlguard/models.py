"""The spam table (source of truth), who lists each rule (sources and provenance),
its change log grouped in change sets, short links and their clicks, and what each
node reports of its filter file."""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import mmh3
from django.conf import settings
from django.db import IntegrityError, connections, models, router, transaction
from django.db.models import Max
from django.utils import timezone


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


# Set only inside urlguard.changes: every rule row must change together with its
# ChangeEvent, or the nodes' filters silently drift from the table.
_rule_writes_allowed: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "urlguard_rule_writes_allowed", default=False
)


class RuleWriteError(RuntimeError):
    """A SpamRule row was added, deleted or re-keyed outside urlguard.changes."""


@contextmanager
def rule_writes_allowed() -> Iterator[None]:
    """For urlguard.changes only: lets the guarded SpamRule writes through."""
    token = _rule_writes_allowed.set(True)
    try:
        yield
    finally:
        _rule_writes_allowed.reset(token)


def _refuse(what: str) -> None:
    if not _rule_writes_allowed.get():
        raise RuleWriteError(
            f"{what} on SpamRule bypasses the change log; use urlguard.changes "
            "(add_rule, remove_rule, add_rules, remove_rules)"
        )


class SpamRuleQuerySet(models.QuerySet):
    """Bulk writes that would skip the ChangeEvent are refused."""

    def update(self, **kwargs):  # type: ignore[no-untyped-def]
        _refuse("QuerySet.update()")
        return super().update(**kwargs)

    def delete(self):  # type: ignore[no-untyped-def]
        _refuse("QuerySet.delete()")
        return super().delete()

    def bulk_create(self, objs, *args, **kwargs):  # type: ignore[no-untyped-def]
        _refuse("QuerySet.bulk_create()")
        return super().bulk_create(objs, *args, **kwargs)

    def bulk_update(self, objs, fields, *args, **kwargs):  # type: ignore[no-untyped-def]
        _refuse("QuerySet.bulk_update()")
        return super().bulk_update(objs, fields, *args, **kwargs)


class SpamRule(models.Model):
    """One blocked expression, e.g. `example.com/` (domain and subdomains),
    `sub.example.com/`, `example.com/path/`, `example.com/path/page.html`.
    Write only through urlguard.changes (add_rule/remove_rule)."""

    expression = models.CharField(max_length=2000, unique=True)
    category = models.CharField(max_length=16, choices=Category.choices, default=Category.SPAM)
    # The filter id (dablooms): routes the addition and later the removal to one stage.
    added_at = models.BigIntegerField(unique=True, default=now_micros)
    source = models.CharField(max_length=200, blank=True, default="admin")
    note = models.TextField(blank=True, default="")
    added_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    objects = SpamRuleQuerySet.as_manager()

    class Meta:
        ordering = ["-added_at"]
        permissions = [("rebuild_filter", "Can rebuild the filter")]

    def __str__(self) -> str:
        return self.expression

    @classmethod
    def from_db(cls, db, field_names, values):  # type: ignore[no-untyped-def]
        obj = super().from_db(db, field_names, values)
        # Remembered so that save() can refuse a change of what the filter holds.
        if "expression" in obj.__dict__ and "added_at" in obj.__dict__:
            obj._loaded_key = (obj.expression, obj.added_at)
        return obj

    def save(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        # Category, note and source may be edited in place (the filter holds only
        # expressions); a new row or a changed expression/added_at must go through
        # urlguard.changes so that a ChangeEvent records it.
        if self._state.adding:
            _refuse("creating a rule with save()")
        elif (self.expression, self.added_at) != getattr(
            self, "_loaded_key", (self.expression, self.added_at)
        ):
            _refuse("changing a rule's expression or added_at")
        return super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        _refuse("SpamRule.delete()")
        return super().delete(*args, **kwargs)


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
    # both fetch and diff. The claim names its owner (urlguard.ownership) and its
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
    # What its new entries blocked of the short links (urlguard.impact.Impact.as_dict).
    impact = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-pk"]

    def __str__(self) -> str:
        return f"{self.source_id} {self.at:%Y-%m-%d %H:%M} {self.status}"


class FeedHold(models.Model):
    """An entry a feed lists that the safety policy holds, as the admin's add form asks
    "yes, block it anyway" for it (urlguard.safety: a popular host, a link shortener,
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


class RuleSource(models.Model):
    """Provenance: `source` lists `rule`. `key` is expression_key(rule.expression)."""

    rule = models.ForeignKey(SpamRule, on_delete=models.CASCADE, related_name="listings")
    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="listings")
    key = models.BigIntegerField()
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["source", "rule"], name="urlguard_rulesource_unique")
        ]
        indexes = [models.Index(fields=["source", "key"], name="urlguard_rulesource_key")]

    def __str__(self) -> str:
        return f"{self.source_id} lists {self.rule_id}"


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
    # None while the set's writes go on (urlguard.changes.change_set): a set left
    # unfinished by a process that died is partial, and running the work again
    # finishes it. `owner` and `heartbeat` say who writes it now (urlguard.ownership).
    finished = models.DateTimeField(null=True, blank=True, default=timezone.now)
    owner = models.CharField(max_length=300, blank=True, default="", db_index=True)
    heartbeat = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-pk"]

    def __str__(self) -> str:
        return f"Change set #{self.pk} ({self.get_kind_display().lower()})"


# pg_advisory_xact_lock key: "urlg" — one lock for every writer of the change log.
CHANGE_LOG_LOCK = 0x75726C67


class ChangeEventManager(models.Manager):
    def lock_log(self, using: str | None = None) -> None:
        """Serialize writers of the change log until the current transaction ends, so
        that seq values commit in seq order (a node that has seen seq N never sees a
        smaller one commit later)."""
        connection = connections[using or self.db]
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [CHANGE_LOG_LOCK])
        # SQLite: settings make every transaction BEGIN IMMEDIATE, i.e. one writer at a time.

    def head(self) -> int:
        """The newest seq in the log (0 if empty): a primary-key lookup."""
        return int(self.get_queryset().aggregate(m=Max("seq"))["m"] or 0)


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
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    source = models.CharField(max_length=200, blank=True, default="")
    created = models.DateTimeField(auto_now_add=True)
    change_set = models.ForeignKey(
        ChangeSet, null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
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


class NodeStatus(models.Model):
    """What a node last reported of its filter file (the admin dashboard's lag column)."""

    node = models.CharField(max_length=200, unique=True)
    filter_path = models.CharField(max_length=1000)
    applied_seq = models.BigIntegerField(default=0)
    is_clean = models.BooleanField(default=True)
    info = models.JSONField(default=dict, blank=True)
    last_rebuild_at = models.DateTimeField(null=True, blank=True)
    last_rebuild_seconds = models.FloatField(null=True, blank=True)
    last_rebuild_reason = models.CharField(max_length=1000, blank=True, default="")
    # The scheduled full verify: when it last ran, how long it took, and how many
    # rules of the table it found missing from the file (then it rebuilt it).
    last_verify_at = models.DateTimeField(null=True, blank=True)
    last_verify_seconds = models.FloatField(null=True, blank=True)
    last_verify_missing = models.IntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    reported_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "node statuses"

    def __str__(self) -> str:
        return self.node


# What a redirect reads of a link (urlguard.linkcache caches it): a change to any
# of these, or a deletion, must reach every process's cache.
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

    def update(self, **kwargs):  # type: ignore[no-untyped-def]
        if _announced_by_caller.get() or not _touches_redirect(kwargs):
            return super().update(**kwargs)
        with transaction.atomic(using=self.db, savepoint=False):
            changed = super().update(**kwargs)
            if changed:
                ShortLinkGeneration.bump(self.db)
        return changed

    def bulk_update(self, objs, fields, *args, **kwargs):  # type: ignore[no-untyped-def]
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

    def delete(self):  # type: ignore[no-untyped-def]
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

    def save(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self._state.adding:
            # A new link is in no cache (misses are not cached): nothing to announce.
            return super().save(*args, **kwargs)
        if kwargs.get("update_fields") is None and not args:
            # The counters belong to the click flush (urlguard.clicks): writing back
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

    def delete(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
        with transaction.atomic(using=using, savepoint=False):
            deleted = super().delete(*args, **kwargs)
            ShortLinkGeneration.bump(using)
        return deleted


class Click(models.Model):
    """A raw click row; at least one per (link, visitor, hour), close duplicates dropped."""

    link = models.ForeignKey(ShortLink, on_delete=models.CASCADE, related_name="clicks")
    visitor = models.CharField(max_length=64)  # a keyed hash, never the raw address
    # The click's own time: rows are written by a later flush (urlguard.clicks).
    at = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return f"{self.link_id} {self.visitor} {self.at:%Y-%m-%d %H:%M}"


class StatsLoss(models.Model):
    """Statistics a node dropped because its buffer was full (urlguard.stats), per
    kind: the loss the admin and the metrics show."""

    kind = models.CharField(max_length=100)
    node = models.CharField(max_length=200)
    lost = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "node"], name="statsloss_kind_node")]
        verbose_name_plural = "statistics losses"

    def __str__(self) -> str:
        return f"{self.kind} on {self.node}: {self.lost} lost"


class AdminJob(models.Model):
    """A long admin operation (an import, a rescan) and its progress and result, so a
    request can hand the work to a Celery worker and a page can poll it; the uploaded
    text is kept here between the preview and the commit."""

    class Kind(models.TextChoices):
        IMPORT = "import", "Import"
        RESCAN = "rescan", "Rescan"
        REFRESH = "refresh", "Feed refresh"
        DELETE = "delete", "Bulk delete"
        REVERT = "revert", "Revert"
        TEST_FETCH = "test-fetch", "Test fetch"

    class State(models.TextChoices):
        PREVIEWING = "previewing", "Previewing (dry run)"
        PREVIEWED = "previewed", "Previewed (dry run)"
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    done = models.BigIntegerField(default=0)
    total = models.BigIntegerField(default=0)
    message = models.TextField(blank=True, default="")
    params = models.JSONField(default=dict, blank=True)
    payload = models.TextField(blank=True, default="")
    result = models.JSONField(default=dict, blank=True)
    # Every refused line of an import with its reason, as a file to download, fix
    # and upload again ("# line N: reason" above each line).
    refused = models.TextField(blank=True, default="")
    # The process running it (urlguard.ownership) and its heartbeat: a running job
    # whose owner is gone is marked failed, to be run again.
    owner = models.CharField(max_length=300, blank=True, default="", db_index=True)
    heartbeat = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} #{self.number} ({self.state})"

    @property
    def number(self) -> int:
        """This job's number among the jobs of its kind (the first refresh is refresh
        #1 whatever imports ran before it); the primary key stays the job's address."""
        cached = self.__dict__.get("_number")
        if cached is None:
            cached = AdminJob.objects.filter(kind=self.kind, pk__lte=self.pk).count()
            self.__dict__["_number"] = cached
        return int(cached)


class APIKey(models.Model):
    """A key of the batch check API (`Authorization: Bearer <key>`). Only a SHA-256 of
    the key is stored (keys are 256 random bits: a fast hash is enough, and a lookup
    by hash is one indexed query); the key itself is shown once, when it is made."""

    name = models.CharField(max_length=100, unique=True, help_text="Who uses this key.")
    prefix = models.CharField(
        max_length=16, editable=False, help_text="The key's first characters, to recognise it."
    )
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_used_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="Recorded at most once a minute."
    )

    class Meta:
        ordering = ["name"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


class AdminJobChunk(models.Model):
    """A piece of a job's input (an uploaded file, a list of rule ids), about a
    megabyte of whole lines each: the upload is streamed in and the job streams it
    out, so neither the serving process nor the worker holds the whole file."""

    job = models.ForeignKey(AdminJob, on_delete=models.CASCADE, related_name="chunks")
    seq = models.PositiveIntegerField()
    text = models.TextField()

    class Meta:
        ordering = ["job", "seq"]
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="adminjobchunk_seq")]

    def __str__(self) -> str:
        return f"{self.job_id}:{self.seq}"


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


class RuleHitDay(models.Model):
    """Warnings a rule caused and "continue anyway" clicks past them, per day
    (urlguard.hitlog; written in batches, kept HIT_LOG_DAYS days)."""

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
    (urlguard.hitlog; written in batches, the newest HIT_EVENTS_KEPT kept). The rule's
    expression is copied, so an event outlives its rule readable."""

    class Action(models.TextChoices):
        WARNED = "warned", "Warned"
        CONTINUED = "continued", "Continued anyway"
        API = "api", "Blocked (API answer)"

    at = models.DateTimeField(db_index=True)
    action = models.CharField(max_length=10, choices=Action.choices, default=Action.WARNED)
    # Where the redirect came from: a short link's path ("/bloom"), another page's, or
    # "API" / "API key NAME" for a check API answer.
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
