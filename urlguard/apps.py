"""The urlguard AppConfig: registers the system checks and maps the filter once per
process at start-up, and has buffered statistics flushed at exit."""

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured


class UrlguardConfig(AppConfig):
    name = "urlguard"
    verbose_name = "URL guard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # In ready(): these import the models, which the app registry loads only now.
        # checks register on import; the task modules register the Celery tasks (the
        # site's Celery app finds them, and urlguard.writepath.changes nudges them by name).
        from urlguard import celery, checks, tasks  # noqa: F401
        from urlguard.conf import conf
        from urlguard.exports import prerender
        from urlguard.nodesync import embedded, registry, sync
        from urlguard.safebrowsing import prepared

        if prerender.after_changes not in sync.AFTER_CHANGES:
            sync.AFTER_CHANGES.append(prerender.after_changes)
        if prepared.prepare_round not in prerender.AFTER_RENDERS:
            prerender.AFTER_RENDERS.append(prepared.prepare_round)
        # Here, not at the top: they import the models too.
        from urlguard.exports import lag
        from urlguard.operations import health

        # A node whose exports lag says so (health cannot import the exports).
        health.DEGRADING_CHECKS.setdefault("exports", lag.exports_check)
        if not any(isinstance(c, lag.ExportLagCollector) for c in health.EXTRA_COLLECTORS):
            health.EXTRA_COLLECTORS.append(lag.ExportLagCollector())

        try:
            catch_up = conf.EMBEDDED_CATCH_UP
            conf.FILTER_PATH  # noqa: B018  (the start-up mapping below reads it)
        except ImproperlyConfigured:
            return  # the system checks name the wrong value; start-up work must not crash first
        registry.open_at_startup()
        # A graceful stop writes the buffered statistics (clicks, rule hits).
        from urlguard.runtime import stats

        stats.install_exit_hooks()
        if celery.HAVE_CELERY:
            from urlguard.nodesync import worker  # noqa: F401  (the worker's signal handlers)
        # No broker: changes apply in-process, and the catch-up, feed refreshes and
        # hit-log pruning that beat would schedule run in daemon threads of each
        # serving process.
        celery.run_in_process_without_broker()
        if celery.in_process() and catch_up:
            embedded.install()
        if celery.in_process():
            from urlguard.hotpath import hitlog  # imports the models: only in ready()

            hitlog.install()
        if celery.in_process() and conf.FEED_EMBEDDED_REFRESH:
            from urlguard.feeds import runner  # imports the models: only in ready()

            runner.install()
