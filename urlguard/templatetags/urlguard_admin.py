"""Template tags of the admin's first page: the operator's summary, and the app list
without the apps the page shows in its own way."""

from __future__ import annotations

from typing import Any

from django import template

from urlguard import shortlinks
from urlguard.admin.summary import operator_summary as _operator_summary

register = template.Library()


@register.simple_tag
def operator_summary() -> dict[str, Any]:
    return _operator_summary()


@register.filter
def without_app(app_list: list[dict[str, Any]], label: str) -> list[dict[str, Any]]:
    return [app for app in app_list if app.get("app_label") != label]


@register.simple_tag
def shortlinks_installed() -> bool:
    """`{% shortlinks_installed as has_links %}`: whether the short-link admin (and
    so its URLs) exists on this site."""
    return shortlinks.installed()
