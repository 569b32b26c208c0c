"""Pages of the app: the signed "continue anyway" step of the warning page
(urlguard.warning) and the short-link redirect view (routed by the opt-in
urlguard.shortlinks.urls). The JSON check API is in urlguard.api."""

from __future__ import annotations

import logging
from functools import partial

from django.core import signing
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponsePermanentRedirect,
    HttpResponseRedirect,
)
from django.shortcuts import render
from django.urls import Resolver404, resolve
from django.utils.encoding import iri_to_uri
from django.views.decorators.http import require_GET

from urlguard import hitlog, linkcache, metrics
from urlguard.clicks import record_click, visitor_id
from urlguard.conf import conf
from urlguard.unavailable import unavailable
from urlguard.warning import (
    WEB_SCHEMES,
    continue_signer,
    mark_confirmed,
    protect_page,
    scheme_and_host,
)

logger = logging.getLogger(__name__)


@require_GET
def continue_anyway(request: HttpRequest) -> HttpResponse:
    """Follow a warned-about redirect, but only with a valid, unexpired token."""
    token = request.GET.get("token", "")
    problem = ""
    destination = ""
    try:
        data = continue_signer().unsign_object(token, max_age=conf.CONTINUE_TOKEN_MAX_AGE)
        destination = data["u"] if isinstance(data, dict) and isinstance(data.get("u"), str) else ""
        if scheme_and_host(destination)[0] not in WEB_SCHEMES:
            problem = "This link does not lead to a web page."
        elif data.get("v") != visitor_id(request):
            problem = (
                "This link was made for another browser or network. Open the original "
                "link again to see the warning page, and continue from there."
            )
    except signing.SignatureExpired:
        problem = (
            "This link has expired. Go back and open the original link again "
            "to see the warning page once more."
        )
    except signing.BadSignature:
        problem = (
            "This link is not valid: it was changed or copied incompletely. "
            "Open the original link again."
        )
    if problem:
        return protect_page(
            render(request, "urlguard/bad_token.html", {"problem": problem}, status=400)
        )
    if isinstance(data.get("r"), int):
        hitlog.continued(data["r"], destination=destination, host=scheme_and_host(destination)[1])
    response = HttpResponseRedirect(iri_to_uri(destination))
    response["Cache-Control"] = "no-store"
    response["Referrer-Policy"] = "no-referrer"
    mark_confirmed(response)
    metrics.continued()
    return response


def short_link(request: HttpRequest, slug: str) -> HttpResponse:
    """`/<slug>` → 302 to the destination. The middleware checks it on the way out.

    The link comes from this process's cache (urlguard.linkcache) and the click goes
    to a buffer (urlguard.clicks): a cached link is answered without the database,
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
