"""The short-link redirect view, `/<slug>` (routed by urlguard.shortlinks.urls)."""

from __future__ import annotations

from functools import partial

from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect
from django.shortcuts import render
from django.urls import Resolver404, resolve
from django.utils.encoding import iri_to_uri

from urlguard.hotpath.unavailable import unavailable
from urlguard.shortlinks import linkcache
from urlguard.shortlinks.clicks import record_click


def short_link(request: HttpRequest, slug: str) -> HttpResponse:
    """`/<slug>` → 302 to the destination. The middleware checks it on the way out.

    The link comes from this process's cache (urlguard.shortlinks.linkcache) and the click goes
    to a buffer (urlguard.shortlinks.clicks): a cached link is answered without the database,
    also while it is down; an uncached one then gets a 503 asking to retry."""
    try:
        link = linkcache.get(slug)
    except linkcache.LinkUnavailable as exc:
        return unavailable(request, exc, "urlguard/link_unavailable.html", {"slug": slug})
    if link is None:
        # `/admin` (no slash) looks like a slug; APPEND_SLASH never sees it
        # because this pattern matched. Send it where it was meant to go.
        try:
            if resolve(request.path + "/").url_name != "short-link":
                return HttpResponsePermanentRedirect(request.path + "/")
        except Resolver404:
            pass
        return render(request, "urlguard/link_not_found.html", {"slug": slug}, status=404)
    if link.disabled:
        return render(request, "urlguard/link_disabled.html", {"link": link}, status=410)
    # A bare 302 rather than HttpResponseRedirect: that one raises on a
    # javascript:/data: destination, and such a destination deserves the
    # middleware's scheme policy (a warning page), not a 400. The click counts once
    # the redirect is sent: one the guard replaces by its warning page is never sent,
    # so a warning shown is not a click (the hit log counts it instead).
    response = _RedirectCountedWhenSent(partial(record_click, request, link), status=302)
    response["Location"] = iri_to_uri(link.destination)
    return response


class _RedirectCountedWhenSent(HttpResponse):
    """A response that runs `on_sent` (a buffer append) when the server closes it
    after sending it."""

    def __init__(self, on_sent, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._on_sent = on_sent

    def close(self) -> None:
        try:
            super().close()
        finally:
            on_sent, self._on_sent = self._on_sent, None
            if on_sent is not None:
                on_sent()
