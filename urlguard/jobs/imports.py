"""The import job: a dry run of an uploaded rule list (what it would add, what it refuses,
its impact on short links), then the commit: the list planned (importing.plan_import)
and applied (urlguard.writepath.apply, the bulk loader on PostgreSQL), chunk by chunk,
resumable; the apply writes its progress to the job's row."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterable, Iterator

from django.utils import timezone

from urlguard.celery import shared_task
from urlguard.jobs.dispatch import (
    Progress,
    begin,
    dispatch,
    fail,
    iter_lines,
    previewed,
    store_chunks,
    writes_into,
    written_before,
)
from urlguard.jobs.rescans import rescan_after_adding
from urlguard.models import Actor, AdminJob, AdminJobChunk, ChangeSet, SpamRule, row_user
from urlguard.wording import counted
from urlguard.writepath import changes
from urlguard.writepath.apply import apply_listing
from urlguard.writepath.impact import impact_of_adding
from urlguard.writepath.importing import parse_rules, plan_import
from urlguard.writepath.rulelists import ParsedLine

logger = logging.getLogger(__name__)

# Expressions the dry run looks up at once.
PREVIEW_BATCH = changes.CHUNK_SIZE
# Rules per transaction of the commit; None: the apply's own (the bulk loader's on
# PostgreSQL, where a transaction of 50,000 takes about a second).
IMPORT_CHUNK: int | None = None
# Refused lines kept for the preview page; the counts cover the whole file (and the
# download holds every refused line).
MAX_REFUSED_SHOWN = 1_000


def create_import(
    texts: Iterable[str], *, default_category: str, filename: str, actor: Actor
) -> AdminJob:
    """An import job holding the uploaded text, waiting for its dry run."""
    job = AdminJob.objects.create(
        kind=AdminJob.Kind.IMPORT,
        state=AdminJob.State.QUEUED,
        created_by=row_user(actor),
        params={"filename": filename, "default_category": default_category, "phase": "preview"},
        message="Waiting for the dry run to start.",
    )
    job.total = store_chunks(job, texts)
    job.save(update_fields=["total"])
    return job


def start_preview(job: AdminJob) -> None:
    dispatch(preview_import_job, job.pk)


def preview_import(text: str, *, default_category: str, filename: str, actor: Actor) -> AdminJob:
    """create_import and its dry run, here and now (commands and tests)."""
    job = create_import([text], default_category=default_category, filename=filename, actor=actor)
    preview_import_job(job.pk)
    job.refresh_from_db()
    return job


def refused_entry(lineno: int, raw: str, error: str) -> str:
    """One refused line for the download: its reason as a comment above it, so the
    file can be fixed and uploaded again as it is."""
    reason = " ".join(error.split())
    return f"# line {lineno}: {reason}\n{raw}\n"


@shared_task(name="urlguard.admin.preview_import_job")
def preview_import_job(job_id: int) -> dict | None:
    """The dry run: sort every line into new / already present / repeated / refused and
    work out the impact of the new rules. Writes only the AdminJob row."""
    job = begin(job_id, AdminJob.Kind.IMPORT, AdminJob.State.PREVIEWING)
    if job is None:
        return None
    started = time.perf_counter()
    progress = Progress(job)
    total_lines = job.total
    new: list[str] = []
    pending: list[str] = []
    refused: list[dict] = []
    refused_file = io.StringIO()
    refused_count = repeated = present = lines = 0

    def check_pending() -> None:
        nonlocal present
        listed = changes.existing_expressions(pending)
        present += len(listed)
        new.extend(e for e in pending if e not in listed)
        pending.clear()

    try:
        for parsed in parse_rules(iter_lines(job), default_category=job.params["default_category"]):
            lines += 1
            if parsed.error is not None:
                refused_count += 1
                refused_file.write(refused_entry(parsed.lineno, parsed.raw, parsed.error))
                if len(refused) < MAX_REFUSED_SHOWN:
                    refused.append(
                        {"lineno": parsed.lineno, "raw": parsed.raw[:300], "error": parsed.error}
                    )
            elif parsed.duplicate_of is not None:
                repeated += 1
            elif parsed.expression is not None:
                pending.append(parsed.expression)
                if len(pending) >= PREVIEW_BATCH:
                    check_pending()
                    progress(parsed.lineno, total_lines)
        check_pending()
        progress(
            total_lines,
            total_lines,
            force=True,
            message="Working out the impact on the short links.",
        )
        impact = impact_of_adding(new)
    except Exception as exc:
        fail(job, exc, "The dry run failed")
        return None
    previewed(
        job,
        len(new),
        {
            "lines": lines,
            "new": len(new),
            "present": present,
            "repeated": repeated,
            "refused": refused_count,
            "refused_lines": refused,
            "refused_truncated": refused_count > len(refused),
            "sample_new": new[:20],
            "impact": impact.as_dict(),
            "preview_seconds": round(time.perf_counter() - started, 3),
        },
        refused=refused_file.getvalue(),
    )
    return {"new": len(new)}


def start_import(job: AdminJob, *, actor: Actor) -> bool:
    """Queue a previewed import (once: a second click finds it no longer previewed).
    `actor`, who commits it, is its actor from here on (the rules, the change log and
    the rescan are theirs), not whoever uploaded the file; the uploader stays in
    params["uploaded_by"]."""
    uploader = job.actor
    params = {
        **job.params,
        "phase": "commit",
        "uploaded_by": uploader.get_username() if uploader else None,
    }
    claimed = AdminJob.objects.filter(pk=job.pk, state=AdminJob.State.PREVIEWED).update(
        state=AdminJob.State.QUEUED,
        message="Waiting for a worker.",
        done=0,
        created_by=row_user(actor),
        params=params,
    )
    if claimed:
        job.actor, job.params = row_user(actor), params
        dispatch(import_rules_job, job.pk)
    return bool(claimed)


def _read(job: AdminJob) -> Iterator[ParsedLine]:
    """The job's lines the dry run did not refuse, the lines read shown on its row."""
    progress = Progress(job)
    lines = int(job.result.get("lines", 0))
    parsed_lines = parse_rules(iter_lines(job), default_category=job.params["default_category"])
    for read, parsed in enumerate(parsed_lines, start=1):
        progress(read, lines, message="Reading the file…")
        if parsed.error is None:
            yield parsed


@shared_task(name="urlguard.admin.import_rules_job")
def import_rules_job(job_id: int) -> dict | None:
    job = begin(job_id, AdminJob.Kind.IMPORT)
    if job is None:
        return None
    source = f"import:{job.params.get('filename', '')}"[:200]
    started = time.perf_counter()
    # Lines the dry run refused stay refused (they are in the download); anything
    # refused now was refused at commit time (the rules changed between).
    planned = None
    try:
        planned = plan_import(_read(job), label=source)
        planned.plan.chunk_size = IMPORT_CHUNK
        with changes.change_set(
            kind=ChangeSet.Kind.IMPORT,
            actor=job.actor,
            note=f"import #{job.number}: {job.params.get('filename', '')}"[:1000],
            source=source,
            resume=written_before(job),
        ) as change_set:
            writes_into(job, change_set)
            applied = apply_listing(
                planned.plan, actor=job.actor, job=job.pk, change_set=change_set
            )
    except Exception as exc:
        added = SpamRule.objects.filter(source=source, created__gte=job.started).count()
        job.result = {**job.result, "added": added}
        # Not re-raised: the job row carries the error to the page, and in-process
        # execution must not turn it into a traceback page.
        fail(job, exc, f"Stopped after {added} rules were added (those stay)")
        return None
    finally:
        if planned is not None:
            planned.plan.close()
    # A job run again counts what its first run added too (those it now skipped).
    earlier = change_set.added - applied.rules_added
    added = change_set.added
    repeated = planned.repeated - int(job.result.get("repeated", 0))
    skipped = applied.skipped + repeated - earlier
    refused = [str(r) for r in planned.refusals]
    rescan = rescan_after_adding(actor=job.actor, after_import=job.pk)
    job.state = AdminJob.State.DONE
    job.finished = timezone.now()
    job.done = job.total = added + max(skipped, 0)
    job.result = {
        **job.result,
        "added": added,
        "skipped": max(skipped, 0),
        "refused_at_commit": refused[:MAX_REFUSED_SHOWN],
        "import_seconds": round(time.perf_counter() - started, 3),
        "rescan_job": rescan.pk if rescan else None,
        "change_set": change_set.pk,
    }
    job.message = f"Added {counted(added, 'rule')} ({max(skipped, 0):,} already present)."
    if refused:
        job.message += f" {len(refused)} were refused at commit time."
    job.save(update_fields=["state", "finished", "done", "total", "result", "message"])
    # The input has served its purpose (the refused lines stay for the download).
    AdminJobChunk.objects.filter(job=job).delete()
    return {"added": added}
