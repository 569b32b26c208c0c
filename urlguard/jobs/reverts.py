"""The revert job: the impact of undoing a change set, then the revert itself
(urlguard.writepath.revert), resumable."""

from __future__ import annotations

import logging

from django.utils import timezone

from urlguard.celery import shared_task
from urlguard.jobs.dispatch import (
    begin,
    dispatch,
    fail,
    previewed,
    start_commit,
)
from urlguard.models import Actor, AdminJob, ChangeSet, row_user
from urlguard.wording import counted
from urlguard.writepath import revert

logger = logging.getLogger(__name__)


def create_revert(change_set, *, actor: Actor) -> AdminJob:
    """A revert job for `change_set`, waiting for its summary."""
    job = AdminJob.objects.create(
        kind=AdminJob.Kind.REVERT,
        state=AdminJob.State.QUEUED,
        created_by=row_user(actor),
        params={"phase": "preview", "change_set": change_set.pk},
        message="Waiting for the summary to start.",
    )
    dispatch(preview_revert_job, job.pk)
    return job


@shared_task(name="urlguard.admin.preview_revert_job")
def preview_revert_job(job_id: int) -> dict | None:
    """What reverting would do: rules removed again, rules brought back, and the
    impact of both on the short links. Writes only the AdminJob row."""
    job = begin(job_id, AdminJob.Kind.REVERT, AdminJob.State.PREVIEWING)
    if job is None:
        return None
    try:
        change_set = ChangeSet.objects.get(pk=job.params["change_set"])
        plan = revert.plan_revert(change_set)
        unblocks, blocks = revert.impact_of_reverting(change_set)
    except Exception as exc:
        fail(job, exc, "The summary failed")
        return None
    previewed(
        job,
        plan.to_remove + plan.to_restore,
        {
            "to_remove": plan.to_remove,
            "to_restore": plan.to_restore,
            "unchanged": plan.unchanged,
            "remove_samples": plan.remove_samples,
            "restore_samples": plan.restore_samples,
            "unblocks": unblocks.as_dict() if plan.to_remove else None,
            "blocks": blocks.as_dict() if plan.to_restore else None,
        },
    )
    return {"to_remove": plan.to_remove, "to_restore": plan.to_restore}


def start_revert(job: AdminJob, *, reason: str = "") -> bool:
    return start_commit(job, revert_job, reason)


@shared_task(name="urlguard.admin.revert_job")
def revert_job(job_id: int) -> dict | None:

    job = begin(job_id, AdminJob.Kind.REVERT)
    if job is None:
        return None
    try:
        change_set = ChangeSet.objects.get(pk=job.params["change_set"])
        done = revert.revert_change_set(
            change_set,
            actor=job.actor,
            reason=job.params.get("reason", ""),
            job=job.pk,
        )
    except Exception as exc:
        fail(job, exc, "The revert stopped (what it changed so far stays, in its change set)")
        return None
    job.state = AdminJob.State.DONE
    job.finished = timezone.now()
    job.done = job.total
    job.result = {
        **job.result,
        "revert_change_set": done.pk,
        "added": done.added,
        "removed": done.removed,
    }
    job.message = (
        f"Reverted {change_set}: {counted(done.removed, 'rule')} removed, "
        f"{counted(done.added, 'rule')} restored (change set #{done.pk})."
    )
    job.save(update_fields=["state", "finished", "done", "result", "message"])
    return {"change_set": done.pk}
