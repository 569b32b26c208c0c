"""The rescan job: every short link's destination checked again (after an import, or when
an operator asks), listing the links that now point to spam."""

from __future__ import annotations

import logging

from django.utils import timezone

from urlguard import shortlinks
from urlguard.celery import shared_task
from urlguard.jobs.dispatch import Progress, begin, dispatch, fail
from urlguard.models import Actor, AdminJob, row_user
from urlguard.nodesync import sync
from urlguard.shortlinks.rescan import rescan_links
from urlguard.wording import counted
from urlguard.writepath.impact import build_link_index

logger = logging.getLogger(__name__)


def start_rescan(*, actor: Actor, after_import: int | None = None) -> AdminJob:
    job = AdminJob.objects.create(
        kind=AdminJob.Kind.RESCAN,
        state=AdminJob.State.QUEUED,
        created_by=row_user(actor),
        params={"after_import": after_import} if after_import else {},
        message="Waiting for a worker.",
    )
    dispatch(rescan_links_job, job.pk)
    return job


def rescan_after_adding(*, actor: Actor, after_import: int | None = None) -> AdminJob | None:
    """New rules may block existing short links: queue their rescan (which also brings
    the impact index up to date), where the site has short links; None where it has
    none (an import and a feed refresh both end with this)."""
    if not shortlinks.installed():
        return None
    return start_rescan(actor=actor, after_import=after_import)


@shared_task(name="urlguard.admin.rescan_links_job")
def rescan_links_job(job_id: int) -> dict | None:
    job = begin(job_id, AdminJob.Kind.RESCAN)
    if job is None:
        return None
    # On a worker, the import's broadcast nudges may still wait behind this job:
    # bring this node's filter up to the change log first, or just-listed rules
    # would be missed by the scan.
    try:
        sync.sync()
    except Exception:
        logger.warning("rescan: could not bring the filter up to date first", exc_info=True)
    progress = Progress(job)
    try:
        result = rescan_links(progress=progress)
    except Exception as exc:
        fail(job, exc, "Rescan failed")
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
    # The rescan has just read every link: the impact index follows it, so links
    # edited since the last build are counted right again.
    try:
        build_link_index()
    except Exception:
        logger.exception("rescan: the short-link index for impact figures could not be rebuilt")
    return {"scanned": result.scanned, "hits": len(result.hits)}
