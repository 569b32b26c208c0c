"""The Safe Browsing v4 endpoints (paths fixed under the app's urls):
`safebrowsing/v4/threatListUpdates:fetch`, `safebrowsing/v4/fullHashes:find` and
`safebrowsing/v4/threatLists`.

Both wire forms clients use: protobuf (`$ct=application/x-protobuf`, the request
base64url-coded in `$req` on a GET, which Firefox sends with `X-HTTP-Method-Override:
POST`, or a POST body of that type), answered in protobuf; and JSON (a POST body),
answered in JSON. The API key is the `key` query parameter, the protocol's way, and
counts like every other key (missing or wrong: 401 or 403, refused past
API_FAILED_KEY_RATE; per key API_KEY_RATE); a key found live is trusted for
KEY_TRUST_SECONDS by each process, so a revocation reaches these endpoints within it.
The key is never logged: these views log no URL, and the service's gunicorn access
log masks it. A request is at most
MAX_REQUEST_BYTES; a malformed one gets 400 with the reason."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from urlguard.conf import conf
from urlguard.exports import prerender
from urlguard.exports.render import RenderBusy
from urlguard.hotpath import hitlog
from urlguard.hotpath.unavailable import OUTAGE_ERRORS, log_outage
from urlguard.operations import apikeys
from urlguard.runtime import metrics
from urlguard.runtime.ratelimitedlog import RateLimitedLog
from urlguard.runtime.ratelimits import Limited, limited, per_client
from urlguard.safebrowsing import fullhashes, prefixes, prepared, updates, wire
from urlguard.safebrowsing.threatlists import (
    ANY_PLATFORM,
    LISTS,
    URL,
    list_of_threat_type,
    threat_type_of,
)

logger = logging.getLogger(__name__)
# A full disk or lost files fail every request alike: one line a minute says so.
_log_failure = RateLimitedLog(logger, suppressed="more requests failed since the last such line")

__all__ = ["full_hashes", "threat_list_updates", "threat_lists"]

#: The largest request read (Firefox's update request for all its lists is ~200 bytes).
MAX_REQUEST_BYTES = 64 * 1024
#: Lists one update request may ask for.
MAX_LIST_REQUESTS = 32
#: Times one served list may be asked for in one request: each answer may be the whole
#: list, and Firefox reads SOCIAL_ENGINEERING for two of its tables.
MAX_ASKS_PER_LIST = 2
PROTOBUF = "application/x-protobuf"
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    405: "METHOD_NOT_ALLOWED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    503: "UNAVAILABLE",
}
_CLIENT = re.compile(r"[^A-Za-z0-9._-]")
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")


class _Refused(Exception):
    def __init__(self, status: int, message: str, **headers: str) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers


def _error(status: int, message: str, **headers: str) -> HttpResponse:
    """The error as Google's APIs send it, which their client libraries show."""
    body = {"error": {"code": status, "message": message, "status": _STATUS.get(status, "")}}
    response = HttpResponse(json.dumps(body), status=status, content_type="application/json")
    response["Cache-Control"] = "no-store"
    for name, value in headers.items():
        response[name] = value
    return response


#: A key found live is trusted this long by this process without reading the table
#: again (every browser asks for full hashes as it browses): a revocation reaches these
#: endpoints within it.
KEY_TRUST_SECONDS = 10.0
_trusted: dict[str, tuple[float, Any]] = {}
_trusted_lock = threading.Lock()
_clock = time.monotonic


def _authenticate(request: HttpRequest) -> Any:
    given = request.GET.get("key", "")
    digest = apikeys.hash_key(given) if given else ""
    with _trusted_lock:
        trusted = _trusted.get(digest)
    refused = limited(
        request, apikeys.WRONG_KEY_GROUP, per_client, conf.API_FAILED_KEY_RATE, count=False
    )
    if trusted is not None and trusted[0] > _clock() and refused is None:
        key = trusted[1]
    else:
        key = apikeys.authenticate_request(request, f"Bearer {given}" if given else "")
    if isinstance(key, Limited):
        raise _Refused(
            429, key.message(apikeys.WRONG_KEYS), **{"Retry-After": str(key.retry_after)}
        )
    if key is None:
        if not given:
            raise _Refused(
                401, "an API key is required: ?key=<key> (manage.py create_api_key NAME)"
            )
        raise _Refused(403, "unknown or revoked API key")
    if trusted is None or trusted[1] is not key:
        with _trusted_lock:
            if len(_trusted) > 1000:  # bounded: keys are few, but a process lives long
                _trusted.clear()
            _trusted[digest] = (_clock() + KEY_TRUST_SECONDS, key)
    hit = limited(request, "urlguard.safebrowsing.key", lambda g, r: str(key.pk), conf.API_KEY_RATE)
    if hit is not None:
        raise _Refused(
            429,
            hit.message("requests reached for this API key"),
            **{"Retry-After": str(hit.retry_after)},
        )
    return key


def _is_protobuf(request: HttpRequest) -> bool:
    wanted = request.GET.get("$ct", "") or request.content_type or ""
    return wanted.split(";")[0].strip().lower() == PROTOBUF


def _body(request: HttpRequest) -> bytes:
    """The request message's bytes, from `$req` or the body."""
    if "$req" in request.GET:
        text = request.GET["$req"].strip()
        if len(text) > MAX_REQUEST_BYTES * 4 // 3 + 4:
            raise _Refused(413, f"$req is larger than {MAX_REQUEST_BYTES} bytes")
        # A "+" of plain base64 arrives as a space in a query string.
        text = text.replace(" ", "+").replace("+", "-").replace("/", "_").rstrip("=")
        # The decoder skips any other character: "@@@@" would be an empty request.
        if not _BASE64URL.fullmatch(text):
            raise _Refused(400, "$req is not base64url")
        try:
            return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise _Refused(400, "$req is not base64url") from None
    if request.method != "POST":
        raise _Refused(400, "send the request as a POST body or base64url-coded in $req")
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise _Refused(400, "the Content-Length header is not a number") from None
    if declared > MAX_REQUEST_BYTES:
        raise _Refused(413, f"the request body is larger than {MAX_REQUEST_BYTES} bytes")
    body = request.read(MAX_REQUEST_BYTES + 1)
    if len(body) > MAX_REQUEST_BYTES:
        raise _Refused(413, f"the request body is larger than {MAX_REQUEST_BYTES} bytes")
    return body


def _decode(request: HttpRequest, name: str) -> Any:
    data = _body(request)
    try:
        if _is_protobuf(request):
            return wire.parse(name, data)
        return wire.from_json(name, data or b"{}")
    except wire.WireError as exc:
        raise _Refused(400, str(exc)) from None


def _answer(request: HttpRequest, message: Any) -> HttpResponse:
    if _is_protobuf(request):
        response = HttpResponse(message.SerializeToString(), content_type=PROTOBUF)
    else:
        response = HttpResponse(wire.to_json(message), content_type="application/json")
    response["Cache-Control"] = "no-store"
    return response


def _client_label(client: Any) -> str:
    """The client id as a metric label: a few known characters, bounded length."""
    return _CLIENT.sub("", client.client_id or "")[:40] or "unnamed"


def _serve(
    request: HttpRequest, method: str, handle: Callable[[HttpRequest, Any], HttpResponse]
) -> HttpResponse:
    if not conf.SAFEBROWSING_ENABLED:
        return _error(404, "the Safe Browsing API is switched off on this service")
    if request.method not in ("GET", "POST"):
        return _error(405, f"method {request.method} not allowed; use POST", Allow="GET, POST")
    try:
        key = _authenticate(request)
        return handle(request, key)
    except _Refused as refused:
        metrics.safebrowsing_request(method, "", refused.status)
        return _error(refused.status, str(refused), **refused.headers)
    except (DatabaseError, RenderBusy, OSError, prerender.PrerenderFailed) as exc:
        if isinstance(exc, OUTAGE_ERRORS):
            log_outage(request, exc)
        else:
            _log_failure(method, logging.ERROR, "safebrowsing: %s failed", method, exc_info=True)
        metrics.safebrowsing_request(method, "", 503)
        response = _error(
            503, "the lists could not be read; try again shortly", **{"Retry-After": "30"}
        )
        response._has_been_logged = True  # type: ignore[attr-defined]  # above, once
        return response


def _fetch(request: HttpRequest, key: Any) -> HttpResponse:
    message = _decode(request, "FetchThreatListUpdatesRequest")
    if len(message.list_update_requests) > MAX_LIST_REQUESTS:
        raise _Refused(413, f"at most {MAX_LIST_REQUESTS} lists in one request")
    asked = Counter(list_of_threat_type(one.threat_type) for one in message.list_update_requests)
    for name, times in asked.items():
        if name is not None and times > MAX_ASKS_PER_LIST:
            raise _Refused(
                400, f"the {name} list is asked for {times} times; at most {MAX_ASKS_PER_LIST}"
            )
    lists = prepared.current()
    response = wire.message(
        "FetchThreatListUpdatesResponse",
        minimum_wait_duration=wire.message("Duration", seconds=conf.SAFEBROWSING_MIN_WAIT, nanos=0),
    )
    for one in message.list_update_requests:
        if not one.threat_type:
            raise _Refused(400, "each list update request names its threatType")
        response.list_update_responses.append(updates.list_update(one, lists))
    metrics.safebrowsing_request("update", _client_label(message.client), 200)
    return _answer(request, response)


def _find(request: HttpRequest, key: Any) -> HttpResponse:
    message = _decode(request, "FindFullHashesRequest")
    if len(message.threat_info.threat_entries) > fullhashes.MAX_ENTRIES:
        raise _Refused(413, f"at most {fullhashes.MAX_ENTRIES} hashes in one request")
    for entry in message.threat_info.threat_entries:
        if not 4 <= len(entry.hash) <= 32:
            raise _Refused(400, f"a hash prefix is 4 to 32 bytes, not {len(entry.hash)}")
    if prefixes.newest_lookup() is None:
        prepared.current()  # a node that keeps no lists yet reads them, once
    try:
        response, matched = fullhashes.find(message)
    except prefixes.LookupMissing:
        prerender.request()  # its next round writes the head's lookup again
        raise
    client = _client_label(message.client)
    metrics.safebrowsing_request("fullhash", client, 200)
    for rule_id in matched:
        hitlog.full_hash_matched(rule_id, where=f"Safe Browsing key {key.name}")
    return _answer(request, response)


def _lists(request: HttpRequest, key: Any) -> HttpResponse:
    response = wire.message("ListThreatListsResponse")
    for name in LISTS:
        response.threat_lists.append(
            wire.message(
                "ThreatListDescriptor",
                threat_type=threat_type_of(name),
                platform_type=ANY_PLATFORM,
                threat_entry_type=URL,
            )
        )
    metrics.safebrowsing_request("lists", "", 200)
    return _answer(request, response)


@csrf_exempt  # authenticated by its key parameter, not a cookie
def threat_list_updates(request: HttpRequest) -> HttpResponse:
    return _serve(request, "update", _fetch)


@csrf_exempt
def full_hashes(request: HttpRequest) -> HttpResponse:
    return _serve(request, "fullhash", _find)


@csrf_exempt
def threat_lists(request: HttpRequest) -> HttpResponse:
    return _serve(request, "lists", _lists)
