"""The signed "continue anyway" step of the warning page (urlguard.hotpath.warning)."""

from __future__ import annotations

import logging

from django.core import signing
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
)
from django.shortcuts import render
from django.utils.encoding import iri_to_uri
from django.views.decorators.http import require_GET

from urlguard.conf import conf
from urlguard.hotpath import hitlog
from urlguard.hotpath.warning import (
    WEB_SCHEMES,
    continue_signer,
    mark_confirmed,
    protect_page,
    scheme_and_host,
)
from urlguard.runtime import metrics
from urlguard.runtime.visitors import visitor_id

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
