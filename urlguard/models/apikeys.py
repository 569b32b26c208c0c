"""Keys of the batch check API."""

from __future__ import annotations

from django.db import models


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
