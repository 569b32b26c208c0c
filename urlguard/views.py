"""Pages and endpoints of the service: the home page, short links, the warning
page shown in place of a blocked redirect, its signed "continue anyway" step,
and the JSON check API for other services."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from django.core import signing
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponsePermanentRedirect,
    HttpResponseRedirect,
    JsonResponse,
)
from django.shortcuts import render
from django.urls import Resolver404, resolve, reverse
from django.utils.encoding import iri_to_uri
from django.views.decorators.http import require_GET

from urlguard.clicks import record_click, visitor_id
from urlguard.conf import conf
from urlguard.guard import InvalidURL, Verdict, get_guard
from urlguard.middleware import WEB_SCHEMES, mark_confirmed
from urlguard.models import Category, ShortLink
from urlguard.rules import rule_level

logger = logging.getLogger(__name__)

CONTINUE_SALT = "urlguard.continue"

# Plain words for the warning page: people do not know what "phishing" means.
CATEGORY_WORDS: dict[str, str] = {
    Category.PHISHING: "a phishing site: a page made to look like one you trust, "
    "so that you type in a password or payment details",
    Category.MALWARE: "a site that spreads malware: software that can harm your device "
    "or steal your data",
    Category.SPAM: "a spam site: unwanted advertising, fake offers or scams",
    Category.UNWANTED: "a site offering unwanted software: programs that change your "
    "browser or device without asking",
    Category.OTHER: "a site on this service's block list",
}

LEVEL_WORDS = {
    "domain": "the whole site {host} and all its subdomains",
    "subdomain": "the subdomain {host}",
    "path": "one section of {host}",
    "page": "one page on {host}",
}

_NO_CACHE_HEADERS = {
    "Cache-Control": "no-store",
    "X-Robots-Tag": "noindex, nofollow",
    # The page and the continue link must not leak to the site we warn about.
    "Referrer-Policy": "no-referrer",
}


def _no_cache(response: HttpResponse) -> HttpResponse:
    for name, value in _NO_CACHE_HEADERS.items():
        response[name] = value
    return response


def _signer() -> signing.TimestampSigner:
    return signing.TimestampSigner(salt=CONTINUE_SALT)


def continue_token(destination: str, visitor: str) -> str:
    """A signed, timestamped token naming `destination`: the "continue anyway"
    link carries it so that /continue can never redirect to a URL we did not warn about.

    It is bound to `visitor` (clicks.visitor_id of the warned request): otherwise a
    token copied from one warning page would make /continue a warning-free redirect
    to a listed site for anyone it is sent to."""
    return _signer().sign_object({"u": destination, "v": visitor}, compress=True)


def report_mistake_url(destination: str) -> str:
    base = str(conf.REPORT_MISTAKE_URL)
    sep = "&" if "?" in base else "?"
    if base.startswith("mailto:"):
        subject = quote("Wrongly blocked link", safe="")
        body = quote(f"This link was blocked, I think by mistake:\n{destination}\n", safe="")
        return f"{base}{sep}subject={subject}&body={body}"
    return f"{base}{sep}{urlencode({'url': destination})}"


def _scheme_and_host(url: str) -> tuple[str, str]:
    try:
        parts = urlsplit(url)
        return parts.scheme.lower(), parts.hostname or ""
    except ValueError:  # e.g. "http://[" : an unusable address has no host to name
        return "", ""


def warning_response(
    request: HttpRequest,
    *,
    destination: str,
    kind: str,
    verdict: Verdict | None = None,
    reason: str = "",
) -> HttpResponse:
    """The page shown instead of a redirect we will not follow blindly.

    kind: "rule" (the destination is on the spam list), "unchecked" (the filter
    could not be read and ON_FILTER_ERROR is "closed"), "scheme" (a javascript:,
    data: ... destination) or "invalid" (not a usable web address).

    The status is honest rather than 200: 403 for a refusal, 503 (with
    Retry-After) when we simply could not check. Browsers show the page either
    way, and monitoring and crawlers see that nothing was served.
    """
    scheme, host = _scheme_and_host(destination)
    rule = verdict.rule if verdict else None
    context: dict[str, Any] = {
        "kind": kind,
        "destination": destination,
        "host": host,
        "scheme": scheme,
        "rule": rule,
        "reason": reason or (verdict.reason if verdict else ""),
        "report_url": report_mistake_url(destination),
        "continue_url": None,
    }
    if rule is not None:
        try:
            level = rule_level(rule.expression)
        except Exception:  # a display nicety: the page renders without it ("blocks <host>")
            level = ""
        context.update(
            category_label=rule.get_category_display(),
            category_words=CATEGORY_WORDS.get(rule.category, CATEGORY_WORDS[Category.OTHER]),
            level=level,
            level_words=LEVEL_WORDS.get(level, "{host}").format(host=rule.expression.split("/")[0]),
        )
    if kind in ("rule", "unchecked") and scheme in WEB_SCHEMES and host:
        # Never offered for javascript:/data: (that would be a script injection
        # one click away) nor for an address we could not even parse.
        context["continue_url"] = (
            reverse("urlguard:continue")
            + "?"
            + urlencode({"token": continue_token(destination, visitor_id(request))})
        )
    status = 503 if kind == "unchecked" else 403
    response = _no_cache(render(request, "urlguard/warning.html", context, status=status))
    if kind == "unchecked":
        response["Retry-After"] = "60"
    if verdict is not None and verdict.degraded:
        response["X-URLGuard"] = "degraded"
    return response


@require_GET
def continue_anyway(request: HttpRequest) -> HttpResponse:
    """Follow a warned-about redirect, but only with a valid, unexpired token."""
    token = request.GET.get("token", "")
    problem = ""
    destination = ""
    try:
        data = _signer().unsign_object(token, max_age=conf.CONTINUE_TOKEN_MAX_AGE)
        destination = data["u"] if isinstance(data, dict) and isinstance(data.get("u"), str) else ""
        if _scheme_and_host(destination)[0] not in WEB_SCHEMES:
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
        return _no_cache(
            render(request, "urlguard/bad_token.html", {"problem": problem}, status=400)
        )
    response = HttpResponseRedirect(iri_to_uri(destination))
    response["Cache-Control"] = "no-store"
    response["Referrer-Policy"] = "no-referrer"
    mark_confirmed(response)
    return response


def home(request: HttpRequest) -> HttpResponse:
    links = ShortLink.objects.order_by("slug")[:50]
    return render(request, "urlguard/home.html", {"links": links})


def short_link(request: HttpRequest, slug: str) -> HttpResponse:
    """`/<slug>` → 302 to the destination. The middleware checks it on the way out."""
    link = (
        ShortLink.objects.filter(slug=slug)
        .only("id", "destination", "disabled", "disabled_reason")
        .first()
    )
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
    record_click(request, link)  # never raises for a database error: the redirect comes first
    # A bare 302 rather than HttpResponseRedirect: that one raises on a
    # javascript:/data: destination, and such a destination deserves the
    # middleware's scheme policy (a warning page), not a 400.
    response = HttpResponse(status=302)
    response["Location"] = iri_to_uri(link.destination)
    return response


def _json_error(message: str, status: int, **headers: str) -> JsonResponse:
    response = JsonResponse({"error": message}, status=status)
    for name, value in headers.items():
        response[name] = value
    return response


def api_check(request: HttpRequest) -> JsonResponse:
    """`GET /api/check?url=...` → the guard's verdict as JSON."""
    if request.method not in ("GET", "HEAD"):
        return _json_error(
            f"method {request.method} not allowed; use GET /api/check?url=...",
            405,
            Allow="GET, HEAD",
        )
    url = request.GET.get("url", "")
    if not url.strip():
        return _json_error(
            "missing query parameter 'url', e.g. /api/check?url=https://example.com/", 400
        )
    try:
        verdict = get_guard().check(url)
    except InvalidURL as exc:
        return _json_error(str(exc), 400)
    except Exception:
        # E.g. the database is down while confirming a filter hit: say so in
        # JSON, which is what the caller parses, rather than an HTML 500.
        logger.exception("urlguard: /api/check failed for %r", url)
        return _json_error(
            "the check could not be completed; try again shortly", 503, **{"Retry-After": "30"}
        )
    response = JsonResponse(
        {
            "url": verdict.url,
            "canonical": verdict.canonical,
            "blocked": verdict.blocked,
            "category": verdict.category or None,
            "rule": verdict.rule.expression if verdict.rule is not None else None,
            "reason": verdict.reason,
            "degraded": verdict.degraded,
        }
    )
    # The answer changes whenever the list does.
    response["Cache-Control"] = "no-store"
    if verdict.degraded:
        response["X-URLGuard"] = "degraded"
    return response
