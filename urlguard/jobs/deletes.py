"""The bulk delete job: a summary of the selected rules with its impact, then their removal
through urlguard.writepath.changes.remove_rules, chunk by chunk, resumable."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.utils import timezone

from urlguard.celery import shared_task
from urlguard.jobs.dispatch import (
    Progress,
    begin,
    dispatch,
    fail,
    iter_lines,
    previewed,
    start_commit,
    store_chunks,
    writes_into,
    written_before,
)
from urlguard.models import (
    Actor,
    AdminJob,
    AdminJobChunk,
    ChangeSet,
    SpamRule,
    database,
    row_user,
)
from urlguard.wording import counted
from urlguard.writepath import changes
from urlguard.writepath.impact import impact_of_removing

logger = logging.getLogger(__name__)

# Rules removed per transaction (one change-log chunk, one filter update).
DELETE_CHUNK = changes.CHUNK_SIZE
# Rules a bulk delete shows by name on its summary page.
DELETE_SAMPLES = 20


def create_delete(rules, *, actor: Actor) -> AdminJob:
    """A bulk-delete job for the rules (a QuerySet or primary keys), waiting for its
    summary. Only the keys are read here: a million of them is a few megabytes."""
    pks = (
        rules.values_list("pk", flat=True).iterator(chunk_size=20_000)
        if hasattr(rules, "values_list")
        else iter(rules)
    )
    job = AdminJob.objects.create(
        kind=AdminJob.Kind.DELETE,
        state=AdminJob.State.QUEUED,
        created_by=row_user(actor),
        params={"phase": "preview"},
        message="Waiting for the summary to start.",
    )
    job.total = store_chunks(job, (f"{pk}\n" for pk in pks))
    job.save(update_fields=["total"])
    dispatch(preview_delete_job, job.pk)
    return job


def _job_pks(job: AdminJob) -> Iterator[list[int]]:
    batch: list[int] = []
    for line in iter_lines(job):
        batch.append(int(line))
        if len(batch) >= DELETE_CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch


@shared_task(name="urlguard.admin.preview_delete_job")
def preview_delete_job(job_id: int) -> dict | None:
    """The summary of a bulk delete: how many rules (still there), a sample of them by
    name, and what removing them unblocks. Writes only the AdminJob row."""
    job = begin(job_id, AdminJob.Kind.DELETE, AdminJob.State.PREVIEWING)
    if job is None:
        return None
    progress = Progress(job)
    expressions: list[str] = []
    categories: dict[str, int] = {}
    samples: list[dict] = []
    try:
        for batch in _job_pks(job):
            for part in database.in_batches(batch):
                for pk, expression, category in SpamRule.objects.filter(pk__in=part).values_list(
                    "pk", "expression", "category"
                ):
                    expressions.append(expression)
                    categories[category] = categories.get(category, 0) + 1
                    if len(samples) < DELETE_SAMPLES:
                        samples.append({"id": pk, "expression": expression, "category": category})
            progress(len(expressions), job.total)
        progress(
            job.total, job.total, force=True, message="Working out the impact on the short links."
        )
        impact = impact_of_removing(expressions)
    except Exception as exc:
        fail(job, exc, "The summary failed")
        return None
    previewed(
        job,
        len(expressions),
        {
            "rules": len(expressions),
            "categories": categories,
            "samples": samples,
            "impact": impact.as_dict(),
        },
    )
    return {"rules": len(expressions)}


def start_delete(job: AdminJob, *, reason: str = "") -> bool:
    return start_commit(job, delete_rules_job, reason)


@shared_task(name="urlguard.admin.delete_rules_job")
def delete_rules_job(job_id: int) -> dict | None:
    job = begin(job_id, AdminJob.Kind.DELETE)
    if job is None:
        return None
    progress = Progress(job)
    removed = handled = 0
    try:
        with changes.change_set(
            kind=ChangeSet.Kind.BULK_DELETE,
            actor=job.actor,
            reason=job.params.get("reason", ""),
            note=f"bulk delete #{job.number}",
            resume=written_before(job),
        ) as change_set:
            writes_into(job, change_set)
            removed = change_set.removed  # by a first run that stopped
            for batch in _job_pks(job):
                removed += changes.remove_rules(
                    batch, actor=job.actor, source="admin", change_set=change_set
                )
                handled += len(batch)
                progress(handled, job.total)
    except Exception as exc:
        job.done = handled
        job.result = {**job.result, "removed": removed}
        fail(job, exc, f"Stopped after {removed} rules were removed (those stay removed)")
        return None
    job.state = AdminJob.State.DONE
    job.finished = timezone.now()
    job.done = job.total
    job.result = {**job.result, "removed": removed, "change_set": change_set.pk}
    job.message = f"Removed {counted(removed, 'rule')}."
    gone = job.total - removed
    if gone:
        job.message += f" {gone:,} were already gone."
    job.save(update_fields=["state", "finished", "done", "result", "message"])
    AdminJobChunk.objects.filter(job=job).delete()
    return {"removed": removed}
