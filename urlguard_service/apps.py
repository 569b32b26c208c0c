"""The service's AppConfig: its own system checks (the var directory) and the
SECRET_KEY and database password checks, which the app leaves to `check --deploy`, made
ordinary ones."""

from django.apps import AppConfig
from django.core import checks


class UrlguardServiceConfig(AppConfig):
    name = "urlguard_service"
    verbose_name = "URL guard service"

    def ready(self) -> None:
        from urlguard.checks import check_database_passwords, check_secret_key
        from urlguard_service import checks as service_checks  # noqa: F401  (registers)

        # The service's own key is never a development key: migrate, runserver, gunicorn
        # and the worker all refuse a known or short one (with DEBUG off).
        # Likewise a placeholder database password.
        for check in (check_secret_key, check_database_passwords):
            checks.registry.registry.deployment_checks.discard(check)
            checks.register(check, "urlguard")
