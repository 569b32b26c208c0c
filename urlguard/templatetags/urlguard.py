"""`{% load urlguard %}{{ url|guarded }}`: an outbound link, checked when clicked
(urlguard.hotpath.linkshim); `{{ html|guard_links }}`: an HTML fragment people wrote,
sanitized, every outbound link of it through the shim (urlguard.content.html)."""

from __future__ import annotations

from django import template
from django.utils.safestring import SafeString

from urlguard.content.html import guard_links as _guard_links
from urlguard.hotpath.linkshim import guarded_url

register = template.Library()


@register.filter
def guarded(url: object) -> str:
    return guarded_url("" if url is None else str(url))


@register.filter(is_safe=True)
def guard_links(html: object) -> SafeString:
    return _guard_links("" if html is None else str(html))
