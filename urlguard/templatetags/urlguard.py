"""`{% load urlguard %}{{ url|guarded }}`: an outbound link, checked when clicked
(urlguard.hotpath.linkshim)."""

from __future__ import annotations

from django import template

from urlguard.hotpath.linkshim import guarded_url

register = template.Library()


@register.filter
def guarded(url: object) -> str:
    return guarded_url("" if url is None else str(url))
