"""The urlguard AppConfig: registers the system checks and maps the filter once per
process at start-up, and has buffered statistics flushed at exit."""

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured


class UrlguardConfig(AppConfig):
    name = "urlguard"
    verbose_name = "URL guard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        # checks register on import; tasks registers the Celery tasks that
        # urlguard.changes nudges by name.
        from urlguard import checks, embedded, registry, tasks  # noqa: F401
        from urlguard.conf import conf

        try:
            catch_up = conf.EMBEDDED_CATCH_UP
            conf.FILTER_PATH  # noqa: B018  (the start-up mapping below reads it)
        except ImproperlyConfigured:
            return  # the system checks name the wrong value; start-up work must not crash first
        registry.open_at_startup()
        # A graceful stop writes the buffered statistics (clicks, rule hits).
        from urlguard import stats

        stats.install_exit_hooks()
        if getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False) and catch_up:
            embedded.install()
        if getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False) and conf.FEED_EMBEDDED_REFRESH:
            from urlguard.feeds import runner

            runner.install()
