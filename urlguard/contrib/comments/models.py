"""HeldComment: a comment urlguard held for moderation, and why (the listed links and
their categories). Points at the comment by type and key, as comments point at what
they comment on: a site's comment model may be its own."""

from __future__ import annotations

from typing import ClassVar

from django.contrib.contenttypes.models import ContentType
from django.db import models
from django.utils import timezone


class HeldComment(models.Model):
    comment_type = models.ForeignKey(ContentType, on_delete=models.CASCADE)
    comment_pk = models.CharField(max_length=64)
    held_at = models.DateTimeField(default=timezone.now)
    reason = models.TextField()

    # Named, not left to Django: type checks run on the service's settings, where this
    # optional app is not installed and the stubs' plugin adds no manager.
    objects: ClassVar[models.Manager[HeldComment]] = models.Manager()

    class Meta:
        ordering = ["-held_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["comment_type", "comment_pk"], name="one_hold_a_comment"
            )
        ]
        verbose_name = "held comment"

    def __str__(self) -> str:
        return f"comment {self.comment_pk}: {self.reason}"

    @property
    def comment(self) -> models.Model | None:
        model = self.comment_type.model_class()
        if model is None:
            return None
        return model._default_manager.filter(pk=self.comment_pk).first()
