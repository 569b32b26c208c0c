"""The feed work an operator starts from the admin, queued as an AdminJob: a refresh
(with the shrink or the impact accepted) and a test fetch of a feed not saved yet. A
worker, or this process's runner thread, runs it (urlguard.feeds.tasks): never the
request, which a first load of a big feed would outlast."""

from __future__ import annotations

from typing import Any

from urlguard.feeds.tasks import refresh_feed_job, test_fetch_job
from urlguard.jobs.dispatch import dispatch
from urlguard.models import Actor, AdminJob, Source, row_user

__all__ = ["start_refresh", "start_test_fetch"]


def start_refresh(
    source: Source, *, actor: Actor, accept_shrink: bool = False, accept_impact: bool = False
) -> AdminJob:
    """Queue a refresh of `source` as an AdminJob (a worker, or this process's runner
    thread: never inside the request, which a first load of a big feed would outlast)."""
    job = AdminJob.objects.create(
        kind=AdminJob.Kind.REFRESH,
        created_by=row_user(actor),
        params={
            "source": source.pk,
            "name": source.name,
            "accept_shrink": accept_shrink,
            "accept_impact": accept_impact,
        },
        message="Waiting for a worker.",
    )
    dispatch(refresh_feed_job, job.pk)
    return job


def start_test_fetch(data: dict[str, Any], *, actor: Actor) -> AdminJob:
    """Queue a test fetch of the subscribe form's feed (a worker, or this process's
    runner thread: never inside the request)."""
    job = AdminJob.objects.create(
        kind=AdminJob.Kind.TEST_FETCH,
        created_by=row_user(actor),
        params={
            "name": data.get("name", ""),
            "url": data["url"].strip(),
            "format": data.get("format") or "auto",
            "category": data.get("category") or "spam",
            "interval": data.get("interval") or 3600,
        },
        message="Waiting for a worker.",
    )
    dispatch(test_fetch_job, job.pk)
    return job
