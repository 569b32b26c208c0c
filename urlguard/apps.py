"""The urlguard AppConfig."""
from django.apps import AppConfig


class UrlguardConfig(AppConfig):
    name = "urlguard"
    verbose_name = "URL guard"
    default_auto_field = "django.db.models.BigAutoField"
