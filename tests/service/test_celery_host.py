"""urlguard.celery: the app makes no Celery app of its own. A site's own app finds
the tasks by autodiscovery and gets the queues, routes and beat schedule from
`configure`; with no broker anywhere, tasks run in the process that sends them."""

from __future__ import annotations

import pytest
from celery import Celery

import urlguard.celery
from urlguard.celery import in_process, run_in_process_without_broker

TASKS = (
    "urlguard.tasks.apply_changes",
    "urlguard.tasks.catch_up",
    "urlguard.tasks.rebuild_filter",
    "urlguard.tasks.verify_filter",
    "urlguard.feeds.refresh_feed",
    "urlguard.feeds.refresh_feed_job",
    "urlguard.feeds.refresh_due_feeds",
    "urlguard.admin.import_rules_job",
    "urlguard.prune_hit_log",
)


@pytest.fixture
def site_app():
    """A site's own Celery app, made as README.md says, and current while the test runs."""
    app = Celery("mysite", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.autodiscover_tasks()
    urlguard.celery.configure(app)
    previous = urlguard.celery.current_app()
    app.set_current()
    yield app
    previous.set_current()


def test_the_app_module_makes_no_celery_app():
    assert not any(isinstance(v, Celery) for v in vars(urlguard.celery).values())


def test_a_sites_app_gets_the_tasks_routes_and_schedule(site_app):
    site_app.loader.import_default_modules()
    assert set(TASKS) <= set(site_app.tasks)
    route = site_app.amqp.router.route({}, "urlguard.tasks.apply_changes")
    assert route["queue"].exchange.type == "fanout"
    schedule = site_app.conf.beat_schedule
    assert schedule["urlguard-catch-up"]["task"] == "urlguard.tasks.catch_up"
    assert schedule["urlguard-feeds"]["task"] == "urlguard.feeds.refresh_due_feeds"


def test_no_broker_means_in_process(site_app, monkeypatch):
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)  # Celery reads it first
    site_app.conf.update(task_always_eager=False, broker_url=None)
    assert in_process()
    run_in_process_without_broker()
    assert site_app.conf.task_always_eager and site_app.conf.task_eager_propagates


def test_a_broker_means_a_worker(site_app):
    site_app.conf.update(task_always_eager=False, broker_url="redis://127.0.0.1:1/0")
    assert not in_process()
    run_in_process_without_broker()
    assert not site_app.conf.task_always_eager


def test_without_celery_a_task_runs_where_it_is_sent():
    """The stand-in `shared_task` where Celery is not installed (the wheel's default)."""
    from urlguard.celery import _in_process_task

    seen = []

    @_in_process_task(bind=True, name="t.bound", ignore_result=True)
    def bound(self, value, extra=0):
        seen.append((self.request.is_eager, self.request.retries))
        return value + extra

    @_in_process_task
    def plain():
        return "plain"

    assert bound.name == "t.bound" and bound.__name__ == "bound"
    assert bound(1, extra=2) == 3
    assert bound.delay(2).result == 2
    assert bound.apply(args=(3,), kwargs={"extra": 1}).get() == 4
    assert seen == [(True, 0)] * 3
    assert plain.delay().get() == "plain"
    assert plain.name.endswith(".plain")
