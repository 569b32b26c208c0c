"""The AppConfig of the opt-in short links (urlguard.admin.links registers their admin
where this app is installed)."""

from django.apps import AppConfig


class ShortLinksConfig(AppConfig):
    name = "urlguard.shortlinks"
    label = "urlguard_shortlinks"
    verbose_name = "Short links"
