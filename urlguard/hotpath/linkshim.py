"""The link shim for pages: `guarded_url(url)` (and `{{ url|guarded }}`) turns an
outbound link in a host's templates into this app's signed redirect, which is
checked when it is clicked, so a link listed after the page was rendered is still
caught. The signature names the URL: the redirect is no open redirect for whoever
edits the query string.

A link is judged as the browser reads it (urlguard.hotpath.hrefs): every spelling
that names another host (`//host/`, `\\\\host/`, `/\\host/`, a leading control
character, `https:host`) goes through the shim, signed in the one form a browser and
the guard read alike (canonical.browser_url); one too long to shim is refused."""

from __future__ import annotations

from urllib.parse import urlencode

from django.core import signing
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.encoding import iri_to_uri
from django.views.decorators.http import require_GET

from urlguard.hotpath.canonical import browser_url
from urlguard.hotpath.hrefs import read_href
from urlguard.hotpath.warning import WEB_SCHEMES, protect_page, scheme_and_host

__all__ = ["guarded_redirect", "guarded_url", "outbound_url"]

SALT = "urlguard.guarded-link"
#: Longer links are refused rather than made longer still.
MAX_URL = 8000
# Where the shim sends a link it cannot carry: its page says why.
REFUSED = "refused"
# A page host no link can name, to tell a link's own host from the page's.
_PAGE_HOST = "\x00page"


def _signer() -> signing.Signer:
    return signing.Signer(salt=SALT)


def _signature(url: str) -> str:
    return _signer().sign(url).rsplit(_signer().sep, 1)[1]


def _signed(url: str, signature: str) -> bool:
    """Checked with SECRET_KEY_FALLBACKS too: links in pages outlive a key rotation."""
    try:
        return _signer().unsign(f"{url}{_signer().sep}{signature}") == url
    except signing.BadSignature:
        return False


def outbound_url(href: str) -> str | None:
    """The absolute URL `href` takes the browser to when it names another host, on a
    page of either scheme; None for a link that stays on the page's host or leaves
    for no web address (an anchor, a path, mailto:, javascript:). A scheme-relative
    link is read as on an https page."""
    href = str(href)
    for scheme in ("https", "http"):
        reading = read_href(href, scheme=scheme, host=_PAGE_HOST)
        if reading.leaves and reading.scheme in WEB_SCHEMES:
            return reading.url
    return None


def guarded_url(url: str) -> str:
    """The guarded form of `url`: this site's redirect to it, checked at click time.
    A link that names no other host (a relative link, mailto:, an anchor) is
    returned unchanged: it leaves for nowhere the guard checks. One the shim cannot
    carry (too long, or no usable address) becomes a link to the shim's refusal."""
    url = str(url)
    outbound = outbound_url(url)
    if outbound is None:
        return url
    shim = reverse("urlguard:guarded")
    try:
        target = browser_url(outbound) if len(outbound) <= MAX_URL else ""
    except ValueError:
        target = ""
    if not target or len(target) > MAX_URL:
        return shim + "?" + urlencode({REFUSED: "1"})
    return shim + "?" + urlencode({"u": target, "s": _signature(target)})


@require_GET
def guarded_redirect(request: HttpRequest) -> HttpResponse:
    """302 to the signed URL; RedirectGuardMiddleware checks it on the way out."""
    url = request.GET.get("u", "")
    signature = request.GET.get("s", "")
    if REFUSED in request.GET:
        problem = (
            f"This link was not followed: it is too long to be checked (over {MAX_URL:,} "
            "characters) or not a usable web address."
        )
        return protect_page(
            render(request, "urlguard/bad_token.html", {"problem": problem}, status=400)
        )
    if (
        not url
        or len(url) > MAX_URL
        or scheme_and_host(url)[0] not in WEB_SCHEMES
        or not _signed(url, signature)
    ):
        problem = (
            "This link is not valid: it was changed or copied incompletely. Go back to "
            "the page you came from and follow the link from there."
        )
        return protect_page(
            render(request, "urlguard/bad_token.html", {"problem": problem}, status=400)
        )
    # A bare 302 (like a short link): the middleware decides, at this click.
    response = HttpResponse(status=302)
    response["Location"] = iri_to_uri(url)
    response["Referrer-Policy"] = "no-referrer"
    return response
