"""urlguard's Celery configuration, for whichever Celery app the site runs. The app
never makes a Celery app of its own: its tasks are `shared_task`s that the site's
app finds by autodiscovery, and `configure(app)` adds the queues, routes and beat
schedule they need. A site's celery.py (the standalone service's is
urlguard_service/celery.py):

    app = Celery("mysite")
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.autodiscover_tasks()
    urlguard.celery.configure(app)

Every node runs one small worker that consumes the broadcast queue (each node gets
every "apply changes" nudge) and the ordinary queue:

    celery -A mysite worker -B -Q urlguard.broadcast,celery --concurrency 1

(`urlguard.broadcast` is URLGUARD["BROADCAST_QUEUE"]). `-B` embeds Celery beat, which
broadcasts the periodic catch-up; running it on several nodes only repeats an
idempotent catch-up.

Celery is optional (the `celery` extra). Without it, or with no broker configured
(no Celery app, or one without a broker URL), every task runs in the process that
sends it: the embedded default.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

try:
    from celery import shared_task
    from celery.result import EagerResult
except ImportError:  # Celery is an extra: without it every task runs where it is sent
    HAVE_CELERY = False
else:
    HAVE_CELERY = True

# The tasks every node runs (urlguard.nodesync.tasks), named here so that callers and routes
# need not import the task module.
APPLY_CHANGES_TASK = "urlguard.tasks.apply_changes"
CATCH_UP_TASK = "urlguard.tasks.catch_up"
REBUILD_FILTER_TASK = "urlguard.tasks.rebuild_filter"
VERIFY_FILTER_TASK = "urlguard.tasks.verify_filter"
# The database's, not a node's: one worker runs it (urlguard.hotpath.hitlog).
PRUNE_HIT_LOG_TASK = "urlguard.prune_hit_log"
PRUNE_HIT_LOG_INTERVAL = 24 * 3600.0


class _InProcessRequest:
    is_eager = True
    retries = 0


class InProcessResult:
    """What `.delay()` returns without Celery: the task has already run."""

    def __init__(self, result: Any) -> None:
        self.result = result

    def get(self, **kwargs: Any) -> Any:
        return self.result


class InProcessTask:
    """A task without Celery installed: calling, `.delay()` and `.apply()` run the
    function here and now, as Celery's eager mode does (errors propagate)."""

    def __init__(self, function: Callable[..., Any], name: str, bind: bool) -> None:
        functools.update_wrapper(self, function)
        self.name = name
        self.request = _InProcessRequest()
        self._function = function
        self._bind = bind

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._bind:
            return self._function(self, *args, **kwargs)
        return self._function(*args, **kwargs)

    def delay(self, *args: Any, **kwargs: Any) -> InProcessResult:
        return InProcessResult(self(*args, **kwargs))

    def apply(self, args: tuple = (), kwargs: dict | None = None, **options: Any) -> Any:
        return InProcessResult(self(*args, **(kwargs or {})))


def _in_process_task(*args: Any, name: str = "", bind: bool = False, **options: Any) -> Any:
    """`shared_task` where Celery is not installed (same decorator forms)."""

    def decorate(function: Callable[..., Any]) -> InProcessTask:
        return InProcessTask(function, name or f"{function.__module__}.{function.__name__}", bind)

    if args and callable(args[0]):
        return decorate(args[0])
    return decorate


if not HAVE_CELERY:
    shared_task = _in_process_task
    EagerResult = InProcessResult


def current_app() -> Any:
    """The site's Celery app (Celery's fallback default app where the site has none)."""
    from celery import current_app as app  # only called where Celery is installed

    return app


def in_process() -> bool:
    """Tasks run in the process that sends them: no Celery, or the app is eager, or
    it has no broker."""
    if not HAVE_CELERY:
        return True
    conf = current_app().conf
    return bool(conf.task_always_eager) or not (conf.broker_write_url or conf.broker_url)


def run_in_process_without_broker() -> None:
    """Make the site's Celery app eager when it has no broker, so that a site without
    Celery applies each change in the process that made it, and `.delay()` never
    tries a broker on localhost that nobody runs."""
    if HAVE_CELERY and in_process():
        current_app().conf.update(task_always_eager=True, task_eager_propagates=True)


def configure(app: Any) -> None:
    """Add urlguard's queues, routes and beat schedule to `app`'s defaults (a site's
    own settings, e.g. CELERY_BEAT_SCHEDULE, still win)."""
    app.add_defaults(_urlguard_defaults)


def _urlguard_defaults() -> dict:
    # Lazy (evaluated when Celery first reads its configuration) so that the queue
    # name and interval come from URLGUARD settings; CELERY_* settings still win.
    from kombu import Exchange, Queue
    from kombu.common import Broadcast

    from urlguard.conf import conf  # as the kombu imports: when Celery asks

    # An explicit routing key: on Redis a fanout is PUB/SUB on "<exchange>/<key>", and
    # the worker would otherwise subscribe with its default key while a publisher
    # sent with none, so nothing would arrive. (RabbitMQ ignores it for fanout.)
    # A wire name, like the task names: nodes of two releases must hear each other.
    broadcast = Broadcast(conf.BROADCAST_QUEUE, routing_key="urlguard.nudge")
    # Each node must apply every change to its own file, so these go to every worker.
    # `declare`: Celery never declares a Broadcast queue when publishing, and on
    # Redis an exchange the publisher has not declared is taken for a direct one, so
    # the message would match no binding and vanish; declaring the fanout exchange
    # (same attributes as the workers') makes it a PUBLISH every node receives.
    per_node = {
        "queue": conf.BROADCAST_QUEUE,
        "exchange": conf.BROADCAST_QUEUE,
        "routing_key": broadcast.routing_key,
        "declare": [broadcast.exchange],
    }
    schedule = {
        "urlguard-catch-up": {"task": CATCH_UP_TASK, "schedule": conf.CATCHUP_INTERVAL},
        # Queues each due feed on the ordinary queue: one worker refreshes it.
        "urlguard-feeds": {
            "task": "urlguard.feeds.refresh_due_feeds",
            "schedule": conf.FEED_CHECK_INTERVAL,
        },
        "urlguard-hit-log": {"task": PRUNE_HIT_LOG_TASK, "schedule": PRUNE_HIT_LOG_INTERVAL},
    }
    if conf.VERIFY_INTERVAL > 0:
        schedule["urlguard-verify"] = {
            "task": VERIFY_FILTER_TASK,
            "schedule": conf.VERIFY_INTERVAL,
        }
    return {
        "task_queues": (
            Queue("celery", Exchange("celery"), routing_key="celery"),
            broadcast,
        ),
        "task_routes": {
            APPLY_CHANGES_TASK: per_node,
            CATCH_UP_TASK: per_node,
            REBUILD_FILTER_TASK: per_node,
            VERIFY_FILTER_TASK: per_node,
        },
        "beat_schedule": schedule,
    }
