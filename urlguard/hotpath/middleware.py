"""RedirectGuardMiddleware: every redirect this site sends is checked before it
leaves, and a blocked one is replaced by the warning page.

An off-site redirect leaves with its Location rewritten to exactly the absolute
URL that was checked (urlguard.hotpath.canonical.browser_url): scheme, host and path are
spelled so that a browser cannot read them differently from the guard, whatever
the page's own scheme or the quirks of either parser.

It must be first in MIDDLEWARE so that it sees the final response, whatever
the view or the inner middleware did. It only looks at 3xx responses with a
Location header; everything else passes untouched at the cost of one integer
comparison.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.utils.cache import patch_cache_control
from django.utils.encoding import iri_to_uri

from urlguard.conf import conf
from urlguard.hotpath.canonical import browser_target
from urlguard.hotpath.guard import InvalidURL, get_guard
from urlguard.hotpath.hrefs import SCHEME, SPACE_AND_C0, read_href
from urlguard.hotpath.warning import (
    CONFIRMED_ATTR,
    WEB_SCHEMES,
    mark_confirmed,
    protect_page,
    warning_response,
)
from urlguard.runtime.process import PerProcess
from urlguard.runtime.ratelimitedlog import log_limited

logger = logging.getLogger(__name__)

__all__ = ["RedirectGuardMiddleware", "mark_confirmed", "resolve_location"]


def resolve_location(request: HttpRequest, location: str) -> tuple[str, str]:
    """Return (scheme, absolute URL) the way a browser would resolve `location`
    (urlguard.hotpath.hrefs): Django's build_absolute_uri follows RFC 3986, browsers
    follow WHATWG, which differs exactly where attackers aim (`/\\evil.com`,
    `///evil.com` and `https:evil.com` all lead a browser to evil.com)."""
    base_scheme = request.scheme or "http"
    query = request.META.get("QUERY_STRING", "")
    reading = read_href(location, scheme=base_scheme, host="", path=request.path, query=query)
    if reading.scheme not in WEB_SCHEMES:
        return reading.scheme, reading.url
    if reading.leaves:
        # A plain absolute URL comes back as it was written: nothing to escape.
        return reading.scheme, reading.url if reading.url is location else iri_to_uri(reading.url)
    # On this site: only now is the Host header needed (and validated).
    local = reading.url[len(base_scheme) + 3 :]
    return base_scheme, iri_to_uri(f"{base_scheme}://{request.get_host()}{local}")


class RedirectGuardMiddleware:
    """Checks the destination of every redirect response (sync and async)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if self.async_mode:
            return self.__acall__(request)
        response = self.get_response(request)
        if not _needs_check(response):
            return response
        return self.guard_response(request, response)

    async def __acall__(self, request: HttpRequest):
        response = await self.get_response(request)
        if not _needs_check(response):
            return response
        # The guard may query the database: that is sync code.
        return await sync_to_async(self.guard_response, thread_sensitive=True)(request, response)

    def guard_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        """Return `response`, or the warning page in its place. Never raises: a
        failure here would turn every redirect of the site into a 500."""
        location = response["Location"]
        try:
            return self._guard(request, response, location)
        except Exception:
            policy = get_failure_policy()
            log_limited(
                "middleware",
                logging.ERROR,
                "urlguard: checking redirect to %r failed; ON_FILTER_ERROR=%r applies",
                location,
                policy,
                exc_info=True,
            )
            if policy == "open":
                response["X-URLGuard"] = "degraded"
                response["Cache-Control"] = "no-store"
                return response
            # "database" could not answer either (the failure may be the
            # database itself), so the only safe answer left is "closed".
            try:
                return warning_response(request, destination=location, kind="unchecked")
            except Exception:
                logger.exception("urlguard: rendering the warning page failed")
                fallback = HttpResponse(
                    "This link could not be checked right now. Please try again later.",
                    status=503,
                    content_type="text/plain; charset=utf-8",
                    headers={"Retry-After": "60"},
                )
                return protect_page(fallback)

    def _guard(
        self, request: HttpRequest, response: HttpResponseBase, location: str
    ) -> HttpResponseBase:
        policy = _policy()
        scheme, destination = resolve_location(request, location)
        if scheme not in WEB_SCHEMES:
            if scheme in policy.allowed_other_schemes:
                return response
            return warning_response(request, destination=destination, kind="scheme")
        try:
            target, parsed = browser_target(destination)
        except ValueError as exc:
            reason = f"not a usable http(s) URL: {exc}"
            return warning_response(request, destination=destination, kind="invalid", reason=reason)
        send = target
        if _is_internal(request, target):
            if not SCHEME.match(location.lstrip(SPACE_AND_C0)):
                # A reference without a scheme stays on this site in any browser:
                # left as written, it keeps the page's scheme even where a proxy
                # hides it from Django.
                send = location
            if not policy.check_internal:
                _send_to(response, send)
                return response
        try:
            # The reading that made `target` is what the guard checks: the same
            # destination, read once.
            verdict = get_guard().check(target, parsed)
        except InvalidURL as exc:
            return warning_response(request, destination=target, kind="invalid", reason=str(exc))
        if verdict.blocked:
            kind = "unchecked" if verdict.rule is None else "rule"
            return warning_response(request, destination=target, verdict=verdict, kind=kind)
        _send_to(response, send)
        if verdict.degraded:
            response["X-URLGuard"] = "degraded"
            # An answer given without the filter must not stick in a browser cache.
            response["Cache-Control"] = "no-store"
        elif request.method in ("GET", "HEAD"):
            # Short enough that a rule added now reaches returning visitors
            # within REDIRECT_MAX_AGE seconds; private, so no shared cache keeps it.
            if not response.has_header("Cache-Control"):
                response["Cache-Control"] = policy.cache_control
            else:
                # The view's own header survives only where it is stricter
                # (no-cache, no-store, a shorter max-age): "public" or a longer
                # lifetime would keep this redirect past a later block.
                patch_cache_control(response, private=True, max_age=policy.max_age)
        return response


def _send_to(response: HttpResponseBase, target: str) -> None:
    if response["Location"] != target:
        response["Location"] = target


@dataclass(frozen=True, slots=True)
class _Policy:
    check_internal: bool
    allowed_other_schemes: frozenset[str]
    max_age: int
    cache_control: str


def _resolve() -> _Policy:
    max_age = conf.REDIRECT_MAX_AGE
    return _Policy(
        check_internal=conf.CHECK_INTERNAL_REDIRECTS,
        allowed_other_schemes=conf.ALLOWED_OTHER_SCHEMES,
        max_age=max_age,
        cache_control=f"private, max-age={max_age}",
    )


# The middleware's settings, resolved once per process (and again after a URLGUARD
# change): Django builds the middleware once per process, but the test client once
# per client, and override_settings must still apply.
_resolved: PerProcess[_Policy] = PerProcess(_resolve, name="redirect policy")
_policy = _resolved.get


@receiver(setting_changed)
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "URLGUARD":
        _resolved.reset()


def get_failure_policy() -> str:
    try:
        return get_guard().on_filter_error
    except Exception:
        return conf.ON_FILTER_ERROR


def _needs_check(response: HttpResponseBase) -> bool:
    return (
        300 <= response.status_code < 400
        and response.has_header("Location")
        and not getattr(response, CONFIRMED_ATTR, False)
    )


def _is_internal(request: HttpRequest, destination: str) -> bool:
    try:
        netloc = urlsplit(destination).netloc.lower()
        # Cheap first: a destination that is not even the raw Host header is
        # off-site. Only a match pays for get_host(), which validates it against
        # ALLOWED_HOSTS (and may prefer X-Forwarded-Host; a mismatch there just
        # means one more check).
        raw_host = request.META.get("HTTP_HOST")  # absent in HTTP/1.0 (and the test client)
        if raw_host is not None and netloc != raw_host.lower():
            return False
        return netloc == request.get_host().lower()
    except Exception:  # a malformed URL, DisallowedHost...: off-site, i.e. check it
        return False
