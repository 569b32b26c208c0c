"""Long operator work run off the request: a job is an AdminJob row that a thread (no
broker) or a Celery task runs, records its progress and owner in, and finishes when run
again after a crash. One module per kind: `imports` (a dry run, then the commit, a plan
applied by urlguard.writepath.apply), `deletes` (a summary with its impact, then
remove_rules), `reverts` (the impact of undoing a change set, then the revert) and
`rescans` (every short link checked again); `dispatch` says where they run."""

from __future__ import annotations

from urlguard.jobs.deletes import create_delete, delete_rules_job, start_delete
from urlguard.jobs.dispatch import dispatch as _dispatch
from urlguard.jobs.imports import (
    create_import,
    import_rules_job,
    preview_import,
    start_import,
    start_preview,
)
from urlguard.jobs.rescans import rescan_after_adding, start_rescan
from urlguard.jobs.reverts import create_revert, start_revert
from urlguard.models import AdminJob

__all__ = [
    "create_delete",
    "create_import",
    "create_revert",
    "preview_import",
    "rescan_after_adding",
    "run_again",
    "start_delete",
    "start_import",
    "start_preview",
    "start_rescan",
    "start_revert",
]


def run_again(job: AdminJob) -> bool:
    """Queue a failed import or bulk delete again (its input is kept until it is
    done): what its first run wrote stays, and the rest is written into the same
    change set. A failed revert is run again from its change set's page."""
    tasks: dict[str, object] = {"import": import_rules_job, "delete": delete_rules_job}
    task = tasks.get(job.kind)
    if task is None or job.params.get("phase") != "commit":
        return False
    claimed = AdminJob.objects.filter(pk=job.pk, state=AdminJob.State.FAILED).update(
        state=AdminJob.State.QUEUED, message="Waiting for a worker.", finished=None
    )
    if claimed:
        _dispatch(task, job.pk)
    return bool(claimed)
