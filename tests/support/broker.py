"""The service's Celery app pointed, for a while, at a broker a test chose (a silent one,
a closed port): a nudge goes out as it would on a real node."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from urlguard_service.celery import app as celery_app


@contextmanager
def broker(url: str) -> Iterator[None]:
    saved = {k: celery_app.conf[k] for k in ("task_always_eager", "broker_url")}
    celery_app.conf.update(task_always_eager=False, broker_url=url)
    try:
        yield
    finally:
        celery_app.conf.update(saved)
