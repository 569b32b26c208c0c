"""GET/HEAD /lists/<name>: an export, or an ABP differential patch
(`abp-<key>.patch`). Read with an API key (`Authorization: Bearer <key>`, or HTTP
basic auth with the key as password for consumers that can only put credentials in
a URL) unless EXPORTS_OPEN; missing and wrong keys count against the client address
with the check API's (API_FAILED_KEY_RATE, then 429). Conditional: ETag and
Last-Modified (Pi-hole sends only If-Modified-Since); streamed from the render cached
per position.

Last-Modified and If-Modified-Since have whole seconds, changes do not. An
If-Modified-Since is answered 304 only when the position's time is before the second
it names: Pi-hole sends its cached file's time, and a change at 12:00:00.7 after its
fetch at 12:00:00.2 must reach it, not be answered 304 to "since 12:00:00". A client
that echoes our Last-Modified must still get its 304, so once the position's second is
over (and SETTLE_SECONDS more, longer than a write stays uncommitted after stamping
its changes) Last-Modified names the end of that second: no later change can be stamped
before it. Until then it names the second itself (a 200 to an echo, never a wrong 304).

Each answer says how far its render is behind the change log (X-URLGuard-Lag-*; past
EXPORT_MAX_LAG_SECONDS a Warning 110 and X-URLGuard-Stale too). While the database
cannot be reached the newest complete render kept is served, said to be stale, to
keys this process accepted lately."""

from __future__ import annotations

import base64
import binascii
import logging
import math
import os
import re
import threading
import time
from collections import OrderedDict

from django.http import FileResponse, HttpRequest, HttpResponse, HttpResponseBase
from django.utils.cache import get_conditional_response
from django.utils.http import http_date
from django.views.decorators.http import require_http_methods

from urlguard.conf import conf
from urlguard.exports import prerender, rcs
from urlguard.exports.abp import AbpExport
from urlguard.exports.catalog import get_export
from urlguard.exports.lag import lag_of
from urlguard.exports.projection import Position, current_position
from urlguard.exports.render import (
    RenderBusy,
    Rendered,
    export_dir,
    newest,
    rendered,
    rendered_path,
    write_aside,
)
from urlguard.hotpath.unavailable import OUTAGE_ERRORS
from urlguard.operations import apikeys
from urlguard.runtime.process import PerProcess
from urlguard.runtime.ratelimitedlog import RateLimitedLog
from urlguard.runtime.ratelimits import Limited

__all__ = ["export_view", "freshness"]

logger = logging.getLogger(__name__)

_PATCH = re.compile(r"abp-(\d+-[0-9a-f]{8})\.patch")
CHALLENGE = 'Bearer realm="urlguard lists", Basic realm="urlguard lists"'


def _authorization(request: HttpRequest) -> str:
    """The request's key as a Bearer header, from Bearer or basic auth."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return header
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return ""
    return "Bearer " + decoded.partition(":")[2]


def _refused(status: int, text: str) -> HttpResponse:
    response = HttpResponse(text + "\n", status=status, content_type="text/plain; charset=utf-8")
    response["Cache-Control"] = "no-store"
    if status == 401:
        response["WWW-Authenticate"] = CHALLENGE
    return response


#: How long after its second ends a position is dated by that second's end.
SETTLE_SECONDS = 5.0


def _not_modified_from(position: Position) -> int:
    """The earliest If-Modified-Since (whole seconds) a 304 answers: the second after
    the one the position's time falls in."""
    return math.floor(position.time.timestamp()) + 1


def last_modified(position: Position, now: float | None = None) -> int:
    """The Last-Modified of `position` sent at `now` (see the module's docstring)."""
    end = _not_modified_from(position)
    settled = (time.time() if now is None else now) >= end + SETTLE_SECONDS
    return end if settled else end - 1


#: RFC 7234's (obsoleted by RFC 9111, still logged by clients and proxies).
STALE_WARNING = '110 urlguard "Response is Stale"'


def freshness(served: Rendered, head: Position | None) -> dict[str, str]:
    """The headers saying how far `served` is behind `head`, the change log's position
    (None: the database cannot be reached to say)."""
    if head is None:
        return {
            "X-URLGuard-Stale": "the database cannot be reached: this is the newest "
            "render this node keeps",
            "Warning": STALE_WARNING,
        }
    lag = lag_of(served.position, head)
    headers = {
        "X-URLGuard-Lag-Changes": str(lag.changes),
        "X-URLGuard-Lag-Seconds": str(math.floor(lag.seconds)),
    }
    if lag.stale:
        headers["X-URLGuard-Stale"] = (
            f"{lag.sentence()}: this node's renders of it are failing (its /readyz says more)"
        )
        headers["Warning"] = STALE_WARNING
    return headers


def _cacheable(
    response: HttpResponseBase, etag: str, position: Position, fresh: dict[str, str]
) -> HttpResponseBase:
    for header, value in fresh.items():
        response[header] = value
    response["ETag"] = etag
    response["Last-Modified"] = http_date(last_modified(position))
    scope = "public" if conf.EXPORTS_OPEN else "private"
    response["Cache-Control"] = f"{scope}, max-age={conf.EXPORT_MAX_AGE}"
    response["X-URLGuard-Position"] = str(position.seq)
    response["Vary"] = "Authorization"
    return response


def _file_response(
    request: HttpRequest,
    path: os.PathLike[str],
    content_type: str,
    etag: str,
    position: Position,
    fresh: dict[str, str],
) -> HttpResponseBase:
    conditional = get_conditional_response(
        request, etag=etag, last_modified=_not_modified_from(position)
    )
    if conditional is not None:
        return _cacheable(conditional, etag, position, fresh)
    if request.method == "HEAD":
        response: HttpResponseBase = HttpResponse(content_type=content_type)
        response["Content-Length"] = str(os.stat(path).st_size)
    else:
        response = FileResponse(open(path, "rb"), content_type=content_type)  # noqa: SIM115
    return _cacheable(response, etag, position, fresh)


#: While the database cannot be read, a key this process accepted within this long
#: is taken still (no key can be revoked meanwhile either), at most this many keys.
KEY_MEMORY = 24 * 3600.0
KEYS_REMEMBERED = 1000


class _AcceptedKeys:
    """The hashes of the keys this process accepted lately, and when."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: OrderedDict[str, float] = OrderedDict()

    def remember(self, digest: str) -> None:
        with self.lock:
            self.seen[digest] = time.monotonic()
            self.seen.move_to_end(digest)
            while len(self.seen) > KEYS_REMEMBERED:
                self.seen.popitem(last=False)

    def known(self, digest: str) -> bool:
        with self.lock:
            when = self.seen.get(digest)
        return when is not None and time.monotonic() - when <= KEY_MEMORY


_accepted = PerProcess(_AcceptedKeys, name="urlguard.exports.views accepted keys")
# An outage meets every poll: said once a minute.
_outage_log = RateLimitedLog(logger, suppressed="more polls served so since the last such line")


def _authenticated(request: HttpRequest) -> tuple[HttpResponseBase | None, Exception | None]:
    """(a refusal or None, the database error met instead of looking the key up)."""
    header = _authorization(request)
    digest = apikeys.hash_key(apikeys.bearer(header))
    try:
        key = apikeys.authenticate_request(request, header)
    except OUTAGE_ERRORS as exc:
        if _accepted.get().known(digest):
            return None, exc
        return _unavailable(exc, "no key can be looked up"), exc
    if isinstance(key, Limited):
        response = _refused(429, key.message(apikeys.WRONG_KEYS) + ".")
        response["Retry-After"] = str(key.retry_after)
        return response, None
    if key is None:
        return _refused(401, "An API key is needed: Authorization: Bearer <key>."), None
    _accepted.get().remember(digest)
    return None, None


def _unavailable(exc: Exception, why: str) -> HttpResponse:
    _outage_log("refused", logging.ERROR, "the database cannot be reached (%s): %s", exc, why)
    response = _refused(503, f"The database cannot be reached and {why}; try again shortly.")
    response["Retry-After"] = "30"
    response._has_been_logged = True  # type: ignore[attr-defined]  # above, once a minute
    return response


@require_http_methods(["GET", "HEAD"])
def export_view(request: HttpRequest, name: str) -> HttpResponseBase:
    outage: Exception | None = None
    if not conf.EXPORTS_OPEN:
        refused, outage = _authenticated(request)
        if refused is not None:
            return refused
    patch = _PATCH.fullmatch(name)
    export = get_export(AbpExport.name if patch else name)
    if export is None:
        return _refused(404, f"No list named {name!r}.")
    # Twice at most: a render can be pruned (another process kept newer ones)
    # between finding it and opening it.
    for attempt in range(2):
        try:
            head: Position | None = None
            current: Rendered | None = None
            if outage is None:
                try:
                    head = current_position()
                    current = rendered(export, head, ask_prerender=_ask_prerender)
                except OUTAGE_ERRORS as exc:  # a list rendered on demand needs it too
                    outage, head = exc, None
            if current is None:
                # Complete renders are on disk: the newest, with its own position in
                # its headers and saying it is stale, beats a 503.
                assert outage is not None
                kept = newest(export_dir(export.name))
                if kept is None:
                    return _unavailable(outage, f"this node keeps no render of {export.name}")
                _outage_log(
                    "stale",
                    logging.ERROR,
                    "the database cannot be reached (%s): the exports are served from the "
                    "newest renders kept, stale",
                    outage,
                )
                current = kept
            try:
                fresh = freshness(current, head)
            except OUTAGE_ERRORS:
                fresh = freshness(current, None)
            if patch:
                return _patch_response(request, patch.group(1), current, fresh)
            etag = f'"{current.position.key}"'
            return _file_response(
                request, current.path, export.content_type, etag, current.position, fresh
            )
        except RenderBusy as exc:
            response = _refused(503, f"{exc}; try again shortly.")
            response["Retry-After"] = "30"
            return response
        except FileNotFoundError:
            if attempt:
                raise
    raise AssertionError("unreachable")


def _ask_prerender() -> None:
    prerender.request()


def _patch_response(
    request: HttpRequest, old_key: str, current: Rendered, fresh: dict[str, str]
) -> HttpResponseBase:
    """The RCS patch from the ABP list at `old_key` to the newest; empty while that
    is the newest (the client then keeps its list)."""
    old = rendered_path(AbpExport.name, old_key)
    if not old.exists():
        return _refused(404, "That version is no longer kept: fetch abp.txt whole.")
    new_key = current.position.key
    etag = f'"{old_key}_{new_key}"'
    path = export_dir(AbpExport.name) / f"{old_key}_{new_key}.patch"
    # Nothing newer: the same version, or (served a kept render while another
    # process renders) an older one than the client's.
    newest = old_key == new_key or int(old_key.split("-")[0]) > current.position.seq
    if not newest and not path.exists():
        write_aside(path, rcs.diff(old, current.path))
    if newest:
        response = get_conditional_response(
            request, etag=etag, last_modified=_not_modified_from(current.position)
        ) or HttpResponse(b"", content_type="text/plain; charset=utf-8")
        return _cacheable(response, etag, current.position, fresh)
    return _file_response(request, path, "text/plain; charset=utf-8", etag, current.position, fresh)
