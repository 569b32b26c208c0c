"""What each node reports of its filter file."""

from __future__ import annotations

from django.db import models


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


# What a redirect reads of a link (urlguard.shortlinks.linkcache caches it): a change to any
# of these, or a deletion, must reach every process's cache.
