"""The link shim for pages: `guarded_url(url)` (and `{{ url|guarded }}`) turns an
outbound link in a host's templates into this app's signed redirect, which is
checked when it is clicked, so a link listed after the page was rendered is still
caught. The signature names the URL: the redirect is no open redirect for whoever
edits the query string."""

from __future__ import annotations

from urllib.parse import urlencode

from django.core import signing
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.encoding import iri_to_uri
from django.views.decorators.http import require_GET

from urlguard.hotpath.warning import WEB_SCHEMES, protect_page, scheme_and_host

__all__ = ["guarded_redirect", "guarded_url"]

SALT = "urlguard.guarded-link"
#: Longer links are left as they are rather than made longer still.
MAX_URL = 8000


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


def guarded_url(url: str) -> str:
    """The guarded form of `url`: this site's redirect to it, checked at click time.
    Anything but an http(s) URL (a relative link, mailto:, an anchor) is returned
    unchanged: it leaves for nowhere the guard checks."""
    url = str(url).strip()
    if scheme_and_host(url)[0] not in WEB_SCHEMES or len(url) > MAX_URL:
        return url
    return reverse("urlguard:guarded") + "?" + urlencode({"u": url, "s": _signature(url)})


@require_GET
def guarded_redirect(request: HttpRequest) -> HttpResponse:
    """302 to the signed URL; RedirectGuardMiddleware checks it on the way out."""
    url = request.GET.get("u", "")
    signature = request.GET.get("s", "")
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
