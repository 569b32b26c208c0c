"""A database that cannot be reached answers 503 "try again shortly" with
Retry-After, never the 500 page: the home page, the admin and the report form need
it; the redirect and the check API answer from memory first and handle its absence
themselves. Only connection-level failures (OperationalError, InterfaceError: refused,
dropped, timed out, SQLite's "database is locked") are answered this way; any other
database error is a bug and stays a 500 with its traceback in the log.

The log says it once: one ERROR line a minute per process while the outage lasts,
counting the requests it failed meanwhile, and a DEBUG line (no traceback) per
request. The check API, which answers JSON, logs through `log_outage` too."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string

from urlguard.runtime.ratelimitedlog import RateLimitedLog

__all__ = ["OUTAGE_ERRORS", "DatabaseUnavailableMiddleware", "log_outage", "unavailable"]

logger = logging.getLogger(__name__)
_log = RateLimitedLog(logger, suppressed="more requests failed by it since the last such line")

# The database is away (refused, dropped, timed out, locked), not a bug of ours.
OUTAGE_ERRORS = (OperationalError, InterfaceError)


def log_outage(request: HttpRequest, error: Exception) -> None:
    """Log a request answered 503 because the database cannot be reached."""
    _log(
        "database-unavailable",
        logging.ERROR,
        "the database cannot be reached: %s %s answered 503 (%s)",
        request.method,
        request.path,
        error,
    )
    logger.debug(
        "%s %s answered 503: the database cannot be reached (%s)",
        request.method,
        request.path,
        error,
    )


def unavailable(
    request: HttpRequest, error: Exception, template: str, context: dict[str, Any] | None = None
) -> HttpResponse:
    """The 503 page `template` with Retry-After, logged at most once a minute."""
    log_outage(request, error)
    # Rendered without the request: its context processors (the user, messages)
    # need the very database that is away.
    response = HttpResponse(render_to_string(template, context), status=503)
    response["Retry-After"] = "30"
    response["Cache-Control"] = "no-store"
    # Django logs every 5xx response at ERROR: in an outage under load, thousands a
    # second. The line above stands for them.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, OUTAGE_ERRORS):
            return None
        return unavailable(request, exception, "urlguard/unavailable.html")
