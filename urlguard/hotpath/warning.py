"""The warning page shown in place of a redirect the guard will not follow
blindly, and the pieces it shares with the "continue anyway" step: the signed
token, the report-a-mistake link, the plain words for each category.

Both the middleware (which shows the page) and the views (which honour its
"continue anyway" link) import this module; it imports neither of them.
"""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from django.core import signing
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render
from django.urls import reverse

from urlguard.conf import conf
from urlguard.hotpath import hitlog
from urlguard.hotpath.guard import Verdict
from urlguard.hotpath.rollup import rule_level
from urlguard.models import Category, SpamRule
from urlguard.runtime import metrics
from urlguard.runtime.visitors import visitor_id

__all__ = [
    "CATEGORY_WORDS",
    "CONFIRMED_ATTR",
    "CONTINUE_SALT",
    "LEVEL_WORDS",
    "REPORT_SALT",
    "WEB_SCHEMES",
    "continue_signer",
    "continue_token",
    "mark_confirmed",
    "protect_page",
    "report_form_url",
    "report_mistake_url",
    "report_token",
    "scheme_and_host",
    "warning_response",
]

WEB_SCHEMES = frozenset({"http", "https"})

#: Response attribute set by views whose redirect the user already confirmed
#: (the warning page's "continue anyway"): checking it again would loop.
CONFIRMED_ATTR = "urlguard_confirmed"

CONTINUE_SALT = "urlguard.continue"
# Signs the report form's link (urlguard.reports.views checks it), on any node.
REPORT_SALT = "urlguard.report"

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

# The guard's own pages answer in place of a redirect, outside the middleware
# that would add these to a view's page (the guard runs first).
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "X-Robots-Tag": "noindex, nofollow",
    # The page and the continue link must not leak to the site we warn about.
    "Referrer-Policy": "no-referrer",
    # Framed invisibly by another site, two clicks would follow "continue anyway".
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # A site that opened the link keeps no handle on the page (window.opener).
    "Cross-Origin-Opener-Policy": "same-origin",
}
# Nothing but the page's own inline style (by hash), same-origin and data: images
# (the icon) and same-origin forms: the page runs no script, and a destination
# shown on it can inject nothing that loads.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src {styles}; img-src 'self' data:; form-action 'self'; "
    "base-uri 'none'; frame-ancestors 'none'"
)
_STYLE_RE = re.compile(r"<style>(.*?)</style>", re.DOTALL)


def mark_confirmed(response: HttpResponseBase) -> HttpResponseBase:
    """Tell the middleware this redirect was confirmed by the user: do not check it."""
    setattr(response, CONFIRMED_ATTR, True)
    return response


def protect_page(response: HttpResponse) -> HttpResponse:
    """Headers for a page the guard shows itself: never cached, never framed, no
    script, its inline style allowed by hash."""
    for name, value in PAGE_HEADERS.items():
        response[name] = value
    styles = [
        "'sha256-{}'".format(
            base64.b64encode(hashlib.sha256(style.encode("utf-8")).digest()).decode("ascii")
        )
        for style in _STYLE_RE.findall(response.content.decode(response.charset or "utf-8"))
    ]
    response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY.format(
        styles=" ".join(dict.fromkeys(styles)) or "'none'"
    )
    return response


def continue_signer() -> signing.TimestampSigner:
    return signing.TimestampSigner(salt=CONTINUE_SALT)


def continue_token(destination: str, visitor: str, rule_id: int | None = None) -> str:
    """A signed, timestamped token naming `destination`: the "continue anyway"
    link carries it so that /continue can never redirect to a URL we did not warn about.

    It is bound to `visitor` (visitors.visitor_id of the warned request): otherwise a
    token copied from one warning page would make /continue a warning-free redirect
    to a listed site for anyone it is sent to."""
    data: dict[str, Any] = {"u": destination, "v": visitor}
    if rule_id is not None:
        data["r"] = rule_id  # the hit log counts "continue anyway" per rule
    return continue_signer().sign_object(data, compress=True)


def report_token(destination: str, rule: SpamRule | None, visitor: str) -> str:
    """What the report form's link carries, signed: the destination and the rule the
    warning named, for the warned visitor only."""
    return signing.TimestampSigner(salt=REPORT_SALT).sign_object(
        {
            "u": destination,
            "r": rule.pk if rule is not None else None,
            "e": rule.expression if rule is not None else "",
            "v": visitor,
        },
        compress=True,
    )


def report_form_url(destination: str, rule: SpamRule | None, visitor: str) -> str:
    """This service's report form for one warning (urlguard.reports.views)."""
    token = report_token(destination, rule, visitor)
    return reverse("urlguard:report") + "?" + urlencode({"token": token})


def report_mistake_url(destination: str, rule: Any = None, visitor: str = "") -> str:
    """The warning page's "Report a mistake": this service's report form (its queue
    is in the admin; the link is for `visitor` only), or the desk REPORT_MISTAKE_URL
    names."""
    if not conf.REPORT_MISTAKE_URL:
        return report_form_url(destination, rule, visitor)
    base = str(conf.REPORT_MISTAKE_URL)
    sep = "&" if "?" in base else "?"
    if base.startswith("mailto:"):
        subject = quote("Wrongly blocked link", safe="")
        body = quote(f"This link was blocked, I think by mistake:\n{destination}\n", safe="")
        return f"{base}{sep}subject={subject}&body={body}"
    return f"{base}{sep}{urlencode({'url': destination})}"


def scheme_and_host(url: str) -> tuple[str, str]:
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
    scheme, host = scheme_and_host(destination)
    rule = verdict.rule if verdict else None
    context: dict[str, Any] = {
        "kind": kind,
        "destination": destination,
        "host": host,
        "scheme": scheme,
        "rule": rule,
        "reason": reason or (verdict.reason if verdict else ""),
        "report_url": report_mistake_url(destination, rule, visitor_id(request)),
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
            + urlencode(
                {
                    "token": continue_token(
                        destination, visitor_id(request), rule.pk if rule is not None else None
                    )
                }
            )
        )
    if kind == "rule" and rule is not None:
        hitlog.warned(
            rule.pk,
            host,
            where=request.path,
            destination=destination,
            expression=rule.expression,
            category=rule.category,
        )
    status = 503 if kind == "unchecked" else 403
    response = protect_page(render(request, "urlguard/warning.html", context, status=status))
    if kind == "unchecked":
        response["Retry-After"] = "60"
        # The guard logged why (rate-limited); django.request would log every one.
        response._has_been_logged = True  # type: ignore[attr-defined]
    if verdict is not None and verdict.degraded:
        response["X-URLGuard"] = "degraded"
    metrics.warned(kind, verdict)
    return response
