"""Fetching a source's body into a temporary file: http(s) through urllib3 (timeouts,
a bounded number of redirects, a size limit, a deadline for the whole transfer, and a
conditional GET with the validators of the last body applied, so an unchanged feed
costs one 304), or a `file://` path on this server (unchanged = same size and
modification time). Framework-free: the caller passes what the settings say."""

from __future__ import annotations

import email.utils
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

import urllib3

from urlguard.feeds.decoding import FeedError

__all__ = ["FetchResult", "FetchSettings", "TransientFeedError", "fetch"]

_CHUNK = 1 << 16
USER_AGENT = "urlguard-feeds/1 (+https://github.com/; spam-URL guard for redirect services)"


class TransientFeedError(FeedError):
    """A failure worth retrying soon: the network, a timeout, or a 5xx/429 answer."""


@dataclass(frozen=True)
class FetchSettings:
    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    # The whole transfer: a server that trickles bytes under read_timeout still ends.
    deadline: float = 300.0
    max_bytes: int = 512 * 1024 * 1024
    max_redirects: int = 5


@dataclass
class FetchResult:
    """`body` is None when the source answered "not modified"."""

    status: int
    body: BinaryIO | None
    size: int = 0
    etag: str = ""
    last_modified: str = ""

    def close(self) -> None:
        if self.body is not None:
            self.body.close()


def fetch(
    url: str, *, etag: str = "", last_modified: str = "", settings: FetchSettings | None = None
) -> FetchResult:
    """Fetch `url`; raises FeedError (TransientFeedError when a retry may help)."""
    settings = settings or FetchSettings()
    scheme = urlsplit(url).scheme.lower()
    if scheme == "file":
        return _fetch_file(url, last_modified=last_modified, settings=settings)
    if scheme not in ("http", "https"):
        raise FeedError(f"{url!r}: only http, https and file:// URLs can be fetched")
    return _fetch_http(url, etag=etag, last_modified=last_modified, settings=settings)


def _pool() -> urllib3.PoolManager:
    return urllib3.PoolManager(headers={"User-Agent": USER_AGENT})


def _fetch_http(url: str, *, etag: str, last_modified: str, settings: FetchSettings) -> FetchResult:
    headers = {"Accept-Encoding": "gzip, deflate"}
    if etag:
        headers["If-None-Match"] = etag
    if last_modified:
        headers["If-Modified-Since"] = last_modified
    retries = urllib3.Retry(
        total=None,
        connect=0,
        read=0,
        status=0,
        other=0,
        redirect=settings.max_redirects,
        raise_on_redirect=True,
        raise_on_status=False,
    )
    timeout = urllib3.Timeout(connect=settings.connect_timeout, read=settings.read_timeout)
    try:
        response = _pool().request(
            "GET", url, headers=headers, retries=retries, timeout=timeout, preload_content=False
        )
    except urllib3.exceptions.MaxRetryError as exc:
        if (
            isinstance(exc.reason, urllib3.exceptions.ResponseError)
            or "redirect" in str(exc.reason).lower()
        ):
            raise FeedError(f"more than {settings.max_redirects} redirects fetching {url}") from exc
        raise TransientFeedError(f"cannot fetch {url}: {_reason(exc.reason)}") from exc
    except urllib3.exceptions.HTTPError as exc:
        raise TransientFeedError(f"cannot fetch {url}: {_reason(exc)}") from exc
    try:
        if response.status == 304:
            return FetchResult(304, None, etag=etag, last_modified=last_modified)
        if response.status >= 400:
            cls = (
                TransientFeedError
                if response.status >= 500 or response.status == 429
                else FeedError
            )
            raise cls(f"HTTP {response.status} {response.reason or ''} from {url}".rstrip())
        declared = response.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > settings.max_bytes:
            raise FeedError(
                f"{url} is {int(declared):,} bytes; the limit is {settings.max_bytes:,} "
                "(FEED_MAX_BYTES)"
            )
        body, size = _spool(response, url, settings)
        return FetchResult(
            response.status,
            body,
            size,
            etag=response.headers.get("ETag", ""),
            last_modified=response.headers.get("Last-Modified", ""),
        )
    finally:
        response.release_conn()


def _spool(response: urllib3.BaseHTTPResponse, url: str, settings: FetchSettings):  # type: ignore[no-untyped-def]
    started = time.monotonic()
    body = tempfile.TemporaryFile(prefix="urlguard-feed-")  # noqa: SIM115 (returned open)
    size = 0
    try:
        for chunk in response.stream(_CHUNK, decode_content=True):
            size += len(chunk)
            if size > settings.max_bytes:
                raise FeedError(
                    f"{url} sent more than {settings.max_bytes:,} bytes (FEED_MAX_BYTES): refused"
                )
            if time.monotonic() - started > settings.deadline:
                raise TransientFeedError(
                    f"{url} took longer than {settings.deadline:.0f} s to send its body"
                )
            body.write(chunk)
    except urllib3.exceptions.ProtocolError as exc:
        body.close()
        raise TransientFeedError(f"{url}: the body was cut short ({_reason(exc)})") from exc
    except urllib3.exceptions.DecodeError as exc:
        body.close()
        raise FeedError(f"{url}: the compressed body is corrupt ({_reason(exc)})") from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        body.close()
        raise TransientFeedError(f"{url}: reading the body failed ({_reason(exc)})") from exc
    except BaseException:
        body.close()
        raise
    body.seek(0)
    return body, size


def _fetch_file(url: str, *, last_modified: str, settings: FetchSettings) -> FetchResult:
    path = Path(unquote(urlsplit(url).path))
    try:
        stat = path.stat()
    except OSError as exc:
        raise FeedError(f"cannot read {path}: {exc.strerror or exc}") from exc
    stamp = f"{email.utils.formatdate(stat.st_mtime, usegmt=True)}; {stat.st_size}"
    if last_modified and last_modified == stamp:
        return FetchResult(304, None, last_modified=stamp)
    if stat.st_size > settings.max_bytes:
        raise FeedError(
            f"{path} is {stat.st_size:,} bytes; the limit is {settings.max_bytes:,} "
            "(FEED_MAX_BYTES)"
        )
    try:
        source = path.open("rb")
    except OSError as exc:
        raise FeedError(f"cannot read {path}: {exc.strerror or exc}") from exc
    # A copy: the file may be replaced while it is read.
    body = tempfile.TemporaryFile(prefix="urlguard-feed-")  # noqa: SIM115 (returned open)
    with source:
        shutil.copyfileobj(source, body, _CHUNK)
    size = body.tell()
    body.seek(0)
    return FetchResult(200, body, size, last_modified=stamp)


def _reason(exc: object) -> str:
    text = str(exc)
    return text if len(text) < 300 else text[:297] + "..."
