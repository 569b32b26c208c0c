"""`guard_links(html)`: an HTML fragment people wrote (a rich-text body, rendered
Markdown) made safe, with every outbound `<a href>` through the link shim.

nh3 (the Rust sanitizer ammonia) parses the fragment as a browser does, drops what is
not allowed (scripts, event handlers, javascript: links: dropped, never passed
through), and hands each attribute, entities decoded, to a filter: an href that names
another host as the browser reads it (urlguard.hotpath.hrefs: scheme-relative,
backslashes, letter case, controls) becomes the shim's signed link, checked when
clicked; a local link or an anchor stays as it is. No regular expression reads the
HTML. Over CONTENT_MAX_CHARS the fragment is not parsed: it is shown as text."""

from __future__ import annotations

import logging

import nh3
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from urlguard.conf import conf
from urlguard.hotpath.linkshim import guarded_url
from urlguard.runtime.ratelimitedlog import RateLimitedLog

__all__ = ["guard_links"]

_log = RateLimitedLog(logging.getLogger(__name__))


def _through_the_shim(element: str, attribute: str, value: str) -> str:
    if attribute == "href":
        return guarded_url(value)
    return value


def guard_links(html: str) -> SafeString:
    """`html` sanitized, each outbound link through the shim: safe to render."""
    html = str(html)
    most = conf.CONTENT_MAX_CHARS
    if len(html) > most:
        _log(
            "too long",
            logging.WARNING,
            "urlguard: an HTML fragment of %d characters is over CONTENT_MAX_CHARS (%d): "
            "shown as text, its links not followable",
            len(html),
            most,
        )
        return escape(html)
    return mark_safe(nh3.clean(html, attribute_filter=_through_the_shim))
