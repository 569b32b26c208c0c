"""Long admin operations as AdminJob rows: an import (preview = dry run, then commit
in chunks through urlguard.changes.add_rules) and a rescan of the short links.
Each runs as a Celery task: in-process on the embedded default, on a worker when a
broker is configured, with progress written to the row for the page to poll."""

from __future__ import annotations

import io
import json
import logging
import time

from celery import shared_task
from django.db import transaction
from django.utils import timezone

from urlguard import changes
from urlguard.admin.pages import counted
from urlguard.impact import impact_of_adding
from urlguard.importing import parse_rules
from urlguard.models import AdminJob
from urlguard.rescan import rescan_links

logger = logging.getLogger(__name__)

# Rules handed to changes.add_rules per transaction. Each chunk is one transaction
# and one filter update: big enough to amortise both, small enough that progress
# moves every second or so and a failure loses at most one chunk's work.
IMPORT_CHUNK = changes.CHUNK_SIZE
# Refused lines kept for the preview page; the counts cover the whole file.
MAX_REFUSED_SHOWN = 1_000
# How often a running job writes its progress (a write per chunk would be noise).
PROGRESS_EVERY_SECONDS = 0.5


def preview_import(text: str, *, default_category: str, filename: str, user) -> AdminJob:
    """Parse the upload and sort every line into new / already present / repeated /
    refused. Writes only the AdminJob row (the dry run changes no rule): the new
    rules wait in its payload for commit_import."""
    started = time.perf_counter()
    new: dict[str, tuple[str, str]] = {}  # expression -> (category, note)
    refused: list[dict] = []
    refused_file = io.StringIO()
    refused_count = repeated = lines = 0
    for parsed in parse_rules(text.splitlines(), default_category=default_category):
        lines += 1
        if parsed.error is not None:
            refused_count += 1
            refused_file.write(refused_entry(parsed.lineno, parsed.raw, parsed.error))
            if len(refused) < MAX_REFUSED_SHOWN:
                refused.append(
                    {"lineno": parsed.lineno, "raw": parsed.raw[:300], "error": parsed.error}
                )
        elif parsed.duplicate_of is not None or parsed.expression in new:
            repeated += 1
        elif parsed.expression is not None:
            new[parsed.expression] = (parsed.category, parsed.note)
    listed = changes.existing_expressions(list(new))
    for expression in listed:
        del new[expression]
    present = len(listed)
    impact = impact_of_adding(new)
    job = AdminJob.objects.create(
        kind=AdminJob.Kind.IMPORT,
        state=AdminJob.State.PREVIEWED,
        created_by=user,
        total=len(new),
        params={"filename": filename, "default_category": default_category},
        payload=json.dumps(
            [[expression, category, note] for expression, (category, note) in new.items()]
        ),
        result={
            "lines": lines,
            "new": len(new),
            "present": present,
            "repeated": repeated,
            "refused": refused_count,
            "refused_lines": refused,
            "refused_truncated": refused_count > len(refused),
            "sample_new": list(new)[:20],
            "impact": impact.as_dict(),
            "preview_seconds": round(time.perf_counter() - started, 3),
        },
        refused=refused_file.getvalue(),
    )
    return job


def refused_entry(lineno: int, raw: str, error: str) -> str:
    """One refused line for the download: its reason as a comment above it, so the
    file can be fixed and uploaded again as it is."""
    reason = " ".join(error.split())
    return f"# line {lineno}: {reason}\n{raw}\n"


def start_import(job: AdminJob, *, user) -> None:
    """Queue a previewed import (once: a second click finds it no longer previewed).
    `user`, who commits it, is its actor from here on (the rules, the change log and
    the rescan are theirs), not whoever uploaded the file; the uploader stays in
    params["uploaded_by"]."""
    uploader = job.created_by
    params = {**job.params, "uploaded_by": uploader.get_username() if uploader else None}
    claimed = AdminJob.objects.filter(pk=job.pk, state=AdminJob.State.PREVIEWED).update(
        state=AdminJob.State.QUEUED, message="Waiting for a worker.", created_by=user, params=params
    )
    if claimed:
        job.created_by, job.params = user, params
        # After commit, or a worker could look for the row before it is visible.
        transaction.on_commit(lambda: import_rules_job.delay(job.pk))


def start_rescan(*, user, after_import: int | None = None) -> AdminJob:
    job = AdminJob.objects.create(
        kind=AdminJob.Kind.RESCAN,
        state=AdminJob.State.QUEUED,
        created_by=user,
        params={"after_import": after_import} if after_import else {},
        message="Waiting for a worker.",
    )
    transaction.on_commit(lambda: rescan_links_job.delay(job.pk))
    return job


class _Progress:
    """Writes done/total to the job row, at most every PROGRESS_EVERY_SECONDS."""

    def __init__(self, job: AdminJob):
        self.job = job
        self.last = 0.0

    def __call__(self, done: int, total: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= PROGRESS_EVERY_SECONDS:
            self.last = now
            AdminJob.objects.filter(pk=self.job.pk).update(done=done, total=total)


def _begin(job_id: int, kind: str) -> AdminJob | None:
    job = AdminJob.objects.filter(pk=job_id, kind=kind).first()
    if job is None:
        logger.warning("admin job %s (%s) no longer exists; nothing to do", job_id, kind)
        return None
    job.state = AdminJob.State.RUNNING
    job.started = timezone.now()
    job.message = ""
    job.save(update_fields=["state", "started", "message"])
    return job


def _fail(job: AdminJob, exc: BaseException, message: str) -> None:
    logger.exception("admin job %s failed", job.pk)
    job.state = AdminJob.State.FAILED
    job.finished = timezone.now()
    job.message = f"{message}: {type(exc).__name__}: {exc}"
    job.save(update_fields=["state", "finished", "message", "done", "result"])


@shared_task(name="urlguard.admin.import_rules_job")
def import_rules_job(job_id: int) -> dict | None:
    job = _begin(job_id, AdminJob.Kind.IMPORT)
    if job is None:
        return None
    items = [tuple(item) for item in json.loads(job.payload or "[]")]
    progress = _Progress(job)
    added = skipped = 0
    refused: list[str] = []
    source = f"import:{job.params.get('filename', '')}"[:200]
    started = time.perf_counter()
    try:
        for chunk in changes.in_batches(items, IMPORT_CHUNK):
            bulk = changes.add_rules(
                chunk, source=source, user=job.created_by, chunk_size=IMPORT_CHUNK
            )
            added += len(bulk.added)
            skipped += len(bulk.skipped)
            # The preview already refused what parse_rules refuses; anything refused
            # here means the rules changed in between (e.g. a new public suffix).
            refused.extend(str(r) for r in bulk.refused)
            job.done = added + skipped
            progress(job.done, len(items))
    except Exception as exc:
        job.result = {
            **job.result,
            "added": added,
            "skipped": skipped,
            "refused_at_commit": refused[:MAX_REFUSED_SHOWN],
        }
        # Not re-raised: the job row carries the error to the page, and in-process
        # (eager) execution must not turn it into a traceback page.
        _fail(job, exc, f"Stopped after {added} rules were added (those stay)")
        return None
    rescan = start_rescan(user=job.created_by, after_import=job.pk)
    job.state = AdminJob.State.DONE
    job.finished = timezone.now()
    job.done = len(items)
    job.result = {
        **job.result,
        "added": added,
        "skipped": skipped,
        "refused_at_commit": refused[:MAX_REFUSED_SHOWN],
        "import_seconds": round(time.perf_counter() - started, 3),
        "rescan_job": rescan.pk,
    }
    job.message = f"Added {counted(added, 'rule')} ({skipped:,} already present)."
    if refused:
        job.message += f" {len(refused)} were refused at commit time."
    # The payload has served its purpose; keep the row small.
    job.payload = ""
    job.save(update_fields=["state", "finished", "done", "result", "message", "payload"])
    return job.result


@shared_task(name="urlguard.admin.rescan_links_job")
def rescan_links_job(job_id: int) -> dict | None:
    job = _begin(job_id, AdminJob.Kind.RESCAN)
    if job is None:
        return None
    # On a worker, the import's broadcast nudges may still wait behind this job:
    # bring this node's filter up to the change log first, or just-listed rules
    # would be missed by the scan.
    try:
        from urlguard import sync

        sync.sync()
    except Exception:
        logger.warning("rescan: could not bring the filter up to date first", exc_info=True)
    progress = _Progress(job)
    try:
        result = rescan_links(progress=progress)
    except Exception as exc:
        _fail(job, exc, "Rescan failed")
        return None
    job.state = AdminJob.State.DONE
    job.finished = timezone.now()
    job.done = job.total = result.scanned
    job.result = result.as_dict()
    hits = len(result.hits)
    job.message = (
        f"Scanned {counted(result.scanned, 'link')} in {result.seconds:.1f} s: "
        f"{counted(hits, 'link')} {'points' if hits == 1 else 'point'} to spam."
    )
    if result.unchecked:
        job.message += (
            f" {result.unchecked} could not be checked because the filter is "
            "unreadable (see the filter dashboard)."
        )
    job.save(update_fields=["state", "finished", "done", "total", "result", "message"])
    return {"scanned": result.scanned, "hits": len(result.hits)}
