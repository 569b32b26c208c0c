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
before it. Until then it names the second itself (a 200 to an echo, never a wrong 304)."""

from __future__ import annotations

import base64
import binascii
import math
import os
import re
import time

from django.http import FileResponse, HttpRequest, HttpResponse, HttpResponseBase
from django.utils.cache import get_conditional_response
from django.utils.http import http_date
from django.views.decorators.http import require_http_methods

from urlguard.conf import conf
from urlguard.exports import prerender, rcs
from urlguard.exports.abp import AbpExport
from urlguard.exports.catalog import get_export
from urlguard.exports.projection import Position, current_position
from urlguard.exports.render import (
    RenderBusy,
    Rendered,
    export_dir,
    rendered,
    rendered_path,
    write_aside,
)
from urlguard.operations import apikeys
from urlguard.runtime.ratelimits import Limited

__all__ = ["export_view"]

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


def _cacheable(response: HttpResponseBase, etag: str, position: Position) -> HttpResponseBase:
    response["ETag"] = etag
    response["Last-Modified"] = http_date(last_modified(position))
    scope = "public" if conf.EXPORTS_OPEN else "private"
    response["Cache-Control"] = f"{scope}, max-age={conf.EXPORT_MAX_AGE}"
    response["X-URLGuard-Position"] = str(position.seq)
    response["Vary"] = "Authorization"
    return response


def _file_response(
    request: HttpRequest, path: os.PathLike[str], content_type: str, etag: str, position: Position
) -> HttpResponseBase:
    conditional = get_conditional_response(
        request, etag=etag, last_modified=_not_modified_from(position)
    )
    if conditional is not None:
        return _cacheable(conditional, etag, position)
    if request.method == "HEAD":
        response: HttpResponseBase = HttpResponse(content_type=content_type)
        response["Content-Length"] = str(os.stat(path).st_size)
    else:
        response = FileResponse(open(path, "rb"), content_type=content_type)  # noqa: SIM115
    return _cacheable(response, etag, position)


@require_http_methods(["GET", "HEAD"])
def export_view(request: HttpRequest, name: str) -> HttpResponseBase:
    if not conf.EXPORTS_OPEN:
        key = apikeys.authenticate_request(request, _authorization(request))
        if isinstance(key, Limited):
            response = _refused(429, key.message(apikeys.WRONG_KEYS) + ".")
            response["Retry-After"] = str(key.retry_after)
            return response
        if key is None:
            return _refused(401, "An API key is needed: Authorization: Bearer <key>.")
    patch = _PATCH.fullmatch(name)
    export = get_export(AbpExport.name if patch else name)
    if export is None:
        return _refused(404, f"No list named {name!r}.")
    # Twice at most: a render can be pruned (another process kept newer ones)
    # between finding it and opening it.
    for attempt in range(2):
        try:
            current = rendered(export, current_position(), ask_prerender=_ask_prerender)
            if patch:
                return _patch_response(request, patch.group(1), current)
            etag = f'"{current.position.key}"'
            return _file_response(
                request, current.path, export.content_type, etag, current.position
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


def _patch_response(request: HttpRequest, old_key: str, current: Rendered) -> HttpResponseBase:
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
        return _cacheable(response, etag, current.position)
    return _file_response(request, path, "text/plain; charset=utf-8", etag, current.position)
