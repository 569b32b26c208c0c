"""The urlguard AppConfig: registers the system checks and maps the filter once per
process at start-up."""
from django.apps import AppConfig


class UrlguardConfig(AppConfig):
    name = "urlguard"
    verbose_name = "URL guard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from urlguard import checks, registry  # noqa: F401  (checks register on import)

        registry.open_at_startup()
