"""The service's AppConfig: its own system checks (the var directory) and the
SECRET_KEY check, which the app leaves to `check --deploy`, made an ordinary one."""

from django.apps import AppConfig
from django.core import checks


class UrlguardServiceConfig(AppConfig):
    name = "urlguard_service"
    verbose_name = "URL guard service"

    def ready(self) -> None:
        from urlguard.checks import check_secret_key
        from urlguard_service import checks as service_checks  # noqa: F401  (registers)

        # The service's own key is never a development key: migrate, runserver, gunicorn
        # and the worker all refuse a known or short one (with DEBUG off).
        checks.registry.registry.deployment_checks.discard(check_secret_key)
        checks.register(check_secret_key, "urlguard")
