"""The JSON check API for other services (mail link rewriters, link gateways):

- `GET /api/check?url=` (open) answers one URL, rate-limited per client address
  (API_OPEN_RATE);
- `POST /api/check` with `{"urls": [...]}` (an API key: `Authorization: Bearer <key>`)
  answers up to API_MAX_URLS URLs in order through Guard.check_many (one filter probe
  for all, one table query per chunk of hits), rate-limited per key (API_KEY_RATE).
  An unusable entry gets {"url", "error"} in its slot; the batch still answers.
  The URLs of one request add up to at most API_MAX_BATCH_CHARS characters and each
  is at most API_MAX_URL_LENGTH long, which bounds the work a request can ask for;
  wrong keys are counted per client address and refused past API_FAILED_KEY_RATE;
- `POST /api/check-text` with `{"text": "..."}` (an API key, the same limits): every link
  of the text (urlguard.content) with its verdict, for services that are not Django.
  Text over CONTENT_MAX_CHARS is refused (413).

Every refusal is a JSON body {"error": ...} with the status that names it (400, 401,
405, 413, 429 with Retry-After, 503 with Retry-After); the schema is docs/openapi.yaml.
A database that cannot be reached is logged once a minute (urlguard.hotpath.unavailable), not
per request; any other failure with its traceback.
Rate limits count in Django's cache (django-ratelimit): per process with the default
local-memory cache, per deployment with Redis (CACHE_URL).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from urlguard import content
from urlguard.conf import conf
from urlguard.hotpath import hitlog
from urlguard.hotpath.guard import InvalidURL, Verdict, get_guard
from urlguard.hotpath.unavailable import OUTAGE_ERRORS, log_outage
from urlguard.operations import apikeys
from urlguard.runtime.ratelimits import Limited, limited, per_client

logger = logging.getLogger(__name__)

__all__ = ["check", "check_text", "verdict_json"]

ALLOW = "GET, HEAD, POST"


def json_error(message: str, status: int, **headers: str) -> JsonResponse:
    response = JsonResponse({"error": message}, status=status)
    response["Cache-Control"] = "no-store"
    for name, value in headers.items():
        response[name] = value
    return response


def verdict_json(verdict: Verdict) -> dict[str, Any]:
    """One verdict as the API answers it (an unusable URL: {"url", "error"})."""
    if verdict.error:
        return {"url": verdict.url, "error": verdict.error}
    return {
        "url": verdict.url,
        "canonical": verdict.canonical,
        "blocked": verdict.blocked,
        "category": verdict.category or None,
        "rule": verdict.rule.expression if verdict.rule is not None else None,
        "reason": verdict.reason,
        "degraded": verdict.degraded,
    }


def _answer(data: dict[str, Any] | str, degraded: bool) -> HttpResponse:
    """`data`, or its JSON text already written (a batch's), as the answer."""
    if isinstance(data, str):
        response = HttpResponse(data, content_type="application/json")
    else:
        response = JsonResponse(data)
    # The answer changes whenever the list does.
    response["Cache-Control"] = "no-store"
    if degraded:
        response["X-URLGuard"] = "degraded"
    return response


# A string as JsonResponse's encoder writes it (json's C encoder, ensure_ascii).
_json_string = encode_basestring_ascii
_CLEAN_TAIL = ', "blocked": false, "category": null, "rule": null, "reason": "", "degraded": false}'


def _result_json(verdict: Verdict) -> str:
    """json.dumps(verdict_json(verdict)) as JsonResponse writes it. A batch answers
    nearly every URL clean: those are written from a template, in a fraction of the
    time of a dict per URL put through the encoder."""
    if (
        verdict.blocked
        or verdict.degraded
        or verdict.error
        or verdict.reason
        or verdict.category
        or verdict.rule is not None
    ):
        return json.dumps(verdict_json(verdict), cls=DjangoJSONEncoder)
    return (
        '{"url": '
        + _json_string(verdict.url)
        + ', "canonical": '
        + _json_string(verdict.canonical)
        + _CLEAN_TAIL
    )


def _unavailable(request: HttpRequest, what: str, error: Exception) -> JsonResponse:
    # E.g. the database is down while confirming a filter hit: say so in JSON, which
    # is what the caller parses, rather than an HTML 500.
    if isinstance(error, OUTAGE_ERRORS):
        log_outage(request, error)
    else:
        logger.error("urlguard: %s failed", what, exc_info=error)
    response = json_error(
        "the check could not be completed; try again shortly", 503, **{"Retry-After": "30"}
    )
    response._has_been_logged = True  # type: ignore[attr-defined]  # above, once
    return response


def _rate_limited(
    request: HttpRequest,
    group: str,
    key: Callable[[str, HttpRequest], str],
    rate: str,
    who: str,
    *,
    count: bool = True,
) -> JsonResponse | None:
    """429 once `key` made more than `rate` requests in the current window, else None
    (urlguard.runtime.ratelimits.limited)."""
    hit = limited(request, group, key, rate, count=count)
    return None if hit is None else _too_many(hit, who)


def _too_many(hit: Limited, who: str) -> JsonResponse:
    return json_error(hit.message(who), 429, **{"Retry-After": str(hit.retry_after)})


@csrf_exempt  # authenticated by a header, not a cookie: no cross-site request can forge it
def check(request: HttpRequest) -> HttpResponse:
    """`/api/check`: GET one URL, POST a batch."""
    if request.method in ("GET", "HEAD"):
        return _check_one(request)
    if request.method == "POST":
        return _check_batch(request)
    return json_error(
        f"method {request.method} not allowed; use GET /api/check?url=... or POST "
        '{"urls": [...]}',
        405,
        Allow=ALLOW,
    )


def _check_one(request: HttpRequest) -> HttpResponse:
    refused = _rate_limited(
        request,
        "urlguard.api.open",
        per_client,
        conf.API_OPEN_RATE,
        "requests reached for this address",
    )
    if refused is not None:
        return refused
    url = request.GET.get("url", "")
    if not url.strip():
        return json_error(
            "missing query parameter 'url', e.g. /api/check?url=https://example.com/", 400
        )
    too_long = _too_long(url, conf.API_MAX_URL_LENGTH)
    if too_long:
        return json_error(too_long, 400)
    try:
        verdict = get_guard().check(url)
    except InvalidURL as exc:
        return json_error(str(exc), 400)
    except Exception as exc:
        return _unavailable(request, f"/api/check of {url[:200]!r}", exc)
    if verdict.blocked:
        hitlog.api_blocked(verdict, where="API")
    return _answer(verdict_json(verdict), verdict.degraded)


def _json_body(request: HttpRequest, shape: str) -> Any:
    """The request body's JSON, or the refusal (a JsonResponse) to send instead; `shape`
    is what the error says to send, e.g. '{"urls": [...]}'."""
    limit = conf.API_MAX_BODY_BYTES
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return json_error("the Content-Length header is not a number", 400)
    too_big = json_error(f"the request body is larger than {limit} bytes", 413)
    if declared > limit:
        return too_big
    body = request.read(limit + 1)  # bounded even without a Content-Length
    if len(body) > limit:
        return too_big
    try:
        return json.loads(body, parse_constant=_not_json)
    except ValueError as exc:  # also UnicodeDecodeError: not UTF-8, -16 or -32
        return json_error(f"the body is not JSON ({exc}); send {shape}", 400)
    except RecursionError:
        return json_error(f"the body is nested too deeply; send {shape}", 400)


def _body_entry(request: HttpRequest, name: str, example: str, kind: type, what: str) -> Any:
    """The `name` entry of the request body's JSON object, a `kind` ("a `what`"), or
    the refusal (a JsonResponse) to send instead; `example` is its value in the error."""
    shape = f'{{"{name}": {example}}}'
    data = _json_body(request, shape)
    if isinstance(data, JsonResponse):
        return data
    value = data.get(name) if isinstance(data, dict) else None
    if not isinstance(value, kind):
        return json_error(f"the body must be a JSON object {shape} with {what}", 400)
    return value


def _urls_of(request: HttpRequest) -> list[Any] | JsonResponse:
    """The "urls" list of the request body, or the refusal to send instead."""
    urls = _body_entry(request, "urls", "[...]", list, "a list")
    if isinstance(urls, JsonResponse):
        return urls
    most = conf.API_MAX_URLS
    if len(urls) > most:
        return json_error(f"{len(urls)} URLs in one request; at most {most} are allowed", 413)
    # Canonicalizing costs about linear in the characters (more per escape): the
    # body bound alone would let one request ask for ~0.5 s of work.
    chars = sum(len(u) for u in urls if isinstance(u, str))
    most_chars = conf.API_MAX_BATCH_CHARS
    if chars > most_chars:
        return json_error(
            f"the URLs add up to {chars} characters; at most {most_chars} are allowed in one "
            "request (send fewer per request)",
            413,
        )
    return urls


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON value")


def _too_long(url: str, most: int) -> str:
    """The error for a URL longer than `most` (API_MAX_URL_LENGTH), else ""."""
    if len(url) <= most:
        return ""
    return f"not a usable http(s) URL: it is {len(url)} characters long; at most {most} are checked"


def _echo(given: Any) -> Any:
    """An unchecked entry as the answer repeats it: a string, number, true, false or
    null; an array or object is not repeated (it could be nested deeper than JSON encodes)."""
    if given is None or isinstance(given, (str, bool, int)):
        return given
    if isinstance(given, float) and math.isfinite(given):
        return given
    return None


def _api_key(request: HttpRequest) -> Any:
    """The request's API key, within its rate limit; or the refusal (a JsonResponse)."""
    header = request.headers.get("Authorization", "")
    try:
        key = apikeys.authenticate_request(request, header)
    except DatabaseError as exc:
        return _unavailable(request, "looking up an API key", exc)
    if isinstance(key, Limited):
        return _too_many(key, apikeys.WRONG_KEYS)
    if key is None:
        why = "unknown or revoked API key" if apikeys.bearer(header) else "an API key is required"
        return json_error(
            f"{why}: send 'Authorization: Bearer <key>' (manage.py create_api_key NAME)",
            401,
            **{"WWW-Authenticate": 'Bearer realm="urlguard"'},
        )
    refused = _rate_limited(
        request,
        "urlguard.api.key",
        lambda g, r: str(key.pk),
        conf.API_KEY_RATE,
        "requests reached for this API key",
    )
    return key if refused is None else refused


def _check_batch(request: HttpRequest) -> HttpResponse:
    key = _api_key(request)
    if isinstance(key, JsonResponse):
        return key
    urls = _urls_of(request)
    if isinstance(urls, JsonResponse):
        return urls
    # A non-string or too long entry gets its error in its slot like any unusable URL.
    most = conf.API_MAX_URL_LENGTH
    errors = [_too_long(u, most) if isinstance(u, str) else "not a string" for u in urls]
    strings = [
        u if isinstance(u, str) and not error else "" for u, error in zip(urls, errors, strict=True)
    ]
    try:
        verdicts = get_guard().check_many(strings)
    except Exception as exc:
        return _unavailable(request, f"a batch check of {len(urls)} URLs for key {key.name!r}", exc)
    results = []
    for given, error, verdict in zip(urls, errors, verdicts, strict=True):
        if error:
            results.append(json.dumps({"url": _echo(given), "error": error}))
        else:
            results.append(_result_json(verdict))
            if verdict.blocked:
                hitlog.api_blocked(verdict, where=f"API key {key.name}")
    body = '{"results": [' + ", ".join(results) + "]}"
    return _answer(body, any(v.degraded for v in verdicts))


@csrf_exempt  # authenticated by a header, not a cookie: no cross-site request can forge it
def check_text(request: HttpRequest) -> HttpResponse:
    """`POST /api/check-text` with `{"text": "..."}` (an API key): every link of the text
    (urlguard.content.find_links) with its verdict, in the order they first appear."""
    if request.method != "POST":
        return json_error(
            f'method {request.method} not allowed; use POST {{"text": "..."}}', 405, Allow="POST"
        )
    key = _api_key(request)
    if isinstance(key, JsonResponse):
        return key
    text = _body_entry(request, "text", '"..."', str, "a string")
    if isinstance(text, JsonResponse):
        return text
    try:
        verdicts = content.check_text(text, where=f"API key {key.name}")
    except content.TextTooLong as exc:
        return json_error(str(exc), 413)
    except Exception as exc:
        return _unavailable(request, f"a text check for key {key.name!r}", exc)
    body = '{"links": [' + ", ".join(_result_json(v) for v in verdicts) + "]}"
    return _answer(body, any(v.degraded for v in verdicts))
