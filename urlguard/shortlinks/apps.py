"""The AppConfig of the opt-in short links (its admin registers on autodiscovery)."""

from django.apps import AppConfig


class ShortLinksConfig(AppConfig):
    name = "urlguard.shortlinks"
    label = "urlguard_shortlinks"
    verbose_name = "Short links"
