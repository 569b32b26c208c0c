"""Celery tasks for feeds, thin wrappers of urlguard.feeds.refresh: refresh one
source (retrying a transient failure with exponential backoff, reporting progress
to an AdminJob when the admin started it) and, from beat, queue every due source."""

from __future__ import annotations

import logging
import time
from typing import Any

from django.utils import timezone

from urlguard.celery import shared_task
from urlguard.conf import conf
from urlguard.feeds.refresh import RefreshStatus, due_sources, refresh_source
from urlguard.feeds.trial import test_fetch
from urlguard.models import AdminJob, Source
from urlguard.runtime import ownership

logger = logging.getLogger(__name__)

REFRESH_FEED_TASK = "urlguard.feeds.refresh_feed"
REFRESH_JOB_TASK = "urlguard.feeds.refresh_feed_job"
REFRESH_DUE_TASK = "urlguard.feeds.refresh_due_feeds"
TEST_FETCH_TASK = "urlguard.feeds.test_fetch_job"
_PROGRESS_EVERY = 0.5


def _job_progress(job_id: int | None):
    last = [0.0]

    def report(stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if job_id is None or (now - last[0] < _PROGRESS_EVERY and stage != "done"):
            return
        last[0] = now
        AdminJob.objects.filter(pk=job_id).update(
            done=done, total=total, message=f"{stage.capitalize()}…"
        )

    return report


@shared_task(bind=True, name=REFRESH_FEED_TASK, ignore_result=True)
def refresh_feed(
    self: Any,
    source_id: int,
    accept_shrink: bool = False,
    job_id: int | None = None,
    accept_impact: bool = False,
) -> dict[str, Any] | None:
    return _refresh(
        self, source_id, accept_shrink=accept_shrink, accept_impact=accept_impact, job_id=job_id
    )


@shared_task(bind=True, name=REFRESH_JOB_TASK, ignore_result=True)
def refresh_feed_job(self: Any, job_id: int) -> None:
    """The admin's "refresh now", an AdminJob that urlguard.jobs.dispatch runs on
    a worker or the runner thread (a first load is too long for one request)."""
    job = AdminJob.objects.filter(pk=job_id, kind=AdminJob.Kind.REFRESH).first()
    if job is None:
        logger.warning("refresh job %s no longer exists; nothing to do", job_id)
        return
    _refresh(
        self,
        int(job.params["source"]),
        accept_shrink=bool(job.params.get("accept_shrink")),
        accept_impact=bool(job.params.get("accept_impact")),
        job_id=job_id,
    )


def _refresh(
    task: Any, source_id: int, *, accept_shrink: bool, accept_impact: bool, job_id: int | None
) -> dict[str, Any] | None:
    source = Source.objects.filter(pk=source_id).first()
    if source is None:
        logger.warning("feed source #%s no longer exists; nothing to refresh", source_id)
        if job_id is not None:
            AdminJob.objects.filter(pk=job_id).update(
                state=AdminJob.State.FAILED,
                finished=timezone.now(),
                message=f"Source #{source_id} no longer exists; nothing was refreshed.",
            )
        return None
    if job_id is not None:
        now = ownership.database_now()  # the clock its heartbeat's age is judged on
        AdminJob.objects.filter(pk=job_id).update(
            state=AdminJob.State.RUNNING,
            started=now,
            message="Fetching…",
            owner=str(ownership.me()),
            heartbeat=now,
        )
        ownership.beat_while_owned()
    try:
        result = refresh_source(
            source,
            accept_shrink=accept_shrink,
            accept_impact=accept_impact,
            progress=_job_progress(job_id),
            job=job_id,
        )
    except Exception as exc:
        # refresh_source records its own failures; this is what even that could not
        # (the database gone): the admin's job must not stay "running".
        if job_id is not None:
            AdminJob.objects.filter(pk=job_id).update(
                state=AdminJob.State.FAILED,
                finished=timezone.now(),
                message=f"{source.name}: failed: {type(exc).__name__}: {exc}"[:1000],
            )
        raise
    retries = conf.FEED_RETRIES
    # Only a worker's run retries: an eager one, or a call on the runner thread, has
    # nobody to send the retry to, and its job must end now.
    request = task.request
    on_worker = not (request.is_eager or getattr(request, "called_directly", False))
    if result.transient and on_worker and request.retries < retries:
        # celery is the optional [celery] extra; only a worker's run gets here.
        from celery.utils.time import get_exponential_backoff_interval

        countdown = get_exponential_backoff_interval(
            factor=30, retries=request.retries, maximum=900, full_jitter=True
        )
        logger.info("feed %s: retrying in %s s (%s)", source.name, countdown, result.error)
        raise task.retry(countdown=countdown, max_retries=retries)
    if job_id is not None:
        failed = result.status == RefreshStatus.FAILED
        AdminJob.objects.filter(pk=job_id).update(
            state=AdminJob.State.FAILED if failed else AdminJob.State.DONE,
            finished=timezone.now(),
            message=result.summary(),
            result={**result.as_dict(), "impact_lines": result.impact_lines()},
            done=result.added + result.removed,
            total=result.added + result.removed,
        )
    return result.as_dict()


@shared_task(name=TEST_FETCH_TASK, ignore_result=True)
def test_fetch_job(job_id: int) -> None:
    """A subscribe form's "test fetch", as an AdminJob: its result is the page."""

    job = AdminJob.objects.filter(pk=job_id, kind=AdminJob.Kind.TEST_FETCH).first()
    if job is None:
        return
    AdminJob.objects.filter(pk=job_id).update(
        state=AdminJob.State.RUNNING, started=timezone.now(), message="Fetching…"
    )
    try:
        outcome = test_fetch(
            job.params["url"], format=job.params["format"], category=job.params["category"]
        )
    except Exception as exc:  # the job row carries it to the page, never a traceback
        logger.exception("test fetch %s failed", job_id)
        outcome = {"error": f"{type(exc).__name__}: {exc}"}
    AdminJob.objects.filter(pk=job_id).update(
        state=AdminJob.State.FAILED if outcome["error"] else AdminJob.State.DONE,
        finished=timezone.now(),
        message=outcome["error"] or f"{outcome['entries']:,} entries",
        result=outcome,
    )


@shared_task(name=REFRESH_DUE_TASK, ignore_result=True)
def refresh_due_feeds() -> list[str]:
    """Queue a refresh of every enabled feed whose interval has passed (first marking
    admin jobs whose worker died failed, and releasing claims whose owner is gone)."""
    ownership.recover_orphans()
    names = []
    for source in due_sources():
        refresh_feed.delay(source.pk)
        names.append(source.name)
    return names
