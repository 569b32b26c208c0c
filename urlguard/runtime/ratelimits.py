"""Rate limits counted in Django's cache (django-ratelimit): per process with the
default local-memory cache, per deployment with Redis (CACHE_URL). A cache that
fails lets requests through (logged once a minute): a limit protects the service,
it must not take it down with the cache."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.http import HttpRequest
from django_ratelimit.core import get_usage

from urlguard.runtime.clientaddress import client_network
from urlguard.runtime.ratelimitedlog import RateLimitedLog

__all__ = ["Limited", "limited", "per_client"]

# Under the check API's name, where operators have always found it.
_log = RateLimitedLog(logging.getLogger(__name__))


@dataclass(frozen=True)
class Limited:
    """A limit reached: `rate` (as configured), and seconds until the window ends."""

    rate: str
    retry_after: int

    def message(self, who: str) -> str:
        return f"rate limit of {self.rate} {who}; retry in {self.retry_after} s"


def per_client(group: str, request: HttpRequest) -> str:
    """The client address a limit counts (IPv6: its /64; clientaddress)."""
    return client_network(request)


def limited(
    request: HttpRequest,
    group: str,
    key: Callable[[str, HttpRequest], str],
    rate: str,
    *,
    count: bool = True,
) -> Limited | None:
    """Limited once `key` made more than `rate` requests in the current window, else
    None. count=False only asks whether the limit is reached already, counting nothing."""
    try:
        usage = get_usage(request, group=group, key=key, rate=rate, increment=count)
    except Exception:
        usage = {"limit": 0, "time_left": -1}
    if usage is None:  # RATELIMIT_ENABLE = False
        return None
    if usage["time_left"] == -1:
        _log("cache", logging.WARNING, "rate limits not applied: the cache failed")
        return None
    if not (usage["should_limit"] if count else usage["count"] >= usage["limit"]):
        return None
    return Limited(rate, max(1, int(usage["time_left"])))
