"""Long operator work and its input: an admin job's state, progress, owner and result, and
the chunks of its input."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from urlguard.models.actors import actor_alias


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
    actor = actor_alias("created_by")
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
    # The process running it (urlguard.runtime.ownership) and its heartbeat: a running job
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
